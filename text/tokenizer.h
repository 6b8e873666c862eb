// strata/text/tokenizer.h — text to token ids and back.
//
// Two kinds behind one interface:
//  - BPE from a Hugging Face `tokenizer.json`, in two alphabets: byte-level (GPT-2, Llama 3,
//    Qwen 2: a ByteLevel pre-tokenizer; bytes mapped to GPT-2's byte alphabet) and
//    SentencePiece-style (Llama 2, Mistral: characters, '▁' for spaces, byte_fallback to <0xNN>
//    tokens, unk_token). Added tokens are matched first (on the raw text, or on the normalized
//    text for `normalized` ones); the normalizer (NFC/NFD/NFKC/NFKD through utf8proc, Prepend,
//    Replace, Lowercase, Strip, StripAccents, BertNormalizer, a SentencePiece Precompiled
//    charsmap, Sequence) runs on the text between them; the pre-tokenizer (Split regexes through
//    PCRE2 — UTF + UCP, JIT —, ByteLevel, Metaspace, and Whitespace, WhitespaceSplit, Digits,
//    Punctuation as the Split regexes they are) cuts it into words; each word's symbols are
//    merged by rank, lowest rank first, leftmost on ties. docs/tokenizers.md lists every key read.
//  - SentencePiece `tokenizer.model` through libsentencepiece.
// A `tokenizer_config.json` beside the tokenizer file (or in the model folder) names the BOS and
// EOS tokens and whether texts start with BOS; it wins over what the tokenizer file suggests and
// over the guess by token names (the fallback when it is absent or silent).
// Loading is strict: a malformed or unsupported file is refused with one `invalid_argument`
// error naming the file and the key ("tok.json: key 'model.merges[12]': ..."); nothing that
// loads is guessed. Anything outside the forms above (other normalizers, WordPiece, Unigram
// tokenizer.json...) is refused by name.
// Ownership: a Tokenizer owns its tables and compiled regexes; load once, share by reference.
// Threads: every const method may run on any number of threads at once (the BPE word cache
// takes a mutex; regex match data is per call).
// Text: encode takes UTF-8 and refuses invalid UTF-8 with the byte offset; decode returns the
// bytes the ids stand for (a slice of ids may end inside a multi-byte character; a run of
// byte-fallback tokens gives its bytes, where Hugging Face would print U+FFFD for a broken one).
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
  // Whether a text the model reads starts with BOS (tokenizer_config.json's add_bos_token; else
  // whenever there is a BOS). Callers frame: strata tokenize's documents, data.format text,
  // generate's prompt. EOS ends each document strata frames (add_eos_token does not change that).
  virtual bool add_bos() const { return bos_id().has_value(); }
  // The id of a token spelled as the tokenizer spells it ("<s>", "<|im_end|>"), if it has one.
  virtual std::optional<uint32_t> token_id(std::string_view token) const = 0;
  virtual const char* kind() const = 0;  // "bpe" | "sentencepiece"
};

// Picks the kind: a folder holding tokenizer.json (preferred) or tokenizer.model; a file
// ending in .json is BPE, .model SentencePiece; otherwise a file starting with '{' is BPE. Then
// reads tokenizer_config.json from the folder (or the file's folder) when there is one.
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path);

// A tokenizer.json's text; `source_name` is what errors call it. For tests and fuzzing.
constexpr uint64_t kMaxTokenizerJsonBytes = 256ull << 20;
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> parse_bpe_json(std::string_view json_text,
                                                                 const std::string& source_name);
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path);
// Wraps `inner` with a tokenizer_config.json's bos_token / eos_token / add_bos_token (its text;
// `source_name` is what errors call it). add_eos_token is checked but changes nothing (above).
[[nodiscard]] Result<std::unique_ptr<Tokenizer>> apply_tokenizer_config(std::unique_ptr<Tokenizer> inner,
                                                                        std::string_view config_text,
                                                                        const std::string& source_name);

// Where `text` stops being well-formed UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF are ill-formed), or nullopt when all of it is well-formed.
std::optional<uint64_t> first_invalid_utf8(std::string_view text);

}  // namespace strata::tokenizer
