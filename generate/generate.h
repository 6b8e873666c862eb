// strata/generate/generate.h — `strata generate`: sampling from committed weights that stream
// from the NVMe store through the prefetch scheduler, within the config's byte budgets.
//
// How a pass runs. The model's compute copies (the store's `params.<unit>` tensors, bf16 or
// fp32 as the run's precision) form an access plan of L + 2 steps over the model definition's
// units (models/model.h) — embed, one per block, head (the final unit, and the embedding
// when the head is tied) — that repeats once per pass; the definition's decode ops run each
// step, so GPT-2 and Llama share this one path: the prompt is one pass (all its
// tokens at once), each sampled token one more. The scheduler prefetches and evicts within the
// host (and device) budget exactly as in training, so a model larger than the host budget is
// read from NVMe every pass, and the I/O floor of a token is the bytes of its weights ÷ the
// tuned read bandwidth. Every block keeps a KV cache (keys and values of every position so
// far, fp32, its k/v heads only: kv_cache_width per position), so a token costs one pass over
// the weights, not one per position. The window is the model's seq_len (GPT-2's learned
// positions end there; Llama's RoPE does not, but the cache is sized for it): when it is full,
// its last half is encoded again as a new prompt at positions 0….
//
// Memory (the one pool rule, run/budgets.h): the scheduler's pool is host.memory
// (+ device.memory on the CPU device) less the fixed scratch — the KV cache, two activation
// buffers, the bf16 decode ops' scratch (the backend's size: ~1 MiB on the CPU, which multiplies
// bf16 weights without widening a unit whole), the decode workspace and the logits — which is
// allocated once at start; nothing grows per token. A config whose budgets cannot hold the
// scratch and the largest step is refused naming both.
//
// An adapter store (LoRA, docs/lora.md): the passes run over the frozen base's units, in
// adapter.base_dtype, with every block's adapters folded in at load (W + scale·B·A by the merged
// export's fold, models/lora_fold.h, as each block's read completes) — so its tokens are those of
// its --export-merged folder staged in the base's dtype. The adapters' fp32 masters are read once
// at start and held in host memory out of the pool, as the embedding-rows buffers are. An int8 /
// NF4 base generates at bf16: each block is read quantised, dequantised into a start-up fp32
// buffer (one block, also out of the pool), folded and rounded to bf16 in its pool buffer (which
// the plan sizes for the bf16 block) — the merged export staged at bf16, bit for bit.
//
// Sampling: greedy at temperature 0; otherwise softmax(logits / T), cut to the smallest set of
// most likely tokens whose probability reaches top_p (1: all), drawn with a std::mt19937_64
// seeded by `seed` — the same seed gives the same tokens.
//
// The text seam: a TokenCodec turns the prompt into token ids and ids back into text: the byte
// codec (text-bytes vocabularies) or a tokenizer (text/, TokenizerCodec); the
// sampled text is decoded once, all tokens together, so a character split across tokens is whole.
//
// Threads: one call on one thread; compute fans out through TBB, the scheduler runs its own.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "common/status.h"
#include "text/tokenizer.h"
#include "run/train_config.h"

namespace strata {

class TokenCodec {
 public:
  virtual ~TokenCodec() = default;
  // Token ids of `text`, each below `vocab_size` (an error naming the offending piece if not).
  [[nodiscard]] virtual Result<std::vector<int32_t>> encode(std::string_view text, uint32_t vocab_size) const = 0;
  // The text of one token (may be part of a UTF-8 character; concatenation is the output).
  virtual std::string decode(int32_t token) const = 0;
  // The text of a run of tokens: their bytes joined (a character split across tokens comes out
  // whole). By default the concatenation of decode(token).
  virtual std::string decode_all(std::span<const int32_t> tokens) const;
  // The token an empty prompt starts from: by default a newline byte (0 if the vocabulary is
  // smaller); a tokenizer's BOS when it has one.
  virtual int32_t start_token(uint32_t vocab_size) const { return vocab_size > '\n' ? '\n' : 0; }
};

// Each byte is a token (data.format: text-bytes).
class ByteCodec final : public TokenCodec {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text, uint32_t vocab_size) const override;
  std::string decode(int32_t token) const override;
};

