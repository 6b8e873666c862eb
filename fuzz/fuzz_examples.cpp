// fuzz/fuzz_examples.cpp — libFuzzer harness: any bytes as a completion JSONL corpus, and as a
// chat one through a renderer that mirrors the messages (data/examples.h). Parsing must return
// examples or one error naming FILE:LINE; whatever parses must hold consistent offsets, masks of
// 0/1 and ids inside the vocabulary, and build into rows (packed and not, truncating) whose
// every target is −1 or a vocabulary id and whose positions restart inside the row. A crash,
// sanitizer report, hang, exception or broken invariant is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/examples.h"
#include "text/tokenizer.h"

namespace {

// A byte-level vocabulary (id = byte) with <s> and </s> and the merge a+b, as tests/data's fixture.
const strata::tokenizer::Tokenizer& tokenizer() {
  static std::unique_ptr<strata::tokenizer::Tokenizer> tok = [] {
    std::string vocab;
    uint32_t next = 256;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
      uint32_t code_point = printable ? byte : next++;
      std::string symbol;
      if (code_point < 0x80) {
        if (code_point == '"' || code_point == '\\') symbol += '\\';
        symbol += static_cast<char>(code_point);
      } else {
        symbol += static_cast<char>(0xC0 | (code_point >> 6));
        symbol += static_cast<char>(0x80 | (code_point & 0x3F));
      }
      vocab += (byte ? "," : "") + ("\"" + symbol + "\":") + std::to_string(byte);
    }
    std::string json = R"({"model":{"type":"BPE","vocab":{)" + vocab +
                       R"(,"<s>":256,"</s>":257,"ab":258},"merges":["a b"]},)"
                       R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
                       R"("added_tokens":[{"id":256,"content":"<s>","special":true},{"id":257,"content":"</s>","special":true}]})";
    auto loaded = strata::tokenizer::parse_bpe_json(json, "fuzz-tokenizer.json");
    if (!loaded.ok()) std::abort();
    return std::move(*loaded);
  }();
  return *tok;
}

class MirrorChat final : public strata::data::ChatRenderer {
 public:
  strata::Result<std::vector<strata::data::Piece>> render(const nlohmann::json& messages) const override {
    std::vector<strata::data::Piece> pieces;
    for (const auto& m : messages)
      pieces.push_back({m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "</s>",
                        m["role"] == "assistant"});
    return pieces;
  }
};

void check(const strata::data::Examples& examples) {
  if (examples.offsets.front() != 0 || examples.offsets.back() != examples.tokens.size() ||
      examples.trained.size() != examples.tokens.size() || examples.source_lines.size() != examples.count())
    std::abort();
  for (uint64_t k = 0; k < examples.count(); ++k)
    if (examples.size(k) < 2) std::abort();
  for (size_t i = 0; i < examples.tokens.size(); ++i)
    if (examples.tokens[i] >= examples.vocab_size || examples.trained[i] > 1) std::abort();
  for (bool packing : {false, true}) {
    strata::data::BatchOptions options;
    options.seq_len = 16;
    options.batch_rows = 2;
    options.packing = packing;
    options.truncate = true;
    auto batches = strata::data::Batches::build(examples, options);
    if (!batches.ok()) continue;  // nothing trained within a row: refused, fine
    std::vector<int32_t> tokens(32), targets(32), positions(32), segments(32);
    for (uint64_t step = 0; step < 3; ++step) {
      batches->fill(step, 0, 2, tokens.data(), targets.data(), positions.data(), segments.data());
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (targets[i] < -1 || targets[i] >= static_cast<int32_t>(examples.vocab_size)) std::abort();
        const bool row_start = i % 16 == 0;
        if (row_start ? positions[i] != 0 || segments[i] != 0
                      : positions[i] != 0 && (positions[i] != positions[i - 1] + 1 || segments[i] != segments[i - 1]))
          std::abort();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  MirrorChat chat;
  for (auto format : {strata::data::ExampleFormat::completion, strata::data::ExampleFormat::chat}) {
    for (bool skip : {false, true}) {
      strata::data::ExampleOptions options;
      options.format = format;
      options.skip_bad_lines = skip;
      auto examples = strata::data::parse_jsonl_examples(text, "fuzz.jsonl", tokenizer(), options, &chat);
      if (!examples.ok()) {
        if (examples.status().error().message.rfind("fuzz.jsonl", 0) != 0) std::abort();  // names the file
        continue;
      }
      check(*examples);
    }
  }
  return 0;
}
