// strata/data/chat_template.cpp — the public face of the template engine: compile and render
// with errors as values, read a tokenizer_config.json's chat keys, and cut a conversation into
// trained and untrained text (chat_template.h states the rules).
#include "data/chat_template.h"

#include <cerrno>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "data/jinja.h"

namespace strata::data {

namespace {

Error template_error(const std::string& origin, const jinja::Failure& failure) {
  if (failure.line > 0) {
    return make_error(ErrorKind::invalid_argument, fmt::format("{}:{}: {}", origin, failure.line, failure.message));
  }
  return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", origin, failure.message));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string origin) {
  try {
    ChatTemplate chat_template;
    chat_template.program_ = jinja::compile(std::string(source), origin);
    return chat_template;
  } catch (const jinja::Failure& failure) {
    return template_error(origin, failure);
  }
}

Result<RenderedText> ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) {
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: the template variables must be an object", origin()));
  }
  nlohmann::ordered_json globals = variables;
  // transformers passes tools and documents always (None when the caller gave none).
  if (!globals.contains("tools")) globals["tools"] = nullptr;
  if (!globals.contains("documents")) globals["documents"] = nullptr;
  try {
    jinja::RenderOutput out = jinja::render(*program_, globals);
    return RenderedText{std::move(out.text), std::move(out.generation_spans)};
  } catch (const jinja::Failure& failure) {
    return template_error(origin(), failure);
  }
}

Result<RenderedText> ChatTemplate::render(const nlohmann::json& variables) const {
  return render(nlohmann::ordered_json::parse(variables.dump()));
}

bool ChatTemplate::has_generation_blocks() const { return program_->has_generation; }
const std::string& ChatTemplate::origin() const { return program_->origin; }

