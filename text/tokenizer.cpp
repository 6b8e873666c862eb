// Choosing and loading a tokenizer from a path, tokenizer_config.json, and the UTF-8 check
// every encode starts with.
#include "text/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "text/internal.h"

namespace strata::tokenizer {

Result<std::vector<uint32_t>> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  STRATA_RETURN_IF_ERROR(encode_into(text, ids));
  return ids;
}

std::optional<uint64_t> first_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const size_t size = text.size();
  size_t at = 0;
  while (at < size) {
    uint8_t lead = bytes[at];
    if (lead < 0x80) {
      ++at;
      continue;
    }
    size_t length = 0;
    uint8_t low = 0x80, high = 0xBF;  // the second byte's range (tighter where forms are ill-formed)
    if (lead >= 0xC2 && lead <= 0xDF) length = 2;
    else if (lead == 0xE0) { length = 3; low = 0xA0; }        // no overlong 3-byte forms
    else if (lead >= 0xE1 && lead <= 0xEC) length = 3;
    else if (lead == 0xED) { length = 3; high = 0x9F; }       // no surrogates
    else if (lead >= 0xEE && lead <= 0xEF) length = 3;
    else if (lead == 0xF0) { length = 4; low = 0x90; }        // no overlong 4-byte forms
    else if (lead >= 0xF1 && lead <= 0xF3) length = 4;
    else if (lead == 0xF4) { length = 4; high = 0x8F; }       // nothing above U+10FFFF
    else return at;
    if (at + length > size) return at;
    if (bytes[at + 1] < low || bytes[at + 1] > high) return at;
    for (size_t i = 2; i < length; ++i)
      if ((bytes[at + i] & 0xC0) != 0x80) return at;
    at += length;
  }
  return std::nullopt;
}

namespace {

Result<std::string> read_json_file(const std::string& path, uint64_t max_bytes = kMaxTokenizerJsonBytes) {
  std::error_code error;
  uint64_t size_bytes = std::filesystem::file_size(path, error);
  if (error) return make_errno_error(error.value(), "open tokenizer", path);
  if (size_bytes > max_bytes)
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: {} bytes is larger than this file may be ({})",
                                                               path, size_bytes, max_bytes));
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return make_errno_error(errno, "open tokenizer", path);
  std::string text(size_bytes, '\0');
  size_t read = std::fread(text.data(), 1, text.size(), file);
  int saved = errno;
  std::fclose(file);
  if (read != text.size()) return make_errno_error(saved != 0 ? saved : EIO, "read tokenizer", path);
  return text;
}

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A tokenizer_config.json: chat templates and the like make it larger than a few kilobytes.
constexpr uint64_t kMaxTokenizerConfigBytes = 16ull << 20;

// The tokenizer itself, without tokenizer_config.json.
Result<std::unique_ptr<Tokenizer>> load_kind(const std::string& path) {
  std::error_code error;
  std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error) return make_errno_error(error.value(), "open tokenizer", path);
  if (std::filesystem::is_directory(status)) {
    const std::string json_path = (std::filesystem::path(path) / "tokenizer.json").string();
    const std::string model_path = (std::filesystem::path(path) / "tokenizer.model").string();
    const bool has_json = std::filesystem::exists(json_path, error);
    const bool has_model = std::filesystem::exists(model_path, error);
    if (has_json) {
      Result<std::unique_ptr<Tokenizer>> loaded = load_kind(json_path);
      // A SentencePiece model's tokenizer.json (Llama 2, Mistral: Metaspace, byte_fallback) is
      // refused here, but its tokenizer.model beside it is the same tokenizer: use that.
      if (loaded.ok() || !has_model) return loaded;
    }
    if (has_model) return load_kind(model_path);
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: the folder holds neither tokenizer.json nor tokenizer.model", path));
  }
  if (!std::filesystem::is_regular_file(status))
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: not a regular file", path));
  if (ends_with(path, ".model")) return load_sentencepiece(path);
  if (!ends_with(path, ".json")) {  // sniff: JSON opens with '{', a SentencePiece protobuf never does
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) return make_errno_error(errno, "open tokenizer", path);
    int first = std::fgetc(file);
    std::fclose(file);
    if (first != '{') return load_sentencepiece(path);
  }
  STRATA_ASSIGN_OR_RETURN(std::string text, read_json_file(path));
  return parse_bpe_json(text, path);
}

