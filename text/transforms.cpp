// Normalizers and SentencePiece-style decoders of tokenizer.json (the contract is in transforms.h).
#include "text/transforms.h"

#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

namespace strata::tokenizer::detail {
namespace {

// The Unicode forms run over pieces of at most about this many bytes, so utf8proc's working
// buffer (4 bytes per code point) stays small however long the text is.
constexpr size_t kFormChunkBytes = 64u << 10;
// No real normalizer or decoder step grows a text this much (NFKD's widest expansion is 18
// characters for one); a file whose steps would — replacements feeding replacements — is
// refused rather than let it grow without bound.
constexpr size_t kMaxGrowth = 64;
constexpr size_t kGrowthSlackBytes = 4096;

Status check_growth(size_t in_bytes, size_t out_bytes) {
  if (out_bytes <= kMaxGrowth * in_bytes + kGrowthSlackBytes) return Status();
  return make_error(ErrorKind::invalid_argument,
                    fmt::format("a step grows {} bytes of text into {} (more than {} times)", in_bytes, out_bytes, kMaxGrowth));
}

struct FreeDeleter {
  void operator()(void* pointer) const { std::free(pointer); }
};

bool all_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Appends the Unicode form of `in` to `out`. The text is cut only between two ASCII characters:
// an ASCII character is a starter that composes with no ASCII neighbour, so nothing reorders or
// composes across such a cut and the pieces' forms joined equal the form of the whole.
Status append_unicode_form(std::string_view in, int options, std::string& out) {
  size_t at = 0;
  while (at < in.size()) {
    size_t end = std::min(in.size(), at + kFormChunkBytes);
    while (end < in.size() && !(static_cast<unsigned char>(in[end - 1]) < 0x80 && static_cast<unsigned char>(in[end]) < 0x80))
      ++end;
    std::string_view chunk = in.substr(at, end - at);
    at = end;
    if (all_ascii(chunk)) {  // every form leaves ASCII as it is
      out.append(chunk);
      continue;
    }
    utf8proc_uint8_t* mapped = nullptr;
    utf8proc_ssize_t length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(chunk.data()),
                                           static_cast<utf8proc_ssize_t>(chunk.size()), &mapped,
                                           static_cast<utf8proc_option_t>(options));
    std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owned(mapped);
    if (length < 0)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("Unicode normalization failed: {}", utf8proc_errmsg(length)));
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  }
  return Status();
}

// Unicode's White_Space property (Rust's char::is_whitespace, what Hugging Face's Strip and
// BertNormalizer test); utf8proc has categories, not this property.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_nonspacing_mark(uint32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_MN;
}

// Hugging Face's Lowercase: each character's full lowercase mapping on its own (Rust's
// char::to_lowercase, so no final-sigma rule). The only unconditional full mapping longer than
// the simple one is U+0130 (İ → i + combining dot above).
void append_lowercase(std::string_view in, std::string& out) {
  for (size_t at = 0; at < in.size();) {
    uint32_t c = 0;
    at += next_code_point(in, at, c);
    if (c == 0x130) {
      out.append("i\xCC\x87");
    } else {
      append_utf8(out, c < 0x80 ? static_cast<uint32_t>(std::tolower(static_cast<int>(c)))
                                : static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
}

void append_without_nonspacing_marks(std::string_view in, std::string& out) {
  for (size_t at = 0; at < in.size();) {
    uint32_t c = 0;
    size_t length = next_code_point(in, at, c);
    if (!is_nonspacing_mark(c)) out.append(in, at, length);
    at += length;
  }
}

// BertNormalizer's CJK ideograph blocks (the ones BERT's own tokenizer spaces out).
bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertNormalizer's clean_text and handle_chinese_chars in one pass: drops NUL, U+FFFD and the
// "other" categories (Cc, Cf, Co; Cs cannot occur in UTF-8) except tab, LF and CR; turns white
// space into a plain space; puts spaces around CJK ideographs.
void append_bert_cleaned(std::string_view in, bool clean_text, bool chinese, std::string& out) {
  for (size_t at = 0; at < in.size();) {
    uint32_t c = 0;
    size_t length = next_code_point(in, at, c);
    std::string_view character = in.substr(at, length);
    at += length;
    if (clean_text) {
      bool kept_control = c == '\t' || c == '\n' || c == '\r';
      utf8proc_category_t category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      bool control = !kept_control && (category == UTF8PROC_CATEGORY_CC || category == UTF8PROC_CATEGORY_CF ||
                                       category == UTF8PROC_CATEGORY_CO || category == UTF8PROC_CATEGORY_CS);
      if (c == 0 || c == 0xFFFD || control) continue;
      if (kept_control || is_white_space(c)) {
        out.push_back(' ');
        continue;
      }
    }
    if (chinese && is_chinese_char(c)) {
      out.push_back(' ');
      out.append(character);
      out.push_back(' ');
    } else {
      out.append(character);
    }
  }
}

// Standard base64 (RFC 4648, what Hugging Face writes the charsmap in); padding optional.
std::optional<std::string> decode_base64(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 == 0)
    for (int i = 0; i < 2 && !text.empty() && text.back() == '='; ++i) text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t bits = 0;
  int held = 0;
  for (char c : text) {
    int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xFF));
    }
  }
  return out;
}

