// strata/data/chat_template.h — a model's chat template (the Jinja2 `chat_template` of a Hugging
// Face tokenizer_config.json), rendered the way transformers renders it, and the trained text
// segments of a conversation.
//
// Contract:
//  - ChatTemplate::parse compiles a template once; render() may then run on any number of threads
//    at once (rendering reads the compiled tree and owns all of its state).
//  - The environment is transformers': trim_blocks, lstrip_blocks, no autoescape, a single
//    trailing newline of the source dropped (keep_trailing_newline=False), the loopcontrols
//    extension ({% break %}, {% continue %}), the globals raise_exception(msg), strftime_now(fmt),
//    range, namespace, dict, and transformers' `tojson` (json.dumps with ensure_ascii=False, an
//    optional indent, sort_keys false). `{% generation %}...{% endgeneration %}` renders its body
//    and reports the byte range of what it printed.
//  - Values follow Python and jinja2's default Undefined: a missing variable or key prints as "",
//    is falsy and `is defined` is false; an attribute, item or call of an undefined value, and
//    arithmetic on one, is an error (as in jinja2). Strings are UTF-8: length, indexing, slices
//    and iteration count code points, as Python does.
//  - Anything the engine does not implement is refused with ONE error naming the construct and
//    the template line ("ORIGIN:LINE: ..."): a tag such as {% include %} or {% call %} when the
//    template is parsed, a filter, test or method when it is reached (as jinja2 3 defers unknown
//    filters in branches not taken); it never renders a guess. Rendering errors (raise_exception, a
//    type error Python would raise) carry the line too. Every error is an `invalid_argument`
//    Error; nothing throws out of this module.
//  - Object key order: render(ordered_json) keeps each object's key order, as Python dicts do (it
//    matters for `tojson` and `items()`); render(json) sees nlohmann::json's sorted order. Read
//    conversations with nlohmann::ordered_json when tools or tool calls carry objects.
// docs/chat.md lists the constructs, what is refused and the segment rule.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::data {

namespace jinja {
struct Program;  // the compiled template (data/jinja.h)
}

struct RenderedText {
  std::string text;
  // Byte ranges [begin, end) of `text` printed inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class ChatTemplate {
 public:
  // `origin` names the template in errors (a file path, or "DIR/tokenizer_config.json").
  static Result<ChatTemplate> parse(std::string_view source, std::string origin);

  // `variables` is an object: messages, tools, documents, bos_token, eos_token,
  // add_generation_prompt and any extra. tools and documents are None when not given.
  Result<RenderedText> render(const nlohmann::ordered_json& variables) const;
  Result<RenderedText> render(const nlohmann::json& variables) const;

  // True when the template has a {% generation %} block (chat_segments then uses its spans).
  bool has_generation_blocks() const;
  const std::string& origin() const;

 private:
  std::shared_ptr<const jinja::Program> program_;
};

// DIR/tokenizer_config.json: chat_template (a string, or a list of {name, template} of which the
// one named "default" is taken), bos_token / eos_token (a string or an AddedToken object
// {"content": ...}), add_bos_token / add_eos_token. Errors name the file and the key.
struct TokenizerChatConfig {
  std::string chat_template, bos_token, eos_token;
  bool add_bos_token = false, add_eos_token = false;
};
Result<TokenizerChatConfig> read_tokenizer_chat_config(const std::string& folder);

// One piece of a rendered conversation and whether the loss sees it.
struct TextSegment {
  std::string text;
  bool trained = false;
};

// The text segments of one conversation: the assistant turns (each with its end-of-turn text) are
// trained, everything else is not; concatenated they are exactly render(messages).
// With {% generation %} blocks the spans they report are the trained text. Otherwise the prefix
// rule: assistant turn i spans [len(render(messages[:i], add_generation_prompt=true)),
// len(render(messages[:i+1]))), and every prefix render must be a byte prefix of the full render
// (else "template is not prefix-stable at message i"). A conversation without an assistant turn,
// a message that is not an object with a string role, or a role other than system / user /
// assistant / tool / ipython / developer / function is an error; the caller adds file:line.
// `extra_variables` (an object, or null) is passed to every render.
Result<std::vector<TextSegment>> chat_segments(const ChatTemplate& chat_template,
                                               const nlohmann::ordered_json& messages,
                                               const TokenizerChatConfig& config,
                                               const nlohmann::ordered_json& extra_variables = {});
Result<std::vector<TextSegment>> chat_segments(const ChatTemplate& chat_template,
                                               const nlohmann::json& messages,
                                               const TokenizerChatConfig& config,
                                               const nlohmann::json& extra_variables = {});

}  // namespace strata::data
