// The one place `format: chat` meets the chat template engine (data/chat_template.h): the
// tokenizer folder's template renders each conversation into trained and untrained pieces.
#include <fmt/format.h>

#include "data/chat_template.h"
#include "data/examples.h"

namespace strata::data {

namespace {

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

}  // namespace

Result<std::unique_ptr<ChatRenderer>> load_chat_renderer(const std::string& tokenizer_folder) {
  STRATA_ASSIGN_OR_RETURN(TokenizerChatConfig config, read_tokenizer_chat_config(tokenizer_folder));
  if (config.chat_template.empty())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}/tokenizer_config.json: key 'chat_template' is missing; format chat renders "
                                  "conversations with it",
                                  tokenizer_folder));
  STRATA_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                          ChatTemplate::parse(config.chat_template, tokenizer_folder + "/tokenizer_config.json"));
  return std::unique_ptr<ChatRenderer>(new TemplateRenderer(std::move(chat_template), std::move(config)));
}

}  // namespace strata::data
