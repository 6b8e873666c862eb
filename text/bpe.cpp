// BPE from a Hugging Face tokenizer.json (the contract is in tokenizer.h). Two alphabets:
// byte-level (a ByteLevel pre-tokenizer: GPT-2, Llama 3, Qwen 2 — symbols are bytes, the vocab
// spells them in GPT-2's byte alphabet) and SentencePiece-style (no ByteLevel: Llama 2, Mistral —
// symbols are characters, the vocab spells text with '▁' for spaces, byte_fallback and unk_token
// cover the characters it lacks).
//
// Encoding, in the order Hugging Face's `tokenizers` applies it:
//  1. added tokens that are not `normalized` split the raw text (leftmost match, the longest at a
//     position wins);
//  2. each stretch between them is normalized (transforms.h), and `normalized` added tokens split
//     the normalized text the same way;
//  3. each stretch goes through the pre-tokenizer steps: Split steps run their regex and keep
//     matches and gaps as separate pieces (Isolated) or drop the matches (Removed) — Whitespace,
//     WhitespaceSplit, Digits and Punctuation are Split steps with fixed patterns; ByteLevel
//     optionally prefixes a space and, with use_regex, splits by GPT-2's pattern; Metaspace
//     writes spaces as its replacement, prefixes one (always, or first: only at the text's
//     start) and optionally splits before each replacement;
//  4. each piece becomes symbols (one per byte; or one per character, a character the vocab
//     lacks becoming its <0xNN> byte tokens or unk_token), and adjacent pairs merge by rank — the
//     lowest rank first, leftmost among equals — until no pair has a merge (with ignore_merges, a
//     piece that is itself in the vocabulary is taken whole first).
// Pieces stream from one step to the next through callbacks: nothing is materialized per piece,
// so a 1 GB text costs its ids and nothing proportional besides (a normalizer adds one copy of
// each stretch).
#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "text/internal.h"
#include "text/tokenizer.h"
#include "text/transforms.h"

namespace strata::tokenizer {
namespace {

using namespace detail;  // NOLINT: this file is the user of the shared helpers

// The pattern ByteLevel(use_regex: true) splits by — GPT-2's, as Hugging Face writes it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Hugging Face's fixed splitters, written as the Split steps they are, with classes spelling
// out Rust's character tests: White_Space (char::is_whitespace), the regex crate's Unicode \w
// (Alphabetic, marks, Nd, Pc, Join_Control), char::is_numeric (N), and Punctuation's
// is_ascii_punctuation || is_punctuation.
#define STRATA_WHITE_SPACE R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"
#define STRATA_WORD R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})"
constexpr std::string_view kWhitespacePattern = "[" STRATA_WORD "]+|[^" STRATA_WORD STRATA_WHITE_SPACE "]+";
constexpr std::string_view kWhitespaceSplitPattern = "[^" STRATA_WHITE_SPACE "]+";
constexpr std::string_view kPunctuationClass = R"([\p{P}\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}])";
#undef STRATA_WORD
#undef STRATA_WHITE_SPACE
// SentencePiece's space: Metaspace's default replacement, and the boundary words split at.
constexpr std::string_view kMetaspace = "\u2581";

// Words longer than this are not cached (they are rare and would crowd the cache out).
constexpr size_t kCacheWordBytes = 64;
constexpr size_t kCacheEntries = 1u << 18;
constexpr uint64_t kProgressEveryBytes = 8u << 20;

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

// Lookup by string_view without building a std::string per character.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using Vocab = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

enum class SplitBehavior : uint8_t { isolated, removed };
enum class PrependScheme : uint8_t { always, first, never };
enum class StepKind : uint8_t { byte_level, split, metaspace };

struct PreTokenizerStep {
  StepKind kind = StepKind::split;
  bool add_prefix_space = false;  // ByteLevel only
  pcre2_code* regex = nullptr;    // Split, or ByteLevel with use_regex; owned by BpeTokenizer::codes_
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  std::string replacement;        // Metaspace
  PrependScheme prepend = PrependScheme::always;
  bool split = true;
};

struct AddedToken {
  std::string content;        // what decode gives back
  std::string match_content;  // what encode looks for: content, normalized when `normalized`
  uint32_t id = 0;
  bool special = false;
  bool normalized = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

// The added tokens matched on one side of the normalizer, longest first.
struct AddedMatcher {
  std::vector<const AddedToken*> tokens;
  std::array<bool, 256> first_byte{};

