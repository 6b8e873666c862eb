// strata/engine/tokenizer/tokenizer.h — text to token ids and back.
//
// Two kinds behind one interface:
//  - byte-level BPE from a Hugging Face `tokenizer.json` (GPT-2, Llama-3, and the models that
//    share their shape): added tokens are matched first, on the raw text; the pre-tokenizer's
//    Unicode regex runs through PCRE2 (UTF + UCP, JIT); each piece's bytes are mapped to
//    GPT-2's byte alphabet and merged by rank, lowest rank first, leftmost on ties.
//  - SentencePiece `tokenizer.model` through libsentencepiece.
// Loading is strict: a malformed or unsupported file is refused with one `invalid_argument`
// error naming the file and the key ("tok.json: key 'model.merges[12]': ..."); nothing that
// loads is guessed. Supported tokenizer.json shape: model.type BPE (vocab; merges as "a b"
// strings or [a, b] pairs; ignore_merges), normalizer null, pre_tokenizer ByteLevel or a
// Sequence of Split (Regex or String pattern, behavior Isolated or Removed) and ByteLevel,
// decoder ByteLevel or null. Anything else (normalizers, byte_fallback, WordPiece...) is
// refused by name.
// Ownership: a Tokenizer owns its tables and compiled regexes; load once, share by reference.
// Threads: every const method may run on any number of threads at once (the BPE word cache
// takes a mutex; regex match data is per call).
// Text: encode takes UTF-8 and refuses invalid UTF-8 with the byte offset; decode returns the
// bytes the ids stand for (a slice of ids may end inside a multi-byte character).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::tokenizer {

// Called now and then during a long encode with the bytes of input consumed so far.
using ProgressFn = std::function<void(uint64_t done_bytes)>;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `ids`. No BOS/EOS is added (the caller frames documents).
  [[nodiscard]] virtual Status encode_into(std::string_view text, std::vector<uint32_t>& ids,
                                           const ProgressFn& progress = {}) const = 0;
  [[nodiscard]] Result<std::vector<uint32_t>> encode(std::string_view text) const;
  // Refuses an id outside the vocabulary (or a hole in it).
  [[nodiscard]] virtual Result<std::string> decode(std::span<const uint32_t> ids) const = 0;

  // One more than the largest id encode can produce (added tokens included).
  virtual uint32_t vocab_size() const = 0;
  virtual std::optional<uint32_t> bos_id() const = 0;
  virtual std::optional<uint32_t> eos_id() const = 0;
  virtual const char* kind() const = 0;  // "bpe" | "sentencepiece"
};

// Picks the kind: a folder holding tokenizer.json (preferred) or tokenizer.model; a file
// ending in .json is BPE, .model SentencePiece; otherwise a file starting with '{' is BPE.
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path);

// A tokenizer.json's text; `source_name` is what errors call it. For tests and fuzzing.
constexpr uint64_t kMaxTokenizerJsonBytes = 256ull << 20;
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> parse_bpe_json(std::string_view json_text,
                                                                 const std::string& source_name);
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path);

// Where `text` stops being well-formed UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF are ill-formed), or nullopt when all of it is well-formed.
std::optional<uint64_t> first_invalid_utf8(std::string_view text);

}  // namespace strata::tokenizer