Result<TokenizerChatConfig> read_tokenizer_chat_config(const std::string& folder) {
  const std::string path = folder + "/tokenizer_config.json";
  std::ifstream file(path);
  if (!file) return make_errno_error(errno, "open", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (!config.is_object()) return make_error(ErrorKind::invalid_argument, fmt::format("{}: not a JSON object", path));
  TokenizerChatConfig out;
  auto bad = [&](const std::string& key, const std::string& why) {
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: key '{}': {}", path, key, why));
  };
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'chat_template' is missing (the model has no chat template; pass --template FILE)", path));
  }
  const auto& chat = config["chat_template"];
  if (chat.is_string()) {
    out.chat_template = chat.get<std::string>();
  } else if (chat.is_array()) {
    bool found = false;
    for (size_t i = 0; i < chat.size(); ++i) {
      const auto& entry = chat[i];
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string()) {
        return bad(fmt::format("chat_template[{}]", i), "expected an object {\"name\": string, \"template\": string}");
      }
      if (entry["name"].get<std::string>() == "default") {
        out.chat_template = entry["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) return bad("chat_template", "a list of named templates without one named \"default\"");
  } else {
    return bad("chat_template", "expected a string or a list of {name, template}");
  }
  auto token = [&](const char* key, std::string& target) -> Status {
    if (!config.contains(key) || config[key].is_null()) return Status();
    const auto& value = config[key];
    if (value.is_string()) {
      target = value.get<std::string>();
    } else if (value.is_object() && value.contains("content") && value["content"].is_string()) {
      target = value["content"].get<std::string>();
    } else {
      return bad(key, "expected a string or an AddedToken object {\"content\": string}");
    }
    return Status();
  };
  STRATA_RETURN_IF_ERROR(token("bos_token", out.bos_token));
  STRATA_RETURN_IF_ERROR(token("eos_token", out.eos_token));
  auto flag = [&](const char* key, bool& target) -> Status {
    if (!config.contains(key) || config[key].is_null()) return Status();
    if (!config[key].is_boolean()) return bad(key, "expected true or false");
    target = config[key].get<bool>();
    return Status();
  };
  STRATA_RETURN_IF_ERROR(flag("add_bos_token", out.add_bos_token));
  STRATA_RETURN_IF_ERROR(flag("add_eos_token", out.add_eos_token));
  return out;
}

Result<std::vector<TextSegment>> chat_segments(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                                               const TokenizerChatConfig& config,
                                               const nlohmann::ordered_json& extra_variables) {
  auto invalid = [](std::string message) { return make_error(ErrorKind::invalid_argument, std::move(message)); };
  if (!messages.is_array()) return invalid("'messages' must be a list of {\"role\", \"content\"} objects");
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool", "ipython", "developer", "function"};
  std::vector<size_t> assistant_turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return invalid(fmt::format("messages[{}]: expected an object with a string 'role'", i));
    }
    std::string role = message["role"].get<std::string>();
    if (kRoles.count(role) == 0) {
      return invalid(fmt::format("messages[{}]: unknown role '{}' (known: system, user, assistant, tool, ipython, developer, function)", i, role));
    }
    if (role == "assistant") assistant_turns.push_back(i);
  }
  if (assistant_turns.empty()) return invalid("the conversation has no assistant turn: nothing to train on");
  if (!extra_variables.is_null() && !extra_variables.is_object()) return invalid("extra template variables must be an object");

  auto variables = [&](const nlohmann::ordered_json& subset, bool add_generation_prompt) {
    nlohmann::ordered_json vars = extra_variables.is_object() ? extra_variables : nlohmann::ordered_json::object();
    vars["messages"] = subset;
    vars["bos_token"] = config.bos_token;
    vars["eos_token"] = config.eos_token;
    vars["add_generation_prompt"] = add_generation_prompt;
    return vars;
  };
  auto full = chat_template.render(variables(messages, false));
  if (!full.ok()) return full.error();
  const std::string& text = full->text;

  std::vector<std::pair<size_t, size_t>> trained;
  if (chat_template.has_generation_blocks()) {
    trained = full->generation_spans;
  } else {
    for (size_t i : assistant_turns) {
      nlohmann::ordered_json before = nlohmann::ordered_json::array();
      for (size_t k = 0; k < i; ++k) before.push_back(messages[k]);
      nlohmann::ordered_json through = before;
      through.push_back(messages[i]);
      auto prompt = chat_template.render(variables(before, true));
      if (!prompt.ok()) return prompt.error();
      auto turn = chat_template.render(variables(through, false));
      if (!turn.ok()) return turn.error();
      const std::string& p = prompt->text;
      const std::string& q = turn->text;
      bool stable = text.compare(0, p.size(), p) == 0 && text.compare(0, q.size(), q) == 0 && q.size() >= p.size() &&
                    (trained.empty() || p.size() >= trained.back().second);
      if (!stable) {
        return invalid(fmt::format("{}: template is not prefix-stable at message {}: rendering the conversation up to "
                                   "it is not a prefix of rendering the whole conversation, so its assistant text "
                                   "cannot be located (a template with {{% generation %}} blocks avoids this)",
                                   chat_template.origin(), i));
      }
      trained.emplace_back(p.size(), q.size());
    }
  }
  std::vector<TextSegment> segments;
  size_t pos = 0;
  for (const auto& [begin, end] : trained) {
    if (begin < pos || end < begin || end > text.size()) {
      return invalid(fmt::format("{}: generation spans overlap or run backwards", chat_template.origin()));
    }
    if (begin > pos) segments.push_back(TextSegment{text.substr(pos, begin - pos), false});
    if (end > begin) segments.push_back(TextSegment{text.substr(begin, end - begin), true});
    pos = end;
  }
  if (pos < text.size()) segments.push_back(TextSegment{text.substr(pos), false});
  return segments;
}

Result<std::vector<TextSegment>> chat_segments(const ChatTemplate& chat_template, const nlohmann::json& messages,
                                               const TokenizerChatConfig& config, const nlohmann::json& extra_variables) {
  return chat_segments(chat_template, nlohmann::ordered_json::parse(messages.dump()), config,
                       nlohmann::ordered_json::parse(extra_variables.dump()));
}

}  // namespace strata::data