  const AddedToken* match(std::string_view text, size_t at) const {
    if (!first_byte[static_cast<uint8_t>(text[at])]) return nullptr;
    for (const AddedToken* token : tokens) {
      if (text.compare(at, token->match_content.size(), token->match_content) != 0) continue;
      if (token->single_word) {
        auto word_byte = [](char c) {
          auto u = static_cast<unsigned char>(c);
          return u >= 0x80 || std::isalnum(u) || c == '_';
        };
        bool before = at > 0 && word_byte(text[at - 1]);
        size_t end = at + token->match_content.size();
        bool after = end < text.size() && word_byte(text[end]);
        if (before || after) continue;
      }
      return token;
    }
    return nullptr;
  }
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
  std::optional<uint32_t> token_id(std::string_view token) const override;
  const char* kind() const override { return "bpe"; }

  // Filled by the parser.
  std::string source_name_;
  bool char_level_ = false;                                // SentencePiece-style alphabet
  Vocab id_of_bytes_;                                      // vocab keyed by the raw bytes
  std::vector<std::string> bytes_of_id_;                   // raw bytes per id ("" for holes)
  std::vector<uint8_t> id_assigned_;
  std::array<uint32_t, 256> byte_id_{};                    // byte-level: the single-byte symbols
  std::array<int64_t, 256> byte_fallback_id_{};            // char-level: <0xNN>, or -1
  bool byte_fallback_ = false;
  std::optional<uint32_t> unk_id_;
  bool fuse_unk_ = false;
  std::unordered_map<uint64_t, MergeEntry> merges_;        // (left << 32 | right) → rank, result
  bool ignore_merges_ = false;
  // Char-level: words may be cut before each run of `boundary_` — proven not to change the ids
  // at load (no vocab entry holds it after another character, so no merge crosses the cut).
  bool split_at_boundaries_ = false;
  std::string boundary_{kMetaspace};
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<Decoder> decoder_;  // char-level only; byte-level decodes bytes directly
  std::vector<PreTokenizerStep> steps_;
  std::vector<Pcre2Code> codes_;
  Pcre2MatchContext match_context_;
  std::vector<AddedToken> added_;
  AddedMatcher raw_added_;         // matched on the text as given
  AddedMatcher normalized_added_;  // matched on the normalized text
  std::vector<int32_t> added_index_of_id_;  // id → index into added_, or -1
  uint32_t vocab_size_ = 0;
  std::optional<uint32_t> bos_id_;
  std::optional<uint32_t> eos_id_;

