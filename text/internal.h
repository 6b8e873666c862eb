// strata/text/internal.h — what the tokenizer.json readers share (not a public
// interface: text/ only). UTF-8 helpers, the PCRE2 handles as RAII types, and the
// Loader that words every refusal as "FILE: key 'KEY': WHAT" (the one-line error of tokenizer.h).
// Threads: all of it is plain functions and values; a compiled pcre2_code may be matched from
// any number of threads at once (each with its own match data).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::tokenizer::detail {

using json = nlohmann::json;

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct Pcre2MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};
using Pcre2Code = std::unique_ptr<pcre2_code, Pcre2CodeDeleter>;
using Pcre2MatchData = std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter>;
using Pcre2MatchContext = std::unique_ptr<pcre2_match_context, Pcre2MatchContextDeleter>;

// Bounds a pathological pattern (catastrophic backtracking) to an error, not a hang.
constexpr uint32_t kMatchLimit = 10'000'000;

inline void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// Decodes one code point of well-formed UTF-8 at `text[at]`; returns its length in bytes.
inline size_t next_code_point(std::string_view text, size_t at, uint32_t& code_point) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[at + i]); };
  uint8_t lead = byte(0);
  if (lead < 0x80) { code_point = lead; return 1; }
  if (lead < 0xE0) { code_point = ((lead & 0x1Fu) << 6) | (byte(1) & 0x3Fu); return 2; }
  if (lead < 0xF0) {
    code_point = ((lead & 0x0Fu) << 12) | ((byte(1) & 0x3Fu) << 6) | (byte(2) & 0x3Fu);
    return 3;
  }
  code_point = ((lead & 0x07u) << 18) | ((byte(1) & 0x3Fu) << 12) | ((byte(2) & 0x3Fu) << 6) | (byte(3) & 0x3Fu);
  return 4;
}

// The length of the UTF-8 character `text[at]` starts (the text is well-formed).
inline size_t code_point_length(std::string_view text, size_t at) {
  uint32_t ignored = 0;
  return next_code_point(text, at, ignored);
}

// True when `text` is exactly one UTF-8 character.
inline bool is_one_character(std::string_view text) {
  return !text.empty() && code_point_length(text, 0) == text.size();
}

class Loader {
 public:
  explicit Loader(std::string source_name) : source_(std::move(source_name)) {}
  Error error(std::string_view key, const std::string& what) const {
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: key '{}': {}", source_, key, what));
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

inline const char* type_name(const json& value) { return value.type_name(); }

// Optional boolean key: absent or null means `fallback`.
inline Result<bool> optional_bool(const Loader& loader, const json& object, const char* name, const std::string& key,
                                  bool fallback) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return loader.error(key + "." + name, fmt::format("is a {}, not a boolean", type_name(*it)));
  return it->get<bool>();
}

// A required string key (well-formed UTF-8: nlohmann's parser checks that).
inline Result<std::string> required_string(const Loader& loader, const json& object, const char* name,
                                           const std::string& key) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_string()) return loader.error(key + "." + name, "is missing or not a string");
  return it->get<std::string>();
}

// UCP gives \p{L}, \s and case folding their Unicode meaning; a literal has no classes (and
// PCRE2 refuses UCP with it). JIT is a speed-up only: without it the interpreter runs the same.
inline Result<Pcre2Code> compile_regex(const Loader& loader, std::string_view key, std::string_view pattern,
                                       bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return loader.error(key, fmt::format("the regex does not compile at offset {}: {}", error_offset,
                                         reinterpret_cast<const char*>(message)));
  }
  Pcre2Code owned(code);
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return owned;
}

// A `pattern` object of tokenizer.json: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  bool literal = true;
  std::string text;
};
inline Result<Pattern> parse_pattern(const Loader& loader, const json& node, const std::string& key) {
  auto pattern = node.find("pattern");
  if (pattern == node.end() || !pattern->is_object() || pattern->size() != 1)
    return loader.error(key + ".pattern", "must be an object holding one of Regex or String");
  Pattern out;
  out.literal = pattern->contains("String");
  auto text = out.literal ? pattern->find("String") : pattern->find("Regex");
  if (text == pattern->end() || !text->is_string())
    return loader.error(key + ".pattern", "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
  out.text = text->get<std::string>();
  if (out.text.empty()) return loader.error(key + ".pattern", "is empty");
  return out;
}

}  // namespace strata::tokenizer::detail
