// Choosing and loading a tokenizer from a path, and the UTF-8 check every encode starts with.
#include "engine/tokenizer/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

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

Result<std::string> read_json_file(const std::string& path) {
  std::error_code error;
  uint64_t size_bytes = std::filesystem::file_size(path, error);
  if (error) return make_errno_error(error.value(), "open tokenizer", path);
  if (size_bytes > kMaxTokenizerJsonBytes)
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: {} bytes is larger than a tokenizer.json may be ({})",
                                                               path, size_bytes, kMaxTokenizerJsonBytes));
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

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  std::error_code error;
  std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error) return make_errno_error(error.value(), "open tokenizer", path);
  if (std::filesystem::is_directory(status)) {
    const std::string json_path = (std::filesystem::path(path) / "tokenizer.json").string();
    const std::string model_path = (std::filesystem::path(path) / "tokenizer.model").string();
    const bool has_json = std::filesystem::exists(json_path, error);
    const bool has_model = std::filesystem::exists(model_path, error);
    if (has_json) {
      Result<std::unique_ptr<Tokenizer>> loaded = load_tokenizer(json_path);
      // A SentencePiece model's tokenizer.json (Llama 2, Mistral: Metaspace, byte_fallback) is
      // refused here, but its tokenizer.model beside it is the same tokenizer: use that.
      if (loaded.ok() || !has_model) return loaded;
    }
    if (has_model) return load_tokenizer(model_path);
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

}  // namespace strata::tokenizer