 private:
  struct EncodeState {
    std::vector<uint32_t>* ids;
    std::vector<Pcre2MatchData> match_data;  // one per step
    // The byte a piece must start at to be at the text's start (Metaspace's "first"), or null.
    const char* text_start = nullptr;
    // Progress: step-0 pieces lie in [buffer, …), which stands for raw bytes from raw_begin on
    // (scaled when a normalizer changed the length).
    const char* progress_buffer = nullptr;
    uint64_t progress_raw_begin = 0;
    double progress_scale = 1.0;
    const ProgressFn* progress = nullptr;
    uint64_t next_progress_bytes = 0;
    Status status;
  };
  template <typename Plain>
  void split_added(const AddedMatcher& matcher, std::string_view text, Plain&& plain, EncodeState& state) const;
  void encode_stretch(EncodeState& state, std::string_view stretch, uint64_t raw_begin) const;
  void pre_tokenize(EncodeState& state, size_t step, std::string_view piece) const;
  void report(EncodeState& state, uint64_t done_bytes) const;
  void encode_word(EncodeState& state, std::string_view word) const;
  void encode_segment(EncodeState& state, std::string_view word) const;
  bool initial_symbols(EncodeState& state, std::string_view word, std::vector<uint32_t>& symbols) const;
  void merge_word(std::vector<uint32_t>& symbol, std::vector<uint32_t>& out) const;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;
};

void BpeTokenizer::report(EncodeState& state, uint64_t done_bytes) const {
  if (state.progress == nullptr || done_bytes < state.next_progress_bytes) return;
  (*state.progress)(done_bytes);
  state.next_progress_bytes = done_bytes + kProgressEveryBytes;
}

// Runs the steps from `step` on: the last step's pieces are words for the BPE model.
void BpeTokenizer::pre_tokenize(EncodeState& state, size_t step, std::string_view piece) const {
  if (!state.status.ok() || piece.empty()) return;
  if (step == steps_.size()) {
    encode_word(state, piece);
    return;
  }
  const PreTokenizerStep& s = steps_[step];
  if (s.kind == StepKind::metaspace) {
    std::string replaced;
    replaced.reserve(piece.size() + s.replacement.size());
    for (char c : piece) {
      if (c == ' ') replaced += s.replacement;
      else replaced.push_back(c);
    }
    bool prepend = s.prepend == PrependScheme::always || (s.prepend == PrependScheme::first && piece.data() == state.text_start);
    if (prepend && replaced.compare(0, s.replacement.size(), s.replacement) != 0) replaced.insert(0, s.replacement);
    if (!s.split) {
      pre_tokenize(state, step + 1, replaced);
      return;
    }
    // Each replacement starts a piece (Hugging Face's MergedWithNext).
    size_t start = 0;
    for (size_t at = replaced.find(s.replacement, 1); at != std::string::npos; at = replaced.find(s.replacement, at + 1)) {
      pre_tokenize(state, step + 1, std::string_view(replaced).substr(start, at - start));
      start = at;
    }
    pre_tokenize(state, step + 1, std::string_view(replaced).substr(start));
    return;
  }
  std::string prefixed;
  if (s.kind == StepKind::byte_level && s.add_prefix_space && piece.front() != ' ') {
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
      at = match_start + code_point_length(piece, match_start);
      continue;
    }
    std::string_view gap = piece.substr(gap_start, match_start - gap_start);
    std::string_view match = piece.substr(match_start, match_end - match_start);
    bool keep_match = s.behavior == SplitBehavior::isolated || s.invert;
    bool keep_gap = s.behavior == SplitBehavior::isolated || !s.invert;
    if (keep_gap) pre_tokenize(state, step + 1, gap);
    if (keep_match) pre_tokenize(state, step + 1, match);
    gap_start = at = match_end;
    // Progress from the first step's position: no cutting of the text (a cut could change the
    // ids: a prefix space per part, or a custom pattern spanning the cut).
    if (step == 0 && state.progress != nullptr && prefixed.empty() && state.progress_buffer != nullptr) {
      auto done = static_cast<double>(piece.data() + at - state.progress_buffer) * state.progress_scale;
      report(state, state.progress_raw_begin + static_cast<uint64_t>(done));
    }
  }
  if (s.behavior == SplitBehavior::isolated || !s.invert) pre_tokenize(state, step + 1, piece.substr(gap_start));
}

void BpeTokenizer::encode_word(EncodeState& state, std::string_view word) const {
  if (ignore_merges_) {
    auto whole = id_of_bytes_.find(word);
    if (whole != id_of_bytes_.end()) {
      state.ids->push_back(whole->second);
      return;
    }
  }
  if (!split_at_boundaries_ || word.size() <= kCacheWordBytes) {
    encode_segment(state, word);
    return;
  }
  // Cut before each run of the boundary character ("a▁▁b▁c" → "a", "▁▁b", "▁c").
  const std::string& b = boundary_;
  size_t start = 0;
  for (size_t at = word.find(b, 1); at != std::string_view::npos; at = word.find(b, at + b.size())) {
    bool after_boundary = at >= b.size() && word.compare(at - b.size(), b.size(), b) == 0;
    if (after_boundary || at == start) continue;
    encode_segment(state, word.substr(start, at - start));
    start = at;
  }
  encode_segment(state, word.substr(start));
}

void BpeTokenizer::encode_segment(EncodeState& state, std::string_view word) const {
  std::vector<uint32_t>& ids = *state.ids;
  if (!char_level_ && word.size() == 1) {
    ids.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cached = word.size() <= kCacheWordBytes;
  if (cached) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto hit = cache_.find(std::string(word));
    if (hit != cache_.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<uint32_t> symbols;
  if (!initial_symbols(state, word, symbols)) return;
  if (!cached) {
    merge_word(symbols, ids);
    return;
  }
  std::vector<uint32_t> merged;
  merge_word(symbols, merged);
  ids.insert(ids.end(), merged.begin(), merged.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(std::string(word), std::move(merged));
}

// One symbol per byte (byte-level), or per character: the vocab's entry for it, else its
// <0xNN> byte tokens (byte_fallback, when the vocab has all of them), else unk_token (runs of
// unknown characters fused into one with fuse_unk) — Hugging Face's order, pending unk included.
bool BpeTokenizer::initial_symbols(EncodeState& state, std::string_view word, std::vector<uint32_t>& symbols) const {
  symbols.reserve(word.size());
  if (!char_level_) {
    for (char c : word) symbols.push_back(byte_id_[static_cast<uint8_t>(c)]);
    return true;
  }
  bool unk_pending = false;
  for (size_t at = 0; at < word.size();) {
    const size_t length = code_point_length(word, at);
    const std::string_view character = word.substr(at, length);
    at += length;
    if (auto known = id_of_bytes_.find(character); known != id_of_bytes_.end()) {
      if (unk_pending) {
        symbols.push_back(*unk_id_);
        unk_pending = false;
      }
      symbols.push_back(known->second);
      continue;
    }
    if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char c) {
          return byte_fallback_id_[static_cast<uint8_t>(c)] >= 0;
        })) {
      for (char c : character) symbols.push_back(static_cast<uint32_t>(byte_fallback_id_[static_cast<uint8_t>(c)]));
      continue;
    }
    if (!unk_id_) {
      uint32_t code_point = 0;
      next_code_point(character, 0, code_point);
      state.status = make_error(ErrorKind::invalid_argument,
                                fmt::format("{}: the text holds U+{:04X}, which model.vocab lacks, and the model has no "
                                            "byte_fallback or unk_token to stand for it", source_name_, code_point));
      return false;
    }
    if (unk_pending && !fuse_unk_) symbols.push_back(*unk_id_);
    unk_pending = true;
  }
  if (unk_pending) symbols.push_back(*unk_id_);
  return true;
}

// The merge loop over a doubly linked list of symbols with a heap of candidate pairs ordered
// by (rank, position): O(n log n) per word, so a megabyte-long run of one letter stays cheap.
void BpeTokenizer::merge_word(std::vector<uint32_t>& symbol, std::vector<uint32_t>& out) const {
  const size_t n = symbol.size();
  if (n == 0) return;
  std::vector<int64_t> prev(n);
  std::vector<int64_t> next(n);
  for (size_t i = 0; i < n; ++i) {
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

// Calls plain(begin, end) for each stretch of `text` between the matcher's added tokens and
// appends each token's id in order (lstrip/rstrip take the whitespace around a token with it).
template <typename Plain>
void BpeTokenizer::split_added(const AddedMatcher& matcher, std::string_view text, Plain&& plain,
                               EncodeState& state) const {
  if (matcher.tokens.empty()) {
    plain(size_t{0}, text.size());
    return;
  }
  size_t stretch_start = 0;
  size_t at = 0;
  while (at < text.size() && state.status.ok()) {
    const AddedToken* found = matcher.match(text, at);
    if (found == nullptr) {
      ++at;
      continue;
    }
    size_t begin = at;
    size_t end = at + found->match_content.size();
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    if (found->lstrip)
      while (begin > stretch_start && is_space(text[begin - 1])) --begin;
    if (found->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    plain(stretch_start, begin);
    state.ids->push_back(found->id);
    stretch_start = at = end;
  }
  if (state.status.ok()) plain(stretch_start, text.size());
}

// One stretch of the raw text between added tokens: normalized, split by the normalized added
// tokens, pre-tokenized.
void BpeTokenizer::encode_stretch(EncodeState& state, std::string_view stretch, uint64_t raw_begin) const {
  if (stretch.empty() || !state.status.ok()) return;
  if (!normalizer_) {
    state.text_start = raw_begin == 0 ? stretch.data() : nullptr;
    state.progress_buffer = stretch.data();
    state.progress_raw_begin = raw_begin;
    state.progress_scale = 1.0;
    pre_tokenize(state, 0, stretch);
    report(state, raw_begin + stretch.size());
    return;
  }
  std::string normalized;
  if (Status status = normalizer_->apply(stretch, normalized); !status.ok()) {
    state.status = status;
    state.status.error().message = fmt::format("{}: key 'normalizer': {}", source_name_, status.error().message);
    return;
  }
  state.progress_buffer = normalized.data();
  state.progress_raw_begin = raw_begin;
  state.progress_scale = normalized.empty() ? 1.0 : static_cast<double>(stretch.size()) / static_cast<double>(normalized.size());
  std::string_view view(normalized);
  split_added(normalized_added_, view, [&](size_t begin, size_t end) {
    if (begin == end) return;
    state.text_start = raw_begin == 0 && begin == 0 ? normalized.data() : nullptr;
    pre_tokenize(state, 0, view.substr(begin, end - begin));
  }, state);
  state.progress_buffer = nullptr;
  report(state, raw_begin + stretch.size());
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
  state.progress = progress ? &progress : nullptr;
  state.next_progress_bytes = kProgressEveryBytes;
  split_added(raw_added_, text, [&](size_t begin, size_t end) { encode_stretch(state, text.substr(begin, end - begin), begin); },
              state);
  if (progress && state.status.ok()) progress(text.size());
  return state.status;
}

std::optional<uint32_t> BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& added : added_)
    if (added.content == token) return added.id;
  if (auto it = id_of_bytes_.find(token); it != id_of_bytes_.end()) return it->second;
  return std::nullopt;
}

Result<std::string> BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::vector<std::string> tokens;  // char-level: the strings the decoder chain maps to text
  std::string text;                 // byte-level: the bytes themselves
  for (uint32_t id : ids) {
    if (id >= vocab_size_)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("token id {} is outside the vocabulary of {} ({})", id, vocab_size_, source_name_));
    const std::string* piece = nullptr;
    if (id < added_index_of_id_.size() && added_index_of_id_[id] >= 0) piece = &added_[added_index_of_id_[id]].content;
    else if (id < id_assigned_.size() && id_assigned_[id]) piece = &bytes_of_id_[id];
    else
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("token id {} is a hole in the vocabulary of {}", id, source_name_));
    if (char_level_) tokens.push_back(*piece);
    else text += *piece;
  }
  if (!char_level_) return text;
  return decoder_->decode(std::move(tokens));
}