// Darts double-array units (the layout SentencePiece and Hugging Face's spm_precompiled read).
bool unit_has_leaf(uint32_t unit) { return ((unit >> 8) & 1u) != 0; }
uint32_t unit_value(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t unit_label(uint32_t unit) { return unit & ((1u << 31) | 0xFFu); }
uint32_t unit_offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

}  // namespace

// ---- Replacer ----------------------------------------------------------------------------------

Result<Replacer> Replacer::parse(const Loader& loader, const json& node, const std::string& key) {
  STRATA_ASSIGN_OR_RETURN(Pattern pattern, parse_pattern(loader, node, key));
  Replacer replacer;
  auto content = node.find("content");
  if (content == node.end() || !content->is_string()) return loader.error(key + ".content", "is missing or not a string");
  replacer.content_ = content->get<std::string>();
  if (pattern.literal) {
    replacer.literal_ = pattern.text;
    return replacer;
  }
  STRATA_ASSIGN_OR_RETURN(replacer.regex_, compile_regex(loader, key + ".pattern", pattern.text, false));
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (context == nullptr) return make_error(ErrorKind::no_space, "cannot allocate a regex match context");
  replacer.context_.reset(context);
  pcre2_set_match_limit(context, kMatchLimit);
  return replacer;
}

Status Replacer::apply(std::string_view in, std::string& out) const {
  out.clear();
  out.reserve(in.size());
  if (!regex_) {
    size_t at = 0;
    for (size_t found = in.find(literal_); found != std::string_view::npos; found = in.find(literal_, at)) {
      out.append(in, at, found - at);
      out.append(content_);
      at = found + literal_.size();
      STRATA_RETURN_IF_ERROR(check_growth(in.size(), out.size()));
    }
    out.append(in, at);
    return Status();
  }
  // PCRE2 runs without its UTF check (it would rescan the subject on every call): check once.
  // Only a decoder's ByteFallback output can be other than UTF-8 here.
  if (std::optional<uint64_t> bad = first_invalid_utf8(in))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("a Replace regex cannot run on bytes that are not UTF-8 (byte {})", *bad));
  Pcre2MatchData data(pcre2_match_data_create_from_pattern(regex_.get(), nullptr));
  if (!data) return make_error(ErrorKind::no_space, "cannot allocate regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(in.data());
  size_t copied = 0;
  size_t at = 0;
  while (at < in.size()) {
    int rc = pcre2_match(regex_.get(), subject, in.size(), at, PCRE2_NO_UTF_CHECK, data.get(), context_.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return make_error(ErrorKind::invalid_argument, fmt::format("a Replace regex failed on the input: {}",
                                                                 reinterpret_cast<const char*>(message)));
    }
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    if (ovector[1] == ovector[0]) {  // an empty match replaces nothing: step over one character
      at = ovector[0] + code_point_length(in, ovector[0]);
      continue;
    }
    out.append(in, copied, ovector[0] - copied);
    out.append(content_);
    copied = at = ovector[1];
    STRATA_RETURN_IF_ERROR(check_growth(in.size(), out.size()));
  }
  out.append(in, copied);
  return Status();
}

