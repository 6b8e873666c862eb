// fuzz/fuzz_chat_template.cpp — libFuzzer harness: any bytes as a chat template (the
// chat_template string of a tokenizer_config.json is untrusted input). ChatTemplate::parse must
// compile it or return an error; a template that compiles must render a small conversation with
// tools, or return an error — never crash, hang or exhaust the stack (data/chat_template.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json kVariables = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {{ x }} é"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "42"}, {"role": "assistant", "content": "Done."}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})");
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  strata::Result<strata::data::ChatTemplate> parsed = strata::data::ChatTemplate::parse(source, "fuzz.jinja");
  if (!parsed.ok()) return 0;
  strata::Result<strata::data::RenderedText> rendered = parsed->render(kVariables);
  if (rendered.ok()) {
    // Spans are byte ranges of the text, in order.
    size_t previous_end = 0;
    for (const auto& [begin, end] : rendered->generation_spans) {
      if (begin > end || end > rendered->text.size() || begin < previous_end) std::abort();
      previous_end = end;
    }
  }
  return 0;
}
