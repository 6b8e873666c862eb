// The one place `format: chat` meets the chat template engine (data/chat_template.h). Until that
// engine is in the tree this file still checks the folder (a tokenizer without a chat_template
// is refused by name) and then says what is missing; with it, the folder's template renders
// each conversation into trained and untrained pieces.
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "data/examples.h"

#include "strata_build_config.h"  // STRATA_HAVE_CHAT_TEMPLATE: data/chat_template.h is in the tree
#if STRATA_HAVE_CHAT_TEMPLATE
#include "data/chat_template.h"
#endif

namespace strata::data {

namespace {

#if STRATA_HAVE_CHAT_TEMPLATE
class TemplateRenderer final : public ChatRenderer {
 public:
  TemplateRenderer(ChatTemplate chat_template, TokenizerChatConfig config)
      : template_(std::move(chat_template)), config_(std::move(config)) {}
  Result<std::vector<Piece>> render(const nlohmann::json& messages) const override {
    STRATA_ASSIGN_OR_RETURN(std::vector<TextSegment> segments, chat_segments(template_, messages, config_));
    std::vector<Piece> pieces;
    pieces.reserve(segments.size());
    for (TextSegment& segment : segments) pieces.push_back({std::move(segment.text), segment.trained});
    return pieces;
  }

 private:
  ChatTemplate template_;
  TokenizerChatConfig config_;
};
#else
// Without the engine: the folder's tokenizer_config.json must still name a chat_template, so
// the error a user sees first is about their data, not about this build.
Status check_chat_template(const std::string& folder) {
  const std::string path = folder + "/tokenizer_config.json";
  std::ifstream input(path, std::ios::binary);
  if (!input)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data.tokenizer {}: format chat needs a tokenizer_config.json with a chat_template", folder));
  std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: not a JSON object", path));
  auto chat_template = config.find("chat_template");
  if (chat_template == config.end() || chat_template->is_null())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'chat_template' is missing; format chat renders conversations with it", path));
  return Status();
}
#endif

}  // namespace

Result<std::unique_ptr<ChatRenderer>> load_chat_renderer(const std::string& tokenizer_folder) {
#if STRATA_HAVE_CHAT_TEMPLATE
  STRATA_ASSIGN_OR_RETURN(TokenizerChatConfig config, read_tokenizer_chat_config(tokenizer_folder));
  if (config.chat_template.empty())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}/tokenizer_config.json: key 'chat_template' is missing; format chat renders "
                                  "conversations with it",
                                  tokenizer_folder));
  STRATA_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                          ChatTemplate::parse(config.chat_template, tokenizer_folder + "/tokenizer_config.json"));
  return std::unique_ptr<ChatRenderer>(new TemplateRenderer(std::move(chat_template), std::move(config)));
#else
  STRATA_RETURN_IF_ERROR(check_chat_template(tokenizer_folder));
  return make_error(ErrorKind::unsupported,
                    "data.format chat needs the chat template engine (data/chat_template.h), which this build lacks");
#endif
}

}  // namespace strata::data