// ---- CharsMap ----------------------------------------------------------------------------------

Result<CharsMap> CharsMap::parse(const Loader& loader, std::string_view blob, const std::string& key) {
  CharsMap map;
  if (blob.empty()) return map;
  if (blob.size() < 4) return loader.error(key, fmt::format("is {} bytes, shorter than its 4-byte trie size", blob.size()));
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[static_cast<size_t>(i)]);
  if (trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4 || trie_bytes > kMaxTrieBytes)
    return loader.error(key, fmt::format("says its trie is {} bytes, but that is not a whole number of 4-byte units "
                                         "within the {} bytes that follow (at most {})", trie_bytes, blob.size() - 4,
                                         kMaxTrieBytes));
  map.units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < map.units_.size(); ++i) {
    const auto* p = reinterpret_cast<const uint8_t*>(blob.data()) + 4 + 4 * i;
    map.units_[i] = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  }
  map.pool_.assign(blob.substr(4 + trie_bytes));
  if (map.units_.empty()) return map;
  // Walk the trie depth first, every node once. Darts-clone shares nodes between keys (the array
  // is built from a DAWG), so a node reached again is fine once it is finished; one reached again
  // while it is still on the path is a cycle.
  const size_t n = map.units_.size();
  enum : uint8_t { kUnseen, kOnPath, kDone };
  std::vector<uint8_t> state(n, kUnseen);
  struct Frame {
    uint32_t base;      // where this node's children are: base ^ label
    uint32_t position;  // the node's own unit
    uint32_t label;     // the next label to try
  };
  std::vector<Frame> path{{unit_offset(map.units_[0]), 0, 0}};
  state[0] = kOnPath;
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.label == 256) {
      state[frame.position] = kDone;
      path.pop_back();
      continue;
    }
    const uint32_t label = frame.label++;
    const uint32_t child = frame.base ^ label;
    if (child >= n || unit_label(map.units_[child]) != label || state[child] == kDone) continue;
    if (state[child] == kOnPath) return loader.error(key, fmt::format("trie unit {} is reached again below itself (a cycle)", child));
    if (path.size() > kMaxKeyBytes) return loader.error(key, fmt::format("has a key longer than {} bytes", kMaxKeyBytes));
    const uint32_t next = child ^ unit_offset(map.units_[child]);
    if (unit_has_leaf(map.units_[child])) {
      if (next >= n) return loader.error(key, fmt::format("trie unit {} points past the {}-unit trie", child, n));
      uint32_t value = unit_value(map.units_[next]);
      size_t end = value < map.pool_.size() ? map.pool_.find('\0', value) : std::string::npos;
      if (end == std::string::npos)
        return loader.error(key, fmt::format("a rule's replacement at byte {} is outside the {}-byte string pool "
                                             "or lacks its NUL", value, map.pool_.size()));
      if (first_invalid_utf8(std::string_view(map.pool_).substr(value, end - value)))
        return loader.error(key, fmt::format("a rule's replacement at byte {} is not UTF-8", value));
    }
    state[child] = kOnPath;
    path.push_back({next, child, 0});
  }
  return map;
}

size_t CharsMap::longest_match(std::string_view text, std::string_view& replacement) const {
  if (units_.empty()) return 0;
  const size_t n = units_.size();
  size_t longest = 0;
  uint32_t position = unit_offset(units_[0]);
  for (size_t i = 0; i < text.size() && i < kMaxKeyBytes; ++i) {
    uint32_t byte = static_cast<uint8_t>(text[i]);
    position ^= byte;
    if (position >= n) break;
    uint32_t unit = units_[position];
    if (unit_label(unit) != byte) break;
    position ^= unit_offset(unit);
    if (!unit_has_leaf(unit)) continue;
    // A key ending inside a character is not a rule for whole characters; SentencePiece's maps
    // have none, and taking one would cut the text's UTF-8.
    if (i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) continue;
    // parse() checked these for every reachable leaf; kept so no lookup can read outside.
    if (position >= n) break;
    uint32_t value = unit_value(units_[position]);
    size_t end = value < pool_.size() ? pool_.find('\0', value) : std::string::npos;
    if (end == std::string::npos) break;
    longest = i + 1;
    replacement = std::string_view(pool_).substr(value, end - value);
  }
  return longest;
}

