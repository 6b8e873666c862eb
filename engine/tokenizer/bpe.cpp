// Byte-level BPE from a Hugging Face tokenizer.json (the contract is in tokenizer.h).
//
// Encoding, in the order Hugging Face's `tokenizers` applies it:
//  1. added tokens split the raw text (leftmost match, the longest at a position wins);
//  2. each stretch between them goes through the pre-tokenizer steps: Split steps run their
//     regex and keep matches and gaps as separate pieces (Isolated) or drop the matches
//     (Removed); ByteLevel optionally prefixes a space and, with use_regex, splits by GPT-2's
//     pattern;
//  3. each piece becomes one symbol per byte, and adjacent pairs merge by rank — the lowest rank
//     first, leftmost among equals — until no pair has a merge (with ignore_merges, a piece that
//     is itself in the vocabulary is taken whole first).
// Pieces stream from one step to the next through callbacks: nothing is materialized per
// piece, so a 1 GB text costs its ids and nothing proportional besides.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

// The pattern ByteLevel(use_regex: true) splits by — GPT-2's, as Hugging Face writes it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Bounds a pathological pattern (catastrophic backtracking) to an error, not a hang.
constexpr uint32_t kMatchLimit = 10'000'000;
// Words longer than this are not cached (they are rare and would crowd the cache out).
constexpr size_t kCacheWordBytes = 64;
constexpr size_t kCacheEntries = 1u << 18;
constexpr uint64_t kProgressEveryBytes = 8u << 20;

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

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards, in byte order.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
    table[byte] = printable ? byte : next++;
  }
  return table;
}