// ---- loading --------------------------------------------------------------------------------

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

Status parse_pre_tokenizer_step(const Loader& loader, const json& node, const std::string& key, BpeTokenizer& bpe) {
  if (!node.is_object()) return loader.error(key, fmt::format("is a {}, not an object", type_name(node)));
  auto type = node.find("type");
  if (type == node.end() || !type->is_string()) return loader.error(key + ".type", "is missing or not a string");
  const std::string type_string = type->get<std::string>();
  PreTokenizerStep step;
  if (type_string == "ByteLevel") {
    step.kind = StepKind::byte_level;
    STRATA_ASSIGN_OR_RETURN(step.add_prefix_space, optional_bool(loader, node, "add_prefix_space", key, false));
    STRATA_ASSIGN_OR_RETURN(bool use_regex, optional_bool(loader, node, "use_regex", key, true));
    if (use_regex) {
      STRATA_ASSIGN_OR_RETURN(Pcre2Code code, compile_regex(loader, key, kGpt2Pattern, false));
      step.regex = code.get();
      bpe.codes_.push_back(std::move(code));
    }
  } else if (type_string == "Split") {
    step.kind = StepKind::split;
    STRATA_ASSIGN_OR_RETURN(Pattern pattern, parse_pattern(loader, node, key));
    STRATA_ASSIGN_OR_RETURN(Pcre2Code code, compile_regex(loader, key + ".pattern", pattern.text, pattern.literal));
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
  } else if (type_string == "Metaspace") {
    step.kind = StepKind::metaspace;
    step.replacement = std::string(kMetaspace);
    if (node.contains("replacement")) {
      STRATA_ASSIGN_OR_RETURN(step.replacement, required_string(loader, node, "replacement", key));
      if (!is_one_character(step.replacement) || step.replacement == " ")
        return loader.error(key + ".replacement", "must be one character other than a space");
    }
    auto scheme = node.find("prepend_scheme");
    if (scheme != node.end()) {
      if (*scheme == "always") step.prepend = PrependScheme::always;
      else if (*scheme == "first") step.prepend = PrependScheme::first;
      else if (*scheme == "never") step.prepend = PrependScheme::never;
      else return loader.error(key + ".prepend_scheme", fmt::format("{} is not always, first or never", scheme->dump()));
    } else {  // the older form says add_prefix_space
      STRATA_ASSIGN_OR_RETURN(bool prefix, optional_bool(loader, node, "add_prefix_space", key, true));
      step.prepend = prefix ? PrependScheme::always : PrependScheme::never;
    }
    STRATA_ASSIGN_OR_RETURN(step.split, optional_bool(loader, node, "split", key, true));
    bpe.boundary_ = step.replacement;
  } else if (type_string == "Whitespace" || type_string == "WhitespaceSplit" || type_string == "Digits" ||
             type_string == "Punctuation") {
    step.kind = StepKind::split;
    std::string pattern;
    if (type_string == "Whitespace" || type_string == "WhitespaceSplit") {  // keep the matches only
      pattern = type_string == "Whitespace" ? kWhitespacePattern : kWhitespaceSplitPattern;
      step.behavior = SplitBehavior::removed;
      step.invert = true;
    } else if (type_string == "Digits") {  // each digit alone, or runs of them (Contiguous)
      STRATA_ASSIGN_OR_RETURN(bool individual, optional_bool(loader, node, "individual_digits", key, false));
      pattern = individual ? R"(\p{N})" : R"(\p{N}+)";
    } else {
      std::string behavior = "Isolated";
      if (node.contains("behavior")) {
        STRATA_ASSIGN_OR_RETURN(behavior, required_string(loader, node, "behavior", key));
      }
      pattern = kPunctuationClass;
      if (behavior == "Contiguous") pattern += "+";
      else if (behavior == "Removed") step.behavior = SplitBehavior::removed;
      else if (behavior != "Isolated")
        return loader.error(key + ".behavior", fmt::format("'{}' is not supported (Isolated, Contiguous or Removed)",
                                                           behavior.substr(0, 40)));
    }
    STRATA_ASSIGN_OR_RETURN(Pcre2Code code, compile_regex(loader, key, pattern, false));
    step.regex = code.get();
    bpe.codes_.push_back(std::move(code));
  } else {
    return loader.error(key + ".type", fmt::format("'{}' is not supported (ByteLevel, Split, Metaspace, Whitespace, "
                                                   "WhitespaceSplit, Digits, Punctuation, or a Sequence of them)",
                                                   type_string.substr(0, 40)));
  }
  bpe.steps_.push_back(std::move(step));
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

bool has_byte_level_step(const json& pre) {
  if (!pre.is_object()) return false;
  auto type = pre.find("type");
  if (type == pre.end() || !type->is_string()) return false;
  if (*type == "ByteLevel") return true;
  if (*type != "Sequence") return false;
  auto steps = pre.find("pretokenizers");
  return steps != pre.end() && steps->is_array() &&
         std::any_of(steps->begin(), steps->end(), [](const json& step) { return has_byte_level_step(step); });
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

  if (auto normalizer = root.find("normalizer"); normalizer != root.end() && !normalizer->is_null()) {
    STRATA_ASSIGN_OR_RETURN(Normalizer parsed, Normalizer::parse(loader, *normalizer, "normalizer"));
    bpe->normalizer_ = std::make_unique<Normalizer>(std::move(parsed));
  }

  // --- pre-tokenizer: a ByteLevel step makes the alphabet byte-level ---
  auto pre = root.find("pre_tokenizer");
  if (pre != root.end() && !pre->is_null()) {
    if (!pre->is_object()) return loader.error("pre_tokenizer", fmt::format("is a {}, not an object", type_name(*pre)));
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
  }
  bpe->char_level_ = pre == root.end() || !has_byte_level_step(*pre);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (context == nullptr) return make_error(ErrorKind::no_space, "cannot allocate a regex match context");
  bpe->match_context_.reset(context);
  pcre2_set_match_limit(context, kMatchLimit);

  auto decoder = root.find("decoder");
  const bool byte_level_decoder = decoder != root.end() && decoder->is_object() && decoder->contains("type") &&
                                  (*decoder)["type"] == "ByteLevel";
  if (bpe->char_level_ && byte_level_decoder)
    return loader.error("pre_tokenizer", "has no ByteLevel step, but the decoder is ByteLevel (a byte-level BPE needs both)");
  if (!bpe->char_level_ && decoder != root.end() && !decoder->is_null() && !byte_level_decoder)
    return loader.error("decoder", "must be ByteLevel or null for byte-level BPE");
  if (bpe->char_level_) {
    STRATA_ASSIGN_OR_RETURN(Decoder parsed, Decoder::parse(loader, decoder == root.end() ? json() : *decoder, "decoder"));
    bpe->decoder_ = std::make_unique<Decoder>(std::move(parsed));
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
      return loader.error(std::string("model.") + unsupported, "is not supported");
  }
  if (auto dropout = model->find("dropout"); dropout != model->end() && !dropout->is_null()) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0)
      return loader.error("model.dropout", fmt::format("{} is not supported (null or 0: encoding is deterministic)",
                                                       dropout->dump()));
  }
  // Byte-level BPE covers every byte itself: byte_fallback changes nothing there.
  STRATA_ASSIGN_OR_RETURN(bpe->byte_fallback_, optional_bool(loader, *model, "byte_fallback", "model", false));
  STRATA_ASSIGN_OR_RETURN(bpe->fuse_unk_, optional_bool(loader, *model, "fuse_unk", "model", false));
  STRATA_ASSIGN_OR_RETURN(bpe->ignore_merges_, optional_bool(loader, *model, "ignore_merges", "model", false));
  std::string unk_token;
  if (auto unk = model->find("unk_token"); unk != model->end() && !unk->is_null()) {
    if (!unk->is_string()) return loader.error("model.unk_token", fmt::format("is a {}, not a string", type_name(*unk)));
    unk_token = unk->get<std::string>();
  }

  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object() || vocab->empty())
    return loader.error("model.vocab", "is missing, empty or not an object of token → id");
  const std::unordered_map<uint32_t, uint8_t> inverse = code_point_to_byte();
  // What decode and encode see of a vocab key or added content: raw bytes (byte-level keys
  // unmapped from GPT-2's alphabet) or the text itself.
  auto raw_of = [&](const std::string& key) { return bpe->char_level_ ? key : unmap_bytes(key, inverse); };
  std::unordered_map<std::string, uint32_t> id_of_mapped;  // the merges name tokens as the vocab spells them
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
    bpe->bytes_of_id_[id] = raw_of(it.key());
    id_of_mapped.emplace(it.key(), id);
    bpe->id_of_bytes_.emplace(bpe->bytes_of_id_[id], id);
    max_id = std::max(max_id, id);
  }
  if (!bpe->char_level_) {
    std::array<uint32_t, 256> forward = byte_to_code_point();
    for (uint32_t byte = 0; byte < 256; ++byte) {
      std::string symbol;
      append_utf8(symbol, forward[byte]);
      auto it = id_of_mapped.find(symbol);
      if (it == id_of_mapped.end())
        return loader.error("model.vocab", fmt::format("lacks the byte-level symbol '{}' for byte 0x{:02x} (every byte "
                                                       "needs one, or some text could not be encoded)", symbol, byte));
      bpe->byte_id_[byte] = it->second;
    }
  } else {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      auto it = id_of_mapped.find(fmt::format("<0x{:02X}>", byte));
      bpe->byte_fallback_id_[byte] = it == id_of_mapped.end() ? -1 : static_cast<int64_t>(it->second);
    }
    if (bpe->byte_fallback_ && std::all_of(bpe->byte_fallback_id_.begin(), bpe->byte_fallback_id_.end(),
                                           [](int64_t id) { return id < 0; }))
      return loader.error("model.byte_fallback", "is true but model.vocab holds none of the byte tokens <0x00> … <0xFF>");
    if (!unk_token.empty()) {
      auto it = id_of_mapped.find(unk_token);
      if (it == id_of_mapped.end())
        return loader.error("model.unk_token", fmt::format("'{}' is not in model.vocab", unk_token.substr(0, 40)));
      bpe->unk_id_ = it->second;
    }
    // Words may be cut at the boundary character when no entry holds it after another
    // character (entries are ▁*[^▁]*) and it is itself an entry (so unknown runs stop there).
    const std::string& b = bpe->boundary_;
    bool cuttable = !bpe->ignore_merges_ && id_of_mapped.count(b) != 0;
    for (auto it = id_of_mapped.begin(); cuttable && it != id_of_mapped.end(); ++it) {
      const std::string& entry = it->first;
      size_t at = 0;
      while (entry.compare(at, b.size(), b) == 0) at += b.size();
      cuttable = entry.find(b, at) == std::string::npos;
    }
    bpe->split_at_boundaries_ = cuttable;
  }

  auto merges = model->find("merges");
  if (merges == model->end() || !merges->is_array()) return loader.error("model.merges", "is missing or not an array");
  bpe->merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& merge = (*merges)[rank];
    std::string key = fmt::format("model.merges[{}]", rank);
    std::string left, right;
    if (merge.is_string()) {  // "a b": the tokens hold no space (byte-level writes Ġ, SentencePiece ▁)
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
      STRATA_ASSIGN_OR_RETURN(token.normalized, optional_bool(loader, entry, "normalized", key, !token.special));
      STRATA_ASSIGN_OR_RETURN(token.single_word, optional_bool(loader, entry, "single_word", key, false));
      STRATA_ASSIGN_OR_RETURN(token.lstrip, optional_bool(loader, entry, "lstrip", key, false));
      STRATA_ASSIGN_OR_RETURN(token.rstrip, optional_bool(loader, entry, "rstrip", key, false));
      token.match_content = token.content;
      if (token.normalized && bpe->normalizer_) {  // matched as the normalizer writes it
        if (Status status = bpe->normalizer_->apply(token.content, token.match_content); !status.ok())
          return loader.error(key + ".content", status.error().message);
        if (token.match_content.empty()) return loader.error(key + ".content", "normalizes to nothing");
      }
      if (token.id < bpe->id_assigned_.size() && bpe->id_assigned_[token.id] &&
          bpe->bytes_of_id_[token.id] != raw_of(token.content))
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
  bpe->vocab_size_ = max_id + 1;
  bpe->added_index_of_id_.assign(bpe->vocab_size_, -1);
  for (size_t i = 0; i < bpe->added_.size(); ++i) {
    const AddedToken& token = bpe->added_[i];
    bpe->added_index_of_id_[token.id] = static_cast<int32_t>(i);
    // Without a normalizer both sides see the same text: match everything on the raw side.
    AddedMatcher& matcher = token.normalized && bpe->normalizer_ ? bpe->normalized_added_ : bpe->raw_added_;
    matcher.tokens.push_back(&token);
    matcher.first_byte[static_cast<uint8_t>(token.match_content[0])] = true;
    if (bos_content && token.content == *bos_content) bpe->bos_id_ = token.id;
    if (eos_content && token.content == *eos_content) bpe->eos_id_ = token.id;
  }
  for (AddedMatcher* matcher : {&bpe->raw_added_, &bpe->normalized_added_})
    std::stable_sort(matcher->tokens.begin(), matcher->tokens.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->match_content.size() > b->match_content.size();
    });
  if (bos_content && !bpe->bos_id_)
    return loader.error("post_processor", fmt::format("names the special token '{}', which added_tokens lacks",
                                                      bos_content->substr(0, 40)));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

}  // namespace strata::tokenizer
