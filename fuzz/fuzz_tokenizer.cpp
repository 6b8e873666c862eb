// fuzz/fuzz_tokenizer.cpp — libFuzzer harness: any bytes as a tokenizer.json. Loading must return
// a tokenizer or an error naming a key; whatever loads must encode a fixed text mixing ASCII,
// CJK, emoji, whitespace runs, combining accents and an added token, and — for byte-level BPE
// without a normalizer — decode its ids back to that text exactly (the byte-level promise;
// normalizers, Metaspace and SentencePiece-style decoders change text by design, so there the
// ids must only decode). A crash, sanitizer report, hang, exception or mismatch is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto loaded = strata::tokenizer::parse_bpe_json(json, "fuzz.json");
  if (!loaded.ok()) return 0;
  const auto& tok = **loaded;
  static constexpr std::string_view kText =
      "Hello, world! It's 2024: 日本語 😀  \n\n  spaces\t<|endoftext|> 'S x cafe\u0301 <s>";
  auto ids = tok.encode(kText);
  if (!ids.ok()) return 0;  // a pattern can fail at match time (limits): an error, not a crash
  for (uint32_t id : *ids)
    if (id >= tok.vocab_size()) std::abort();
  auto text = tok.decode(*ids);
  // Only byte-level BPE without a normalizer promises the text back.
  const bool byte_level_plain = json.find("ByteLevel") != std::string_view::npos &&
                                json.find("Metaspace") == std::string_view::npos &&
                                json.find("\"normalizers\"") == std::string_view::npos &&
                                json.find("\"NF") == std::string_view::npos && json.find("Prepend") == std::string_view::npos &&
                                json.find("Replace") == std::string_view::npos &&
                                json.find("Lowercase") == std::string_view::npos &&
                                json.find("Strip") == std::string_view::npos &&
                                json.find("BertNormalizer") == std::string_view::npos &&
                                json.find("Precompiled") == std::string_view::npos &&
                                json.find("Whitespace") == std::string_view::npos;  // drops the spaces
  // Split(Removed) drops text by design; otherwise a byte-level tokenizer gives every byte back.
  if (text.ok() && byte_level_plain && json.find("Removed") == std::string_view::npos && *text != kText) {
    // lstrip/rstrip absorb the spaces around an added token, add_prefix_space adds one: by design.
    if (json.find("strip") == std::string_view::npos && json.find("prefix") == std::string_view::npos) std::abort();
  }
  return 0;
}