void CharsMap::apply(std::string_view in, std::string& out) const {
  out.reserve(out.size() + in.size());
  for (size_t at = 0; at < in.size();) {
    std::string_view replacement;
    size_t length = longest_match(in.substr(at), replacement);
    if (length == 0) {
      length = code_point_length(in, at);
      out.append(in, at, length);
    } else {
      out.append(replacement);
    }
    at += length;
  }
}

// ---- Normalizer --------------------------------------------------------------------------------

Result<Normalizer> Normalizer::parse(const Loader& loader, const json& node, const std::string& key) {
  Normalizer normalizer;
  STRATA_RETURN_IF_ERROR(normalizer.parse_step(loader, node, key));
  return normalizer;
}

Status Normalizer::parse_step(const Loader& loader, const json& node, const std::string& key) {
  if (!node.is_object()) return loader.error(key, fmt::format("is a {}, not an object", type_name(node)));
  STRATA_ASSIGN_OR_RETURN(std::string type, required_string(loader, node, "type", key));
  Step step;
  if (type == "Sequence") {
    auto inner = node.find("normalizers");
    if (inner == node.end() || !inner->is_array()) return loader.error(key + ".normalizers", "is missing or not an array");
    for (size_t i = 0; i < inner->size(); ++i)
      STRATA_RETURN_IF_ERROR(parse_step(loader, (*inner)[i], fmt::format("{}.normalizers[{}]", key, i)));
    return Status();
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Kind::unicode_form;
    step.utf8proc_options = UTF8PROC_STABLE | (type[type.size() - 1] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                            (type.size() == 4 ? UTF8PROC_COMPAT : 0);
  } else if (type == "Prepend") {
    step.kind = Kind::prepend;
    STRATA_ASSIGN_OR_RETURN(step.prepend, required_string(loader, node, "prepend", key));
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    STRATA_ASSIGN_OR_RETURN(Replacer replacer, Replacer::parse(loader, node, key));
    step.replacer = std::make_unique<Replacer>(std::move(replacer));
  } else if (type == "Lowercase") {
    step.kind = Kind::lowercase;
  } else if (type == "StripAccents") {
    step.kind = Kind::strip_accents;
  } else if (type == "Strip") {
    step.kind = Kind::strip;
    for (auto [name, target] : {std::pair{"strip_left", &step.left}, std::pair{"strip_right", &step.right}}) {
      auto value = node.find(name);
      if (value == node.end() || !value->is_boolean()) return loader.error(key + "." + name, "is missing or not a boolean");
      *target = value->get<bool>();
    }
  } else if (type == "BertNormalizer") {  // Hugging Face's defaults: all on, strip_accents follows lowercase
    step.kind = Kind::bert;
    STRATA_ASSIGN_OR_RETURN(step.left, optional_bool(loader, node, "clean_text", key, true));
    STRATA_ASSIGN_OR_RETURN(step.right, optional_bool(loader, node, "handle_chinese_chars", key, true));
    STRATA_ASSIGN_OR_RETURN(step.bert_lowercase, optional_bool(loader, node, "lowercase", key, true));
    STRATA_ASSIGN_OR_RETURN(step.bert_strip_accents, optional_bool(loader, node, "strip_accents", key, step.bert_lowercase));
  } else if (type == "Precompiled") {
    step.kind = Kind::precompiled;
    STRATA_ASSIGN_OR_RETURN(std::string encoded, required_string(loader, node, "precompiled_charsmap", key));
    std::optional<std::string> blob = decode_base64(encoded);
    if (!blob) return loader.error(key + ".precompiled_charsmap", "is not base64");
    STRATA_ASSIGN_OR_RETURN(CharsMap map, CharsMap::parse(loader, *blob, key + ".precompiled_charsmap"));
    step.charsmap = std::make_unique<CharsMap>(std::move(map));
  } else {
    return loader.error(key + ".type", fmt::format("'{}' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, "
                                                   "Lowercase, Strip, StripAccents, BertNormalizer, Precompiled, or a "
                                                   "Sequence of them)", type.substr(0, 40)));
  }
  steps_.push_back(std::move(step));
  return Status();
}

Status Normalizer::apply(std::string_view in, std::string& out) const {
  out.assign(in);
  std::string next;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::unicode_form:
        next.clear();
        STRATA_RETURN_IF_ERROR(append_unicode_form(out, step.utf8proc_options, next));
        out.swap(next);
        break;
      case Kind::prepend:  // Hugging Face prepends to a non-empty text only
        if (!out.empty()) out.insert(0, step.prepend);
        break;
      case Kind::replace:
        STRATA_RETURN_IF_ERROR(step.replacer->apply(out, next));
        out.swap(next);
        break;
      case Kind::lowercase:
        next.clear();
        append_lowercase(out, next);
        out.swap(next);
        break;
      case Kind::strip_accents:
        next.clear();
        append_without_nonspacing_marks(out, next);
        out.swap(next);
        break;
      case Kind::strip: {
        size_t begin = 0;
        size_t end = out.size();
        uint32_t c = 0;
        while (step.left && begin < end) {
          size_t length = next_code_point(out, begin, c);
          if (!is_white_space(c)) break;
          begin += length;
        }
        while (step.right && end > begin) {
          size_t last = end - 1;
          while (last > begin && (static_cast<uint8_t>(out[last]) & 0xC0) == 0x80) --last;
          next_code_point(out, last, c);
          if (!is_white_space(c)) break;
          end = last;
        }
        out = out.substr(begin, end - begin);
        break;
      }
      case Kind::bert:  // Hugging Face's order: clean, CJK spacing, accents (after NFD), lowercase
        next.clear();
        append_bert_cleaned(out, step.left, step.right, next);
        out.swap(next);
        if (step.bert_strip_accents) {
          next.clear();
          STRATA_RETURN_IF_ERROR(append_unicode_form(out, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, next));
          out.clear();
          append_without_nonspacing_marks(next, out);
        }
        if (step.bert_lowercase) {
          next.clear();
          append_lowercase(out, next);
          out.swap(next);
        }
        break;
      case Kind::precompiled:
        next.clear();
        step.charsmap->apply(out, next);
        out.swap(next);
        break;
    }
    STRATA_RETURN_IF_ERROR(check_growth(in.size(), out.size()));  // the steps together, too
  }
  return Status();
}

