// `strata chat render`: conversations (.jsonl, one {"messages": [...]} object a line) through the
// model's chat template (tokenizer_config.json's chat_template, or --template FILE) to one
// {"text": ...} object a line — the exact text transformers' apply_chat_template(tokenize=False)
// gives — with --segments, also the trained and untrained pieces (data/chat_template.h).
//
// Every key of an input line is a template variable (messages, tools, documents, and any extra
// such as enable_thinking); bos_token, eos_token and add_generation_prompt come from the
// tokenizer folder and the flag. A bad line or a template error stops the run with one line
// naming FILE:LINE; the output is written to OUT.tmp and renamed when complete.
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "data/chat_template.h"
#include "apps/cli/commands.h"

namespace strata::cli {

namespace {

struct ChatRenderOptions {
  std::string tokenizer_folder;
  std::string in_path;
  std::string out_path;
  std::string template_path;
  bool add_generation_prompt = false;
  bool segments = false;
};

Result<std::string> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_errno_error(errno, "open", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

Error at_line(const std::string& path, size_t line, const std::string& message) {
  return make_error(ErrorKind::invalid_argument, fmt::format("{}:{}: {}", path, line, message));
}

Result<uint64_t> run_chat_render(const ChatRenderOptions& options) {
  data::TokenizerChatConfig config;
  std::string origin;
  if (!options.tokenizer_folder.empty()) {
    Result<data::TokenizerChatConfig> read = data::read_tokenizer_chat_config(options.tokenizer_folder);
    // With --template, the folder only lends its special tokens: a config without a template is fine.
    if (!read.ok() && (options.template_path.empty() ||
                       read.error().message.find("key 'chat_template' is missing") == std::string::npos)) {
      return read.error();
    }
    if (read.ok()) config = std::move(read.value());
    origin = options.tokenizer_folder + "/tokenizer_config.json (chat_template)";
  }
  if (!options.template_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(config.chat_template, read_file(options.template_path));
    origin = options.template_path;
  }
  if (options.tokenizer_folder.empty() && options.template_path.empty()) {
    return make_error(ErrorKind::invalid_argument, "strata chat render needs --tokenizer DIR or --template FILE");
  }
  STRATA_ASSIGN_OR_RETURN(data::ChatTemplate chat_template, data::ChatTemplate::parse(config.chat_template, origin));

  std::ifstream in(options.in_path, std::ios::binary);
  if (!in) return make_errno_error(errno, "open", options.in_path);
  const std::string tmp_path = options.out_path + ".tmp";
  std::FILE* out = std::fopen(tmp_path.c_str(), "wb");
  if (out == nullptr) return make_errno_error(errno, "open", tmp_path);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_owner(out, &std::fclose);

  std::string line;
  size_t line_number = 0;
  uint64_t conversations = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines carry nothing
    nlohmann::ordered_json record;
    try {
      record = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return at_line(options.in_path, line_number, fmt::format("not valid JSON: {}", e.what()));
    }
    if (!record.is_object() || !record.contains("messages") || !record["messages"].is_array()) {
      return at_line(options.in_path, line_number, "expected an object with a 'messages' list");
    }
    nlohmann::ordered_json result = nlohmann::ordered_json::object();
    if (options.segments) {
      nlohmann::ordered_json extra = record;
      extra.erase("messages");
      Result<std::vector<data::TextSegment>> segments =
          data::chat_segments(chat_template, record["messages"], config, extra);
      if (!segments.ok()) return at_line(options.in_path, line_number, segments.error().message);
      std::string text;
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const data::TextSegment& segment : *segments) {
        text += segment.text;
        list.push_back({{"text", segment.text}, {"trained", segment.trained}});
      }
      result["text"] = text;
      result["segments"] = std::move(list);
    } else {
      nlohmann::ordered_json variables = record;
      variables["bos_token"] = config.bos_token;
      variables["eos_token"] = config.eos_token;
      variables["add_generation_prompt"] = options.add_generation_prompt;
      Result<data::RenderedText> rendered = chat_template.render(variables);
      if (!rendered.ok()) return at_line(options.in_path, line_number, rendered.error().message);
      result["text"] = rendered->text;
    }
    std::string encoded = result.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    if (std::fwrite(encoded.data(), 1, encoded.size(), out) != encoded.size()) {
      return make_errno_error(errno, "write", tmp_path);
    }
    ++conversations;
  }
  if (in.bad()) return make_errno_error(errno, "read", options.in_path);
  if (std::fflush(out) != 0) return make_errno_error(errno, "write", tmp_path);
  out_owner.reset();
  if (std::rename(tmp_path.c_str(), options.out_path.c_str()) != 0) {
    return make_errno_error(errno, "rename", options.out_path);
  }
  return conversations;
}

}  // namespace

void add_chat_command(CLI::App& app, CliState& state) {
  CLI::App* chat = app.add_subcommand("chat", "chat templates: render conversations as the model sees them");
  chat->require_subcommand(1);
  auto options = std::make_shared<ChatRenderOptions>();
  CLI::App* render = chat->add_subcommand(
      "render",
      "Render conversations (.jsonl, one {\"messages\": [...]} object a line) with the model's chat template "
      "(tokenizer_config.json's chat_template, as transformers' apply_chat_template renders it) to one "
      "{\"text\": ...} object a line.");
  render->add_option("--tokenizer", options->tokenizer_folder,
                     "the model folder holding tokenizer_config.json (chat_template, bos_token, eos_token)");
  render->add_option("--in", options->in_path, "the conversations, .jsonl")->required();
  render->add_option("--out", options->out_path, "the rendered texts, .jsonl")->required();
  render->add_option("--template", options->template_path, "a Jinja chat template file to use instead of the folder's");
  render->add_flag("--add-generation-prompt", options->add_generation_prompt,
                   "end each text with the prompt that starts the assistant's reply");
  render->add_flag("--segments", options->segments,
                   "also write the trained (assistant turns) and untrained pieces of each text (docs/chat.md)");
  render->callback([options, &state] {
    if (options->segments && options->add_generation_prompt) {
      state.exit_code = report_error(make_error(ErrorKind::invalid_argument,
                                                "--segments cuts whole conversations; it takes no --add-generation-prompt"));
      return;
    }
    Result<uint64_t> count = run_chat_render(*options);
    if (failed(count, state)) return;
    spdlog::info("rendered {} conversations to {}", *count, options->out_path);
  });
}

}  // namespace strata::cli