// A tokenizer (text/: tokenizer.json BPE or SentencePiece) as the codec. Ids the
// model has but the tokenizer lacks (a vocabulary padded past the tokenizer's) print as <id>.
class TokenizerCodec final : public TokenCodec {
 public:
  explicit TokenizerCodec(std::unique_ptr<tokenizer::Tokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {}
  Result<std::vector<int32_t>> encode(std::string_view text, uint32_t vocab_size) const override;
  std::string decode(int32_t token) const override;
  std::string decode_all(std::span<const int32_t> tokens) const override;
  int32_t start_token(uint32_t vocab_size) const override;

 private:
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

// The codec of a run's text: the tokenizer at `tokenizer_path` when given (--tokenizer), else
// the config's data.tokenizer, else a tokenizer.json / tokenizer.model in the Hugging Face folder
// model.init names, else the byte codec — which only a text-bytes model may use: token data
// with no tokenizer to be found is refused, saying what to give.
[[nodiscard]] Result<std::unique_ptr<TokenCodec>> make_codec(const TrainConfig& config,
                                                              const std::string& tokenizer_path);

struct SamplingOptions {
  uint32_t tokens = 200;     // tokens to sample after the prompt
  double temperature = 0.8;  // 0: greedy
  double top_p = 1.0;        // nucleus: (0, 1]
  uint64_t seed = 1;
  bool progress = false;     // a progress line on stderr while sampling
};

struct GenerateSummary {
  std::vector<int32_t> tokens;  // the sampled tokens (not the prompt's)
  // Per sampled token: its logits' best minus second best. How close each greedy choice was,
  // so two backends' token streams can be compared with a near-tie rule (scripts/gpu-check.sh).
  std::vector<float> top2_margins;
  std::string text;             // their decoded text
  uint32_t prompt_tokens = 0;
  double prefill_seconds = 0.0;  // the prompt's pass
  double decode_seconds = 0.0;   // the sampled tokens' passes
  double tokens_per_s = 0.0;     // sampled tokens / decode_seconds
  uint64_t weight_bytes = 0;     // the compute copies of every weight: what one pass reads at most
  uint64_t nvme_read_bytes = 0;  // what the passes read from the store
  uint64_t nvme_read_trusted_bytes = 0;  // of the passes' reads: not hashed again (nvme.verify_reads: once)
  double read_busy_seconds = 0.0;  // time with at least one store read in flight
  double stall_seconds = 0.0;      // time the passes waited for weights (the scheduler's acquire)
  double read_MBps = 0.0;        // the bandwidth of the floor: tuned (nvme.io) or, untuned, this run's
  bool tuned = false;
  double io_floor_tokens_per_s = 0.0;  // read_MBps·1e6 / weight_bytes: reading the weights once per token
  uint64_t kv_cache_bytes = 0;
  uint64_t bf16_scratch_bytes = 0;  // bf16 weights: the decode ops' scratch (0 for fp32)
  uint64_t pool_bytes = 0;       // the scheduler's host budget
  uint64_t host_high_water_bytes = 0;
  uint64_t peak_rss_bytes = 0;
};

// Picks the next token from `logits` (see the contract). `order` is scratch, reused between calls.
// The best logit minus the second best (0 with fewer than two).
float top2_margin(std::span<const float> logits);
int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng,
                     std::vector<std::pair<float, int32_t>>& order);

// Samples after `prompt` from the weights committed in the config's store (a training run's, or
// weights staged by stage_hf_weights).
[[nodiscard]] Result<GenerateSummary> generate_offloaded(const TrainConfig& config, const std::string& prompt,
                                                         const SamplingOptions& options, const TokenCodec& codec);

// Samples `tokens` tokens after `prompt` from the committed weights through the run's codec
// (make_codec without an override; text-bytes vocabularies print as text), top_p 1, no
// progress line: the sample `strata train` prints after training. Temperature 0 is greedy.
[[nodiscard]] Result<std::string> generate(const TrainConfig& config, const std::string& prompt,
                                           uint32_t tokens, double temperature, uint64_t seed);

// Writes the compute copies of config.model.init (a Hugging Face folder or .safetensors file)
// into the config's store, committed, for generate_offloaded — no optimizer state. A store
// that already holds the same model's staged weights is kept (said on the log). Progress on
// stderr when `progress`.
[[nodiscard]] Status stage_hf_weights(const TrainConfig& config, bool progress);

}  // namespace strata