// ---- Decoder -----------------------------------------------------------------------------------

Result<Decoder> Decoder::parse(const Loader& loader, const json& node, const std::string& key) {
  Decoder decoder;
  if (node.is_null()) {
    decoder.join_with_spaces_ = true;
    return decoder;
  }
  STRATA_RETURN_IF_ERROR(decoder.parse_step(loader, node, key));
  return decoder;
}

Status Decoder::parse_step(const Loader& loader, const json& node, const std::string& key) {
  if (!node.is_object()) return loader.error(key, fmt::format("is a {}, not an object", type_name(node)));
  STRATA_ASSIGN_OR_RETURN(std::string type, required_string(loader, node, "type", key));
  Step step;
  if (type == "Sequence") {
    auto inner = node.find("decoders");
    if (inner == node.end() || !inner->is_array()) return loader.error(key + ".decoders", "is missing or not an array");
    for (size_t i = 0; i < inner->size(); ++i)
      STRATA_RETURN_IF_ERROR(parse_step(loader, (*inner)[i], fmt::format("{}.decoders[{}]", key, i)));
    return Status();
  }
  if (type == "Replace") {
    step.kind = Kind::replace;
    STRATA_ASSIGN_OR_RETURN(Replacer replacer, Replacer::parse(loader, node, key));
    step.replacer = std::make_unique<Replacer>(std::move(replacer));
  } else if (type == "ByteFallback") {
    step.kind = Kind::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = Kind::fuse;
  } else if (type == "Strip") {
    step.kind = Kind::strip;
    STRATA_ASSIGN_OR_RETURN(step.character, required_string(loader, node, "content", key));
    if (!is_one_character(step.character)) return loader.error(key + ".content", "must be one character");
    for (auto [name, target] : {std::pair{"start", &step.strip_start}, std::pair{"stop", &step.strip_stop}}) {
      auto value = node.find(name);
      if (value == node.end()) continue;
      if (!value->is_number_unsigned() || value->get<uint64_t>() > 1'000'000)
        return loader.error(key + "." + name, fmt::format("{} is not a count of characters", value->dump()));
      *target = static_cast<uint32_t>(value->get<uint64_t>());
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    step.character = "\u2581";
    if (node.contains("replacement")) {
      STRATA_ASSIGN_OR_RETURN(step.character, required_string(loader, node, "replacement", key));
      if (!is_one_character(step.character)) return loader.error(key + ".replacement", "must be one character");
    }
    auto scheme = node.find("prepend_scheme");
    if (scheme != node.end()) {
      if (!scheme->is_string() || (*scheme != "always" && *scheme != "first" && *scheme != "never"))
        return loader.error(key + ".prepend_scheme", fmt::format("{} is not always, first or never", scheme->dump()));
      step.drop_first = *scheme != "never";
    } else {  // the older form says add_prefix_space
      STRATA_ASSIGN_OR_RETURN(step.drop_first, optional_bool(loader, node, "add_prefix_space", key, true));
    }
  } else {
    return loader.error(key + ".type", fmt::format("'{}' is not supported here (Replace, ByteFallback, Fuse, Strip, "
                                                   "Metaspace, or a Sequence of them)", type.substr(0, 40)));
  }
  steps_.push_back(std::move(step));
  return Status();
}

Result<std::string> Decoder::decode(std::vector<std::string> tokens) const {
  std::string scratch;
  auto total_bytes = [&] {
    size_t total = 0;
    for (const std::string& token : tokens) total += token.size();
    return total;
  };
  const size_t in_bytes = total_bytes();
  for (const Step& step : steps_) {
    if (step.kind == Kind::replace) STRATA_RETURN_IF_ERROR(check_growth(in_bytes, total_bytes()));
    switch (step.kind) {
      case Kind::replace:
        for (std::string& token : tokens) {
          STRATA_RETURN_IF_ERROR(step.replacer->apply(token, scratch));
          token.swap(scratch);
        }
        break;
      case Kind::byte_fallback: {  // runs of <0xNN> tokens become their bytes
        std::vector<std::string> out;
        out.reserve(tokens.size());
        std::string bytes;
        bool in_run = false;
        for (std::string& token : tokens) {
          auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
          if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && hex(token[3]) && hex(token[4])) {
            bytes.push_back(static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
            in_run = true;
            continue;
          }
          if (in_run) {
            out.push_back(std::move(bytes));
            bytes.clear();
            in_run = false;
          }
          out.push_back(std::move(token));
        }
        if (in_run) out.push_back(std::move(bytes));
        tokens.swap(out);
        break;
      }
      case Kind::fuse: {
        std::string joined;
        for (const std::string& token : tokens) joined += token;
        tokens.assign(1, std::move(joined));
        break;
      }
      case Kind::strip:
        for (std::string& token : tokens) {
          const std::string& c = step.character;
          size_t begin = 0;
          for (uint32_t i = 0; i < step.strip_start && token.compare(begin, c.size(), c) == 0; ++i) begin += c.size();
          size_t end = token.size();
          for (uint32_t i = 0; i < step.strip_stop && end >= begin + c.size() && token.compare(end - c.size(), c.size(), c) == 0; ++i)
            end -= c.size();
          token = token.substr(begin, end - begin);
        }
        break;
      case Kind::metaspace:  // the replacement becomes a space; in the first token it is dropped
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& r = step.character;
          for (size_t at = 0; at < tokens[i].size();) {
            if (tokens[i].compare(at, r.size(), r) == 0) {
              if (i != 0 || !step.drop_first) out.push_back(' ');
              at += r.size();
            } else {
              out.push_back(tokens[i][at++]);
            }
          }
          tokens[i].swap(out);
        }
        break;
    }
  }
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (join_with_spaces_ && i > 0) text.push_back(' ');
    text += tokens[i];
  }
  return text;
}

}  // namespace strata::tokenizer::detail
