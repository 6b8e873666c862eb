// Normalizers and SentencePiece-style decoders of tokenizer.json (the contract is in transforms.h).
#include "engine/tokenizer/transforms.h"

#include "engine/tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
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
  } else {
    return loader.error(key + ".type", fmt::format("'{}' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, or a "
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