void append_utf8(std::string& out, uint32_t code_point) {
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
size_t next_code_point(std::string_view text, size_t at, uint32_t& code_point) {
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

enum class SplitBehavior : uint8_t { isolated, removed };

struct PreTokenizerStep {
  bool byte_level = false;        // a ByteLevel step; otherwise a Split step
  bool add_prefix_space = false;  // ByteLevel only
  pcre2_code* regex = nullptr;    // Split, or ByteLevel with use_regex; owned by BpeTokenizer::codes_
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
};

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct MergeEntry {
  uint32_t rank = 0;
  uint32_t merged_id = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  Status encode_into(std::string_view text, std::vector<uint32_t>& ids, const ProgressFn& progress) const override;
  Result<std::string> decode(std::span<const uint32_t> ids) const override;
  uint32_t vocab_size() const override { return vocab_size_; }
  std::optional<uint32_t> bos_id() const override { return bos_id_; }
  std::optional<uint32_t> eos_id() const override { return eos_id_; }
  const char* kind() const override { return "bpe"; }

  // Filled by the parser.
  std::string source_name_;
  std::unordered_map<std::string, uint32_t> id_of_bytes_;  // vocab keyed by the raw bytes
  std::vector<std::string> bytes_of_id_;                   // raw bytes per id ("" for holes)
  std::vector<uint8_t> id_assigned_;
  std::array<uint32_t, 256> byte_id_{};                    // the single-byte symbols
  std::unordered_map<uint64_t, MergeEntry> merges_;        // (left << 32 | right) → rank, result
  bool ignore_merges_ = false;
  std::vector<PreTokenizerStep> steps_;
  std::vector<Pcre2Code> codes_;
  Pcre2MatchContext match_context_;
  std::vector<AddedToken> added_;  // longest content first
  std::array<bool, 256> added_first_byte_{};
  std::vector<int32_t> added_index_of_id_;  // id → index into added_, or -1
  uint32_t vocab_size_ = 0;
  std::optional<uint32_t> bos_id_;
  std::optional<uint32_t> eos_id_;

 private:
  struct EncodeState {
    std::vector<uint32_t>* ids;
    std::vector<Pcre2MatchData> match_data;  // one per step
    const char* text_begin = nullptr;        // progress counts bytes from here
    const ProgressFn* progress = nullptr;
    uint64_t next_progress_bytes = 0;
    Status status;
  };
  void pre_tokenize(EncodeState& state, size_t step, std::string_view piece) const;
  void encode_word(EncodeState& state, std::string_view word) const;
  void merge_word(std::string_view word, std::vector<uint32_t>& out) const;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;
};

// Runs the steps from `step` on: the last step's pieces are words for the BPE model.
void BpeTokenizer::pre_tokenize(EncodeState& state, size_t step, std::string_view piece) const {
  if (!state.status.ok() || piece.empty()) return;
  if (step == steps_.size()) {
    encode_word(state, piece);
    return;
  }
  const PreTokenizerStep& s = steps_[step];
  std::string prefixed;
  if (s.byte_level && s.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (s.regex == nullptr) {  // ByteLevel without its regex: the piece goes on whole
    pre_tokenize(state, step + 1, piece);
    return;
  }
  pcre2_match_data* data = state.match_data[step].get();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t gap_start = 0;
  size_t at = 0;
  while (at < piece.size()) {
    // NO_UTF_CHECK: encode_into validated the whole text once (PCRE2 would re-check the whole
    // subject on every call otherwise — quadratic over a long text).
    int rc = pcre2_match(s.regex, subject, piece.size(), at, PCRE2_NO_UTF_CHECK, data, match_context_.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      state.status = make_error(ErrorKind::invalid_argument,
                                fmt::format("{}: key 'pre_tokenizer': the regex failed on the input: {}", source_name_,
                                            reinterpret_cast<const char*>(message)));
      return;
    }
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    size_t match_start = ovector[0];
    size_t match_end = ovector[1];
    if (match_end == match_start) {  // an empty match splits nothing: step over one character
      uint32_t code_point = 0;
      at = match_start + next_code_point(piece, match_start, code_point);
      continue;
    }
    std::string_view gap = piece.substr(gap_start, match_start - gap_start);
    std::string_view match = piece.substr(match_start, match_end - match_start);
    bool keep_match = s.behavior == SplitBehavior::isolated || s.invert;
    bool keep_gap = s.behavior == SplitBehavior::isolated || !s.invert;
    if (keep_gap) pre_tokenize(state, step + 1, gap);
    if (keep_match) pre_tokenize(state, step + 1, match);
    gap_start = at = match_end;
    // Progress from the first step's position: exact, and no cutting of the text (a cut could
    // change the ids: a prefix space per part, or a custom pattern spanning the cut).
    if (step == 0 && state.progress != nullptr && prefixed.empty()) {
      auto done_bytes = static_cast<uint64_t>(piece.data() + at - state.text_begin);
      if (done_bytes >= state.next_progress_bytes) {
        (*state.progress)(done_bytes);
        state.next_progress_bytes = done_bytes + kProgressEveryBytes;
      }
    }
  }
  if (s.behavior == SplitBehavior::isolated || !s.invert) pre_tokenize(state, step + 1, piece.substr(gap_start));
}

void BpeTokenizer::encode_word(EncodeState& state, std::string_view word) const {
  std::vector<uint32_t>& ids = *state.ids;
  if (ignore_merges_) {
    auto whole = id_of_bytes_.find(std::string(word));
    if (whole != id_of_bytes_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  if (word.size() == 1) {
    ids.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (word.size() <= kCacheWordBytes) {
    std::string key(word);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto hit = cache_.find(key);
      if (hit != cache_.end()) {
        ids.insert(ids.end(), hit->second.begin(), hit->second.end());
        return;
      }
    }
    std::vector<uint32_t> merged;
    merge_word(word, merged);
    ids.insert(ids.end(), merged.begin(), merged.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(std::move(key), std::move(merged));
    return;
  }
  merge_word(word, ids);
}

// The merge loop over a doubly linked list of symbols with a heap of candidate pairs ordered
// by (rank, position): O(n log n) per word, so a megabyte-long run of one letter stays cheap.
void BpeTokenizer::merge_word(std::string_view word, std::vector<uint32_t>& out) const {
  const size_t n = word.size();
  std::vector<uint32_t> symbol(n);
  std::vector<int64_t> prev(n);
  std::vector<int64_t> next(n);
  for (size_t i = 0; i < n; ++i) {
    symbol[i] = byte_id_[static_cast<uint8_t>(word[i])];
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    uint32_t position;
    uint32_t left;
    uint32_t right;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int64_t left_position) {
    if (left_position < 0 || next[left_position] < 0) return;
    uint32_t left = symbol[left_position];
    uint32_t right = symbol[next[left_position]];
    auto merge = merges_.find((uint64_t{left} << 32) | right);
    if (merge != merges_.end())
      heap.push({merge->second.rank, static_cast<uint32_t>(left_position), left, right});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int64_t>(i));
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    int64_t left_position = top.position;
    // Stale entries: the left symbol was absorbed, or either side changed since the push.
    if (!alive[left_position] || symbol[left_position] != top.left) continue;
    int64_t right_position = next[left_position];
    if (right_position < 0 || symbol[right_position] != top.right) continue;
    symbol[left_position] = merges_.at((uint64_t{top.left} << 32) | top.right).merged_id;
    alive[right_position] = 0;
    next[left_position] = next[right_position];
    if (next[right_position] >= 0) prev[next[right_position]] = left_position;
    consider(prev[left_position]);
    consider(left_position);
  }
  for (int64_t i = 0; i >= 0; i = next[i]) out.push_back(symbol[i]);
}

Status BpeTokenizer::encode_into(std::string_view text, std::vector<uint32_t>& ids, const ProgressFn& progress) const {
  if (std::optional<uint64_t> bad = first_invalid_utf8(text))
    return make_error(ErrorKind::invalid_argument, fmt::format("the text is not valid UTF-8 at byte {}", *bad));
  EncodeState state;
  state.ids = &ids;
  for (const PreTokenizerStep& step : steps_)
    state.match_data.emplace_back(step.regex != nullptr ? pcre2_match_data_create_from_pattern(step.regex, nullptr)
                                                        : nullptr);
  for (size_t i = 0; i < steps_.size(); ++i)
    if (steps_[i].regex != nullptr && state.match_data[i] == nullptr)
      return make_error(ErrorKind::no_space, "cannot allocate regex match data");

  state.text_begin = text.data();
  state.progress = progress ? &progress : nullptr;
  state.next_progress_bytes = kProgressEveryBytes;
  auto plain = [&](size_t begin, size_t end) { pre_tokenize(state, 0, text.substr(begin, end - begin)); };

  size_t stretch_start = 0;
  size_t at = 0;
  while (at < text.size() && state.status.ok()) {
    if (!added_first_byte_[static_cast<uint8_t>(text[at])]) {
      ++at;
      continue;
    }
    const AddedToken* found = nullptr;
    for (const AddedToken& token : added_) {  // longest first
      if (text.compare(at, token.content.size(), token.content) != 0) continue;
      if (token.single_word) {
        auto word_byte = [](char c) {
          auto u = static_cast<unsigned char>(c);
          return u >= 0x80 || std::isalnum(u) || c == '_';
        };
        bool before = at > 0 && word_byte(text[at - 1]);
        size_t end = at + token.content.size();
        bool after = end < text.size() && word_byte(text[end]);
        if (before || after) continue;
      }
      found = &token;
      break;
    }
    if (found == nullptr) {
      ++at;
      continue;
    }
    size_t begin = at;
    size_t end = at + found->content.size();
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    if (found->lstrip)
      while (begin > stretch_start && is_space(text[begin - 1])) --begin;
    if (found->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    plain(stretch_start, begin);
    ids.push_back(found->id);
    stretch_start = at = end;
  }
  if (state.status.ok()) plain(stretch_start, text.size());
  if (progress && state.status.ok()) progress(text.size());
  return state.status;
}

Result<std::string> BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  for (uint32_t id : ids) {
    if (id >= vocab_size_)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("token id {} is outside the vocabulary of {} ({})", id, vocab_size_, source_name_));
    if (id < added_index_of_id_.size() && added_index_of_id_[id] >= 0) {
      text += added_[added_index_of_id_[id]].content;
    } else if (id < id_assigned_.size() && id_assigned_[id]) {
      text += bytes_of_id_[id];
    } else {
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("token id {} is a hole in the vocabulary of {}", id, source_name_));
    }
  }
  return text;
}

// ---- loading --------------------------------------------------------------------------------

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

const char* type_name(const json& value) { return value.type_name(); }

// The byte-level alphabet inverted: code point → byte, or -1.
std::unordered_map<uint32_t, uint8_t> code_point_to_byte() {
  std::unordered_map<uint32_t, uint8_t> inverse;
  std::array<uint32_t, 256> forward = byte_to_code_point();
  for (uint32_t byte = 0; byte < 256; ++byte) inverse.emplace(forward[byte], static_cast<uint8_t>(byte));
  return inverse;
}

// A vocabulary entry in the byte-level alphabet → the raw bytes it stands for. A character
// outside the alphabet stands for its own UTF-8 (what the ByteLevel decoder leaves alone).
std::string unmap_bytes(const std::string& token, const std::unordered_map<uint32_t, uint8_t>& inverse) {
  std::string raw;
  raw.reserve(token.size());
  size_t at = 0;
  while (at < token.size()) {
    uint32_t code_point = 0;
    size_t length = next_code_point(token, at, code_point);
    auto byte = inverse.find(code_point);
    if (byte != inverse.end()) raw.push_back(static_cast<char>(byte->second));
    else raw.append(token, at, length);
    at += length;
  }
  return raw;
}

Result<Pcre2Code> compile_regex(const Loader& loader, std::string_view key, std::string_view pattern, bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UCP gives \p{L}, \s and case folding their Unicode meaning; a literal has no classes (and PCRE2 refuses UCP with it).
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
  // JIT is a speed-up only: where it is unavailable the interpreter runs the same pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return owned;
}

// Optional boolean key: absent or null means `fallback`.
Result<bool> optional_bool(const Loader& loader, const json& object, const char* name, const std::string& key,
                           bool fallback) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return loader.error(key + "." + name, fmt::format("is a {}, not a boolean", type_name(*it)));
  return it->get<bool>();
}

Status parse_pre_tokenizer_step(const Loader& loader, const json& node, const std::string& key, BpeTokenizer& bpe) {
  if (!node.is_object()) return loader.error(key, fmt::format("is a {}, not an object", type_name(node)));
  auto type = node.find("type");
  if (type == node.end() || !type->is_string()) return loader.error(key + ".type", "is missing or not a string");
  const std::string type_string = type->get<std::string>();
  PreTokenizerStep step;
  if (type_string == "ByteLevel") {
    step.byte_level = true;
    STRATA_ASSIGN_OR_RETURN(step.add_prefix_space, optional_bool(loader, node, "add_prefix_space", key, false));
    STRATA_ASSIGN_OR_RETURN(bool use_regex, optional_bool(loader, node, "use_regex", key, true));
    if (use_regex) {
      STRATA_ASSIGN_OR_RETURN(Pcre2Code code, compile_regex(loader, key, kGpt2Pattern, false));
      step.regex = code.get();
      bpe.codes_.push_back(std::move(code));
    }
  } else if (type_string == "Split") {
    auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object() || pattern->size() != 1)
      return loader.error(key + ".pattern", "must be an object holding one of Regex or String");
    bool literal = pattern->contains("String");
    auto text = literal ? pattern->find("String") : pattern->find("Regex");
    if (text == pattern->end() || !text->is_string())
      return loader.error(key + ".pattern", "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const std::string& pattern_text = text->get_ref<const std::string&>();
    if (pattern_text.empty()) return loader.error(key + ".pattern", "is empty");
    STRATA_ASSIGN_OR_RETURN(Pcre2Code code, compile_regex(loader, key + ".pattern", pattern_text, literal));
    step.regex = code.get();
    bpe.codes_.push_back(std::move(code));
    auto behavior = node.find("behavior");
    if (behavior == node.end() || !behavior->is_string())
      return loader.error(key + ".behavior", "is missing or not a string");
    if (*behavior == "Isolated") step.behavior = SplitBehavior::isolated;
    else if (*behavior == "Removed") step.behavior = SplitBehavior::removed;
    else
      return loader.error(key + ".behavior", fmt::format("'{}' is not supported (Isolated or Removed)",
                                                         behavior->get<std::string>()));
    STRATA_ASSIGN_OR_RETURN(step.invert, optional_bool(loader, node, "invert", key, false));
  } else {
    return loader.error(key + ".type", fmt::format("'{}' is not supported (ByteLevel, Split, or a Sequence of them)",
                                                   type_string));
  }
  bpe.steps_.push_back(step);
  return Status();
}

// The id of a TemplateProcessing's leading special token (the BOS a model expects), if any.
std::optional<std::string> template_leading_special(const json& post_processor) {
  if (!post_processor.is_object()) return std::nullopt;
  auto type = post_processor.find("type");
  if (type == post_processor.end() || !type->is_string()) return std::nullopt;
  if (*type == "Sequence") {
    auto processors = post_processor.find("processors");
    if (processors == post_processor.end() || !processors->is_array()) return std::nullopt;
    for (const json& processor : *processors)
      if (auto found = template_leading_special(processor)) return found;
    return std::nullopt;
  }
  if (*type != "TemplateProcessing") return std::nullopt;
  auto single = post_processor.find("single");
  if (single == post_processor.end() || !single->is_array() || single->empty()) return std::nullopt;
  const json& first = single->front();
  if (!first.is_object()) return std::nullopt;
  auto special = first.find("SpecialToken");
  if (special == first.end() || !special->is_object()) return std::nullopt;
  auto id = special->find("id");
  if (id == special->end() || !id->is_string()) return std::nullopt;
  return id->get<std::string>();
}

Result<uint32_t> token_id(const Loader& loader, const json& value, const std::string& key) {
  if (!value.is_number_integer()) return loader.error(key, fmt::format("is a {}, not a token id", type_name(value)));
  if (value.is_number_unsigned() ? value.get<uint64_t>() >= (1ull << 31) : true)
    return loader.error(key, fmt::format("{} is not an id in [0, 2^31)", value.dump()));
  return static_cast<uint32_t>(value.get<uint64_t>());
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_bpe_json(std::string_view json_text, const std::string& source_name) {
  Loader loader(source_name);
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded())
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: not valid JSON", source_name));
  if (!root.is_object())
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: the top level is a {}, not an object",
                                                               source_name, type_name(root)));
  auto bpe = std::make_unique<BpeTokenizer>();
  bpe->source_name_ = source_name;

  auto normalizer = root.find("normalizer");
  if (normalizer != root.end() && !normalizer->is_null()) {
    std::string type = normalizer->is_object() && normalizer->contains("type") && (*normalizer)["type"].is_string()
                           ? (*normalizer)["type"].get<std::string>() : normalizer->dump().substr(0, 40);
    return loader.error("normalizer", fmt::format("'{}' is not supported (byte-level BPE without a normalizer only)", type));
  }

  // --- model ---
  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return loader.error("model", "is missing or not an object");
  if (auto type = model->find("type"); type != model->end()) {
    if (!type->is_string() || *type != "BPE")
      return loader.error("model.type", fmt::format("{} is not supported (BPE only)", type->dump()));
  }
  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model->find(unsupported);
    if (it != model->end() && !it->is_null() && !(it->is_string() && it->get_ref<const std::string&>().empty()))
      return loader.error(std::string("model.") + unsupported, "is not supported by byte-level BPE");
  }
  if (auto dropout = model->find("dropout"); dropout != model->end() && !dropout->is_null()) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0)
      return loader.error("model.dropout", fmt::format("{} is not supported (null or 0: encoding is deterministic)",
                                                       dropout->dump()));
  }
  STRATA_ASSIGN_OR_RETURN(bool byte_fallback, optional_bool(loader, *model, "byte_fallback", "model", false));
  if (byte_fallback) return loader.error("model.byte_fallback", "true is not supported (byte-level BPE needs none)");
  STRATA_ASSIGN_OR_RETURN(bpe->ignore_merges_, optional_bool(loader, *model, "ignore_merges", "model", false));

  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object() || vocab->empty())
    return loader.error("model.vocab", "is missing, empty or not an object of token → id");
  const std::unordered_map<uint32_t, uint8_t> inverse = code_point_to_byte();
  std::unordered_map<std::string, uint32_t> id_of_mapped;  // the merges name tokens as mapped text
  id_of_mapped.reserve(vocab->size());
  bpe->id_of_bytes_.reserve(vocab->size());
  uint32_t max_id = 0;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    std::string key = "model.vocab[\"" + it.key().substr(0, 40) + "\"]";
    if (it.key().empty()) return loader.error("model.vocab", "holds an empty token");
    STRATA_ASSIGN_OR_RETURN(uint32_t id, token_id(loader, it.value(), key));
    if (id >= bpe->bytes_of_id_.size()) {
      if (id >= 4 * vocab->size() + 65536)
        return loader.error(key, fmt::format("id {} is far beyond the {} tokens of the vocabulary", id, vocab->size()));
      bpe->bytes_of_id_.resize(id + 1);
      bpe->id_assigned_.resize(id + 1, 0);
    }
    if (bpe->id_assigned_[id]) return loader.error(key, fmt::format("id {} is given to two tokens", id));
    bpe->id_assigned_[id] = 1;
    bpe->bytes_of_id_[id] = unmap_bytes(it.key(), inverse);
    id_of_mapped.emplace(it.key(), id);
    bpe->id_of_bytes_.emplace(bpe->bytes_of_id_[id], id);
    max_id = std::max(max_id, id);
  }
  std::array<uint32_t, 256> forward = byte_to_code_point();
  for (uint32_t byte = 0; byte < 256; ++byte) {
    std::string symbol;
    append_utf8(symbol, forward[byte]);
    auto it = id_of_mapped.find(symbol);
    if (it == id_of_mapped.end())
      return loader.error("model.vocab", fmt::format("lacks the byte-level symbol '{}' for byte 0x{:02x} (every byte needs "
                                                     "one, or some text could not be encoded)", symbol, byte));
    bpe->byte_id_[byte] = it->second;
  }

  auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array()) return loader.error("model.merges", "is missing or not an array");
  bpe->merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& merge = (*merges)[rank];
    std::string key = fmt::format("model.merges[{}]", rank);
    std::string left, right;
    if (merge.is_string()) {  // "a b": the tokens hold no space (byte-level maps it to Ġ)
      const std::string& text = merge.get_ref<const std::string&>();
      size_t space = text.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= text.size() || text.find(' ', space + 1) != std::string::npos)
        return loader.error(key, fmt::format("'{}' is not two tokens separated by one space", text.substr(0, 60)));
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return loader.error(key, "is neither \"a b\" nor a pair [\"a\", \"b\"]");
    }
    auto left_id = id_of_mapped.find(left);
    auto right_id = id_of_mapped.find(right);
    auto merged_id = id_of_mapped.find(left + right);
    if (left_id == id_of_mapped.end() || right_id == id_of_mapped.end())
      return loader.error(key, fmt::format("names '{}' which is not in model.vocab",
                                           (left_id == id_of_mapped.end() ? left : right).substr(0, 60)));
    if (merged_id == id_of_mapped.end())
      return loader.error(key, fmt::format("merges to '{}' which is not in model.vocab", (left + right).substr(0, 60)));
    uint64_t pair = (uint64_t{left_id->second} << 32) | right_id->second;
    // A repeated pair keeps its first (lowest) rank, as Hugging Face's loader does.
    bpe->merges_.emplace(pair, MergeEntry{static_cast<uint32_t>(rank), merged_id->second});
  }

  // --- pre-tokenizer ---
  auto pre = root.find("pre_tokenizer");
  if (pre == root.end() || !pre->is_object())
    return loader.error("pre_tokenizer", "is missing or not an object (byte-level BPE needs ByteLevel)");
  auto pre_type = pre->find("type");
  if (pre_type != pre->end() && pre_type->is_string() && *pre_type == "Sequence") {
    auto steps = pre->find("pretokenizers");
    if (steps == pre->end() || !steps->is_array() || steps->empty())
      return loader.error("pre_tokenizer.pretokenizers", "is missing, empty or not an array");
    for (size_t i = 0; i < steps->size(); ++i)
      STRATA_RETURN_IF_ERROR(parse_pre_tokenizer_step(loader, (*steps)[i], fmt::format("pre_tokenizer.pretokenizers[{}]", i), *bpe));
  } else {
    STRATA_RETURN_IF_ERROR(parse_pre_tokenizer_step(loader, *pre, "pre_tokenizer", *bpe));
  }
  if (std::none_of(bpe->steps_.begin(), bpe->steps_.end(), [](const PreTokenizerStep& s) { return s.byte_level; }))
    return loader.error("pre_tokenizer", "has no ByteLevel step; only byte-level BPE is supported");
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (context == nullptr) return make_error(ErrorKind::no_space, "cannot allocate a regex match context");
  bpe->match_context_.reset(context);
  pcre2_set_match_limit(context, kMatchLimit);

  if (auto decoder = root.find("decoder"); decoder != root.end() && !decoder->is_null()) {
    bool byte_level = decoder->is_object() && decoder->contains("type") && (*decoder)["type"] == "ByteLevel";
    if (!byte_level) return loader.error("decoder", "must be ByteLevel or null for byte-level BPE");
  }

  // --- added tokens ---
  std::optional<std::string> bos_content;
  if (auto post = root.find("post_processor"); post != root.end()) bos_content = template_leading_special(*post);
  std::optional<std::string> eos_content;
  if (auto added = root.find("added_tokens"); added != root.end() && !added->is_null()) {
    if (!added->is_array()) return loader.error("added_tokens", "is not an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& entry = (*added)[i];
      std::string key = fmt::format("added_tokens[{}]", i);
      if (!entry.is_object()) return loader.error(key, "is not an object");
      AddedToken token;
      auto id = entry.find("id");
      if (id == entry.end()) return loader.error(key + ".id", "is missing");
      STRATA_ASSIGN_OR_RETURN(token.id, token_id(loader, *id, key + ".id"));
      if (token.id >= 4 * vocab->size() + 65536)
        return loader.error(key + ".id", fmt::format("{} is far beyond the {} tokens of the vocabulary", token.id, vocab->size()));
      auto content = entry.find("content");
      if (content == entry.end() || !content->is_string() || content->get_ref<const std::string&>().empty())
        return loader.error(key + ".content", "is missing, empty or not a string");
      token.content = content->get<std::string>();
      STRATA_ASSIGN_OR_RETURN(token.special, optional_bool(loader, entry, "special", key, false));
      STRATA_ASSIGN_OR_RETURN(token.single_word, optional_bool(loader, entry, "single_word", key, false));
      STRATA_ASSIGN_OR_RETURN(token.lstrip, optional_bool(loader, entry, "lstrip", key, false));
      STRATA_ASSIGN_OR_RETURN(token.rstrip, optional_bool(loader, entry, "rstrip", key, false));
      if (token.id < bpe->id_assigned_.size() && bpe->id_assigned_[token.id] &&
          bpe->bytes_of_id_[token.id] != unmap_bytes(token.content, inverse))
        return loader.error(key + ".id", fmt::format("{} is '{}' in model.vocab, not '{}'", token.id,
                                                     bpe->bytes_of_id_[token.id].substr(0, 40), token.content.substr(0, 40)));
      if (std::any_of(bpe->added_.begin(), bpe->added_.end(), [&](const AddedToken& t) { return t.id == token.id || t.content == token.content; }))
        return loader.error(key, fmt::format("repeats the id {} or the content '{}'", token.id, token.content.substr(0, 40)));
      max_id = std::max(max_id, token.id);
      if (token.special && !eos_content &&
          (token.content == "<|endoftext|>" || token.content == "<|end_of_text|>" || token.content == "</s>" || token.content == "<eos>"))
        eos_content = token.content;
      if (token.special && !bos_content && (token.content == "<|begin_of_text|>" || token.content == "<s>" || token.content == "<bos>"))
        bos_content = token.content;
      bpe->added_.push_back(std::move(token));
    }
  }
  std::stable_sort(bpe->added_.begin(), bpe->added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  bpe->vocab_size_ = max_id + 1;
  bpe->added_index_of_id_.assign(bpe->vocab_size_, -1);
  for (size_t i = 0; i < bpe->added_.size(); ++i) {
    bpe->added_index_of_id_[bpe->added_[i].id] = static_cast<int32_t>(i);
    bpe->added_first_byte_[static_cast<uint8_t>(bpe->added_[i].content[0])] = true;
    if (bos_content && bpe->added_[i].content == *bos_content) bpe->bos_id_ = bpe->added_[i].id;
    if (eos_content && bpe->added_[i].content == *eos_content) bpe->eos_id_ = bpe->added_[i].id;
  }
  if (bos_content && !bpe->bos_id_)
    return loader.error("post_processor", fmt::format("names the special token '{}', which added_tokens lacks",
                                                      bos_content->substr(0, 40)));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

}  // namespace strata::tokenizer