// A tokenizer whose BOS, EOS and add_bos come from tokenizer_config.json; the rest is `inner`'s.
class ConfiguredTokenizer final : public Tokenizer {
 public:
  ConfiguredTokenizer(std::unique_ptr<Tokenizer> inner, std::optional<uint32_t> bos, std::optional<uint32_t> eos,
                      bool add_bos)
      : inner_(std::move(inner)), bos_(bos), eos_(eos), add_bos_(add_bos) {}
  Status encode_into(std::string_view text, std::vector<uint32_t>& ids, const ProgressFn& progress) const override {
    return inner_->encode_into(text, ids, progress);
  }
  Result<std::string> decode(std::span<const uint32_t> ids) const override { return inner_->decode(ids); }
  uint32_t vocab_size() const override { return inner_->vocab_size(); }
  std::optional<uint32_t> bos_id() const override { return bos_; }
  std::optional<uint32_t> eos_id() const override { return eos_; }
  bool add_bos() const override { return add_bos_; }
  std::optional<uint32_t> token_id(std::string_view token) const override { return inner_->token_id(token); }
  const char* kind() const override { return inner_->kind(); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  std::optional<uint32_t> bos_;
  std::optional<uint32_t> eos_;
  bool add_bos_ = false;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> apply_tokenizer_config(std::unique_ptr<Tokenizer> inner, std::string_view config_text,
                                                          const std::string& source_name) {
  using detail::json;
  detail::Loader loader(source_name);
  json root = json::parse(config_text.begin(), config_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return make_error(ErrorKind::invalid_argument, fmt::format("{}: not valid JSON", source_name));
  if (!root.is_object())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: the top level is a {}, not an object", source_name, detail::type_name(root)));
  // A special token: absent (keep the tokenizer's own), null (none), its text, or an AddedToken
  // object holding the text in "content" — which must be a token of the tokenizer.
  auto special = [&](const char* name, std::optional<uint32_t> fallback) -> Result<std::optional<uint32_t>> {
    auto it = root.find(name);
    if (it == root.end()) return fallback;
    if (it->is_null()) return std::optional<uint32_t>();
    const json* text = &*it;
    std::string key = name;
    if (it->is_object()) {
      text = nullptr;
      key += ".content";
      if (auto content = it->find("content"); content != it->end()) text = &*content;
      if (text == nullptr) return loader.error(key, "is missing");
    }
    if (!text->is_string() || text->get_ref<const std::string&>().empty())
      return loader.error(key, fmt::format("is a {}, not a token's text (a string, or an AddedToken object with content)",
                                           detail::type_name(*text)));
    const std::string& token = text->get_ref<const std::string&>();
    std::optional<uint32_t> id = inner->token_id(token);
    if (!id) return loader.error(key, fmt::format("'{}' is not a token of the tokenizer", token.substr(0, 60)));
    return id;
  };
  STRATA_ASSIGN_OR_RETURN(std::optional<uint32_t> bos, special("bos_token", inner->bos_id()));
  STRATA_ASSIGN_OR_RETURN(std::optional<uint32_t> eos, special("eos_token", inner->eos_id()));
  // Absent: the tokenizer's own choice (a template that starts with BOS, or the guess).
  bool add_bos = inner->add_bos() && bos.has_value();
  if (auto it = root.find("add_bos_token"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean()) return loader.error("add_bos_token", fmt::format("is a {}, not a boolean", detail::type_name(*it)));
    add_bos = it->get<bool>();
    if (add_bos && !bos) return loader.error("add_bos_token", "is true, but there is no bos_token");
  }
  if (auto it = root.find("add_eos_token"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean()) return loader.error("add_eos_token", fmt::format("is a {}, not a boolean", detail::type_name(*it)));
    if (it->get<bool>() && !eos) return loader.error("add_eos_token", "is true, but there is no eos_token");
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<ConfiguredTokenizer>(std::move(inner), bos, eos, add_bos));
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_kind(path));
  std::error_code error;
  const std::filesystem::path folder = std::filesystem::is_directory(path, error)
                                           ? std::filesystem::path(path)
                                           : std::filesystem::path(path).parent_path();
  const std::string config_path = ((folder.empty() ? std::filesystem::path(".") : folder) / "tokenizer_config.json").string();
  if (!std::filesystem::exists(config_path, error)) return tokenizer;
  STRATA_ASSIGN_OR_RETURN(std::string text, read_json_file(config_path, kMaxTokenizerConfigBytes));
  return apply_tokenizer_config(std::move(tokenizer), text, config_path);
}

}  // namespace strata::tokenizer
