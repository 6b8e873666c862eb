// strata/data/token_stream.h — the training token stream and its fixed batch order.
//
// Formats: `text-bytes` (every byte is a token, vocab 256), `tokens-u16` and `tokens-u32`
// (little-endian token ids, as `strata tokenize` writes them) — mapped read-only, nothing copied
// up front — and `text` (UTF-8 text encoded once at open by a tokenizer, docs/tokenizers.md;
// the ids live in memory, 4 bytes a token).
// Order, fixed so runs are comparable and a resumed run continues exactly: row b of step s
// reads the window starting at token ((s·B + b)·T) mod (N − T − 1); inputs are the T tokens
// from there, targets the next T (shifted by one).
// Thread-safety: const after open; `fill_batch` may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata {

// The last three are fine-tuning examples (data/examples.h), not a token stream: TokenData
// refuses them; the trainer reads them through data::Batches.
enum class DataFormat : uint8_t { text_bytes, tokens_u16, tokens_u32, text, completion, chat, examples };
constexpr bool is_example_format(DataFormat format) {
  return format == DataFormat::completion || format == DataFormat::chat || format == DataFormat::examples;
}

class TokenData {
 public:
  // Refuses files shorter than one window (T + 2 tokens) and ids outside [0, vocab_size); for
  // `text`, a tokenizer (at `tokenizer_path`) whose vocabulary vocab_size does not cover.
  [[nodiscard]] static Result<TokenData> open(const std::string& path, DataFormat format,
                                              uint32_t vocab_size, uint32_t window_tokens,
                                              const std::string& tokenizer_path = {});
  TokenData(TokenData&&) noexcept;
  TokenData& operator=(TokenData&&) noexcept;
  TokenData(const TokenData&) = delete;
  ~TokenData();

  uint64_t token_count() const { return token_count_; }
  // From now on the stream is tokens [first, first + count) of the file (eval.split: training
  // keeps the head, evaluation the tail); index 0 is `first`. Refuses a range shorter than one
  // window (T + 2 tokens), naming `what` (the config key that asked for it).
  [[nodiscard]] Status keep_range(uint64_t first, uint64_t count, const std::string& what);
  uint32_t token(uint64_t index) const;
  // inputs/targets: batch_size × window_tokens ids each, row-major.
  void fill_batch(uint64_t step, uint32_t batch_size, int32_t* inputs, int32_t* targets) const;
  // Where row `row`'s tokens start in a batch: 64-bit, since batch_size × seq_len reaches
  // 2^32 within the accepted config range (a 32-bit product would wrap and overwrite row 0).
  static constexpr uint64_t row_offset(uint32_t row, uint32_t window_tokens) {
    return uint64_t{row} * window_tokens;
  }

 private:
  TokenData() = default;
  const uint8_t* bytes_ = nullptr;  // mapped file, or owned_ids_'s bytes for `text`
  std::vector<uint32_t> owned_ids_;
  uint64_t mapped_bytes_ = 0;
  uint64_t token_count_ = 0;
  uint64_t first_token_ = 0;  // keep_range's first token in the file
  DataFormat format_ = DataFormat::text_bytes;
  uint32_t window_tokens_ = 0;
};

}  // namespace strata
