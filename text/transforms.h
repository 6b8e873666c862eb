// strata/text/transforms.h — the text-to-text parts of a tokenizer.json around the
// BPE model: the `normalizer` (run on the text between added tokens before pre-tokenizing) and
// the `decoder` of SentencePiece-style BPE (Llama 2, Mistral: tokens back to text). Internal to
// text/; the contract of the whole is in tokenizer.h.
//
// Normalizers read: NFC, NFD, NFKC, NFKD (through utf8proc, Unicode's own tables), Prepend,
// Replace (a String pattern, or a Regex through PCRE2), Lowercase, Strip, StripAccents,
// BertNormalizer, Precompiled (a SentencePiece charsmap, CharsMap below) and Sequence of them;
// any other type is refused by key. Decoders read: Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence of
// them (ByteLevel is the byte-level tokenizer's own, in bpe.cpp).
// Ownership: each owns its compiled regexes. Threads: the const methods may run on any number of
// threads at once (match data is per call).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/internal.h"

namespace strata::tokenizer::detail {

// Replace every non-overlapping occurrence of a pattern, leftmost first (the Replace
// normalizer and the Replace decoder).
class Replacer {
 public:
  static Result<Replacer> parse(const Loader& loader, const json& node, const std::string& key);
  [[nodiscard]] Status apply(std::string_view in, std::string& out) const;

 private:
  std::string literal_;  // a String pattern; empty when regex_ is set
  Pcre2Code regex_;
  Pcre2MatchContext context_;
  std::string content_;
};

// A SentencePiece `precompiled_charsmap` (what Hugging Face's converter writes, base64, into a
// Precompiled normalizer): a little-endian u32 trie size in bytes, a Darts double-array trie of
// that many bytes (u32 units) over UTF-8 byte strings, then a pool of NUL-terminated
// replacements the trie's leaves index. The whole trie is walked once at load, so a malformed map
// (sizes past the end, a leaf's offset outside the pool or without its NUL, a cycle,
// keys deeper than kMaxKeyBytes) is refused there and a lookup never reads outside the map.
class CharsMap {
 public:
  static constexpr size_t kMaxTrieBytes = 8u << 20;  // SentencePiece's nmt_nfkc trie is ~0.2 MiB
  static constexpr size_t kMaxKeyBytes = 256;        // its longest rule is a few characters
  // `blob` is the decoded charsmap; an empty one maps nothing (Hugging Face accepts it too).
  static Result<CharsMap> parse(const Loader& loader, std::string_view blob, const std::string& key);
  // SentencePiece's normalizer: at each point the longest rule that is a prefix of the rest of
  // the text replaces it; where none is, one character is copied as it is.
  void apply(std::string_view in, std::string& out) const;

 private:
  // The byte length of the longest key that prefixes `text` (0: none) and its replacement.
  size_t longest_match(std::string_view text, std::string_view& replacement) const;
  std::vector<uint32_t> units_;
  std::string pool_;
};

class Normalizer {
 public:
  // `node` is tokenizer.json's "normalizer" (an object; null means no Normalizer at all).
  static Result<Normalizer> parse(const Loader& loader, const json& node, const std::string& key);
  // Normalizes one stretch of text between added tokens (well-formed UTF-8) into `out`.
  [[nodiscard]] Status apply(std::string_view in, std::string& out) const;

 private:
  enum class Kind : uint8_t { unicode_form, prepend, replace, lowercase, strip, strip_accents, bert, precompiled };
  struct Step {
    Kind kind = Kind::prepend;
    int utf8proc_options = 0;  // unicode_form
    std::string prepend;       // prepend
    std::unique_ptr<Replacer> replacer;
    bool left = false;   // strip: strip_left; bert: clean_text
    bool right = false;  // strip: strip_right; bert: handle_chinese_chars
    bool bert_strip_accents = false;
    bool bert_lowercase = false;
    std::unique_ptr<CharsMap> charsmap;  // precompiled
  };
  Status parse_step(const Loader& loader, const json& node, const std::string& key);
  std::vector<Step> steps_;
};

// The decoder of a SentencePiece-style (not byte-level) BPE: it maps the tokens' strings (vocab
// keys, added tokens' contents) to text as Hugging Face's decoder chain does, except that
// ByteFallback gives the bytes themselves (a run that is not UTF-8 stays raw bytes, where
// Hugging Face prints U+FFFD: strata's decode returns the bytes the ids stand for).
class Decoder {
 public:
  // `node` is tokenizer.json's "decoder"; null joins the tokens with spaces, as Hugging Face does.
  static Result<Decoder> parse(const Loader& loader, const json& node, const std::string& key);
  [[nodiscard]] Result<std::string> decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind : uint8_t { replace, byte_fallback, fuse, strip, metaspace };
  struct Step {
    Kind kind = Kind::fuse;
    std::unique_ptr<Replacer> replacer;  // replace
    std::string character;               // strip: the content; metaspace: the replacement
    uint32_t strip_start = 0;
    uint32_t strip_stop = 0;
    bool drop_first = true;  // metaspace: prepend_scheme is not "never"
  };
  Status parse_step(const Loader& loader, const json& node, const std::string& key);
  bool join_with_spaces_ = false;
  std::vector<Step> steps_;
};

}  // namespace strata::tokenizer::detail
