// strata/run/train_config.h — the `strata train` configuration.
//
// Contract: `load_train_config` reads and validates the whole YAML file before any work
// starts. Every key is checked by the strict reader (unknown keys, wrong types and
// out-of-range values name the key, the file and what is accepted); then the checks that
// span keys: n_embd divisible by n_head, the data file long enough for one window, the NVMe
// paths present, every placement a tier the run has. Paths are resolved against the config
// file's folder. Pure data afterwards; copy freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config_reader.h"
#include "common/dtype.h"
#include "common/status.h"
#include "data/token_stream.h"
#include "io/io_config.h"
#include "memory/store.h"
#include "memory/tier.h"
#include "optim/state.h"

namespace strata {

// The tiers are memory/'s (tier.h): one enum and one set of names for the whole engine.
using memory::Tier;
using memory::tier_name;

// Llama 3's `rope_scaling` (rope_type "llama3"): long wavelengths divided by `factor`, short
// ones kept, a smooth blend between (Hugging Face's _compute_llama3_parameters).
struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  uint32_t original_max_position_embeddings = 8192;
};

// `adapter:` — LoRA adapters over a frozen base (docs/lora.md; PEFT's LoraConfig semantics).
// Part of the model's shape: the adapters are units of their own (models/model_layout.h), the
// base's units are frozen — read, never written, with no gradient or optimizer state.
enum class BaseDType : uint8_t { fp32, bf16, int8, nf4 };
const char* base_dtype_name(BaseDType dtype);  // "fp32", "bf16", "int8", "nf4"
struct AdapterConfig {
  bool enabled = false;          // adapter.kind: lora
  uint32_t rank = 8;             // r
  double alpha = 8.0;            // lora_alpha; scale = alpha / r (alpha / sqrt(r) with rslora)
  double dropout = 0.0;          // lora_dropout, on the adapter's input only
  bool rslora = false;           // use_rslora
  // The linears adapted, by module name as in the HF checkpoint (PEFT's target_modules: a name
  // matches every linear whose name ends with it, so GPT-2's c_proj is both attn.c_proj and
  // mlp.c_proj). Default PEFT's for the architecture: Llama q_proj, v_proj; GPT-2 c_attn.
  std::vector<std::string> targets;
  BaseDType base_dtype = BaseDType::bf16;  // the frozen base's storage (default: the precision's)
  bool double_quant = false;     // nf4: the absmax quantised again (QLoRA's double quantisation)
  std::string init;              // a PEFT adapter folder to start from; empty: A Kaiming-uniform, B zero
  double scale() const;
};

// The architecture and shape. GPT-2 reads n_layer, n_head, n_embd, vocab_size, seq_len; Llama
// (Llama 2/3, Mistral, Qwen share the shape) and Gemma also read the keys below the line (Gemma
// without biases, fused projections, a window or rope scaling). Names follow the YAML keys; the
// Hugging Face config.json names are in docs/models.md.
struct ModelConfig {
  std::string arch = "gpt2";  // a row of models/architectures.h: gpt2 | llama | gemma
  uint32_t n_layer = 6;
  uint32_t n_head = 6;
  uint32_t n_embd = 384;
  uint32_t vocab_size = 256;
  uint32_t seq_len = 128;
  std::string init = "random";  // "random", or a GPT-2 .safetensors path
  uint64_t seed = 1;
  // GPT-2's initializer range: N(0, 0.02), residual projections scaled by 1/sqrt(2·n_layer).
  double init_std = 0.02;
  // --- Llama and Gemma ---
  uint32_t n_kv_head = 0;          // num_key_value_heads (grouped-query attention); 0: n_head
  uint32_t head_dim = 0;           // 0: n_embd / n_head
  uint32_t intermediate_size = 0;  // the gated MLP's width (SwiGLU; Gemma's GeGLU)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double norm_eps = 1.0e-5;        // rms_norm_eps (GPT-2's LayerNorm keeps its 1e-5)
  bool tie_word_embeddings = true; // lm_head shares embed_tokens
  // Attention biases (models/llama_shape.h): q/k/v (Qwen 2 / 2.5 always; HF Llama's
  // attention_bias), and o_proj's (HF Llama's attention_bias only; never without q/k/v).
  bool qkv_bias = false;
  bool o_proj_bias = false;
  // How a Hugging Face checkpoint stores the projections (the math is Llama's either way):
  // Phi-3 fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, stacked along rows.
  bool fused_projections = false;
  // A checkpoint's sliding window (Mistral, Phi-3), in tokens; 0: none. strata's attention is
  // full causal, which equals a window of W tokens exactly while seq_len ≤ W: the one rule.
  uint32_t attention_window = 0;

  AdapterConfig adapter;  // `adapter:` (top-level in the YAML)

  // Whether the architecture is a RoPE decoder with the keys below the line (llama, gemma): the
  // one test every reader and writer of those keys makes.
  // (The architecture's row says: models/architectures.h.)
  bool decoder_keys() const;
  uint32_t kv_heads() const { return n_kv_head == 0 ? n_head : n_kv_head; }
  uint32_t head_size() const { return head_dim == 0 ? n_embd / n_head : head_dim; }
};

struct OptimizerConfig {
  // Which optimizer (optimizer.kind: adamw | adamw8bit), and so its state layout
  // (optim/state.h): what a chunk of it weighs, how it is packed and where it may be cut.
  // `rules` are adamw8bit's (optimizer.block_size, min_8bit_size, embedding_state).
  optim::Kind kind = optim::Kind::adamw;
  optim::EightBitRules rules;
  optim::StateLayout state() const { return optim::StateLayout(kind, rules); }
  double lr = 3.0e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  // Optimizer state (fp32 master, first and second moment) travels in chunks of at most this
  // many elements, each chunk one store tensor (packed as state() says): the update of a big
  // unit (GPT-2 XL's 80 M-parameter embeddings) then streams through the device a piece at a
  // time instead of needing 1 GB of it at once, and the read of one chunk overlaps the update
  // of the one before. A store records it (metadata `optim_chunk_elements`). When the config
  // does not set it, it is chosen from the budgets (chunk_elements_for_budgets): a fixed 16 Mi
  // elements is 192 MiB per chunk, a whole 192 MiB host budget, so nothing could be read ahead.
  uint64_t chunk_elements = uint64_t{16} << 20;
  bool chunk_elements_set = false;  // the config gave optimizer.chunk_elements
  // With clipping, run step k's updates in step k+1's pass, each unit's just before its
  // forward, so their I/O hides under compute (run/train_plan.h). Same weights either way;
  // false keeps every update after the last backward (the tests compare the two).
  bool interleave = true;
};

// `schedule:` — the learning rate of each update, Hugging Face's schedules step for step
// (train/lr_schedule.h has the formulas; docs/train.md "schedule").
enum class LrDecay : uint8_t { constant, linear, cosine };
struct ScheduleConfig {
  bool enabled = false;       // the config has a schedule block; false: optimizer.lr at every step
  uint64_t warmup_steps = 0;  // W: the lr rises linearly from 0 over updates 0 .. W-1
  LrDecay decay = LrDecay::constant;
  double min_lr_ratio = 0.0;  // r: linear and cosine decay to r·lr instead of 0
};

struct PlacementConfig {
  Tier params = Tier::nvme;     // the compute copy (bf16 or fp32) of every weight
  Tier grads = Tier::host;      // where gradients wait for their update
  Tier optimizer = Tier::nvme;  // fp32 master weights and both moments
};

// ZeRO data parallelism over the ranks `mpirun -np N` starts (train/zero/zero.h, docs/parallel.md).
struct ParallelConfig {
  uint32_t zero_stage = 1;   // 1: optimizer state partitioned; 2: + gradients; 3: + parameters
  double timeout_s = 120.0;  // a collective waiting longer means a rank was lost: exit, no hang
};

// Fine-tuning data (data.format completion | chat | examples; data/examples.h, docs/data.md).
struct ExampleDataConfig {
  bool train_on_input = false;  // train on prompts and user turns too (completion, chat)
  bool skip_bad_lines = false;  // count and skip bad JSONL lines instead of refusing the file
  bool packing = false;         // several examples a row (positions and segments keep them apart)
  bool truncate = false;        // cut examples longer than seq_len + 1 tokens, else refuse them
};

// `eval:` — the loss on held-out data every `every` updates, with no update and no optimizer I/O
// (train/trainer.h "Evaluation", docs/train.md "eval"); `checkpoint: {keep_best: true}` keeps
// the weights of the best evaluation beside the latest commit.
struct EvalConfig {
  bool enabled = false;     // the config has an eval block
  std::string path;         // held-out data in data.format (and data.tokenizer), or
  double split = 0.0;       // the fraction of data.path held out: examples by a seeded draw, a token stream its tail
  uint64_t every = 0;       // updates between evaluations (each right after a commit); 0: checkpoint_every
  uint64_t batches = 0;     // batches of batch_size rows an evaluation; 0: every held-out row once
  bool keep_best = false;   // checkpoint.keep_best: the best evaluation's weights in <store>/best
};

struct TrainConfig {
  std::string source_path;
  ModelConfig model;
  std::string data_path;
  DataFormat data_format = DataFormat::text_bytes;
  std::string data_tokenizer;  // data.format text, completion, chat: tokenizer.json / tokenizer.model (or its folder)
  ExampleDataConfig examples;
  uint32_t batch_size = 8;
  // K micro-batches of batch_size rows per update: their gradients add up, the loss is divided
  // by the trained tokens of all K, and the optimizer runs once (docs/train.md).
  uint32_t gradient_accumulation_steps = 1;
  uint64_t steps = 200;  // updates
  // epochs: the alternative to steps for example formats — steps = ceil(rows · epochs / global
  // batch rows · K), known once the data is read (TrainBatches::total_steps). 0: steps rules.
  uint64_t epochs = 0;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DType precision = DType::bf16;  // fp32, or bf16 weights with fp32 accumulate and master
  std::string device_kind = "cpu";  // cpu | cuda | emulated (device/device.h)
  uint64_t device_memory_bytes = 256ull << 20;
  uint64_t host_memory_bytes = 512ull << 20;
  std::vector<std::string> nvme_paths;  // the store lives in the first; one file per path; {rank}: per rank
  io::IoSettings io;
  // nvme.verify_reads: hash every read extent (always), or each only until the store has seen it
  // intact once in this process (once) — memory/store.h.
  memory::VerifyReads verify_reads = memory::VerifyReads::always;
  PlacementConfig placement;
  ParallelConfig parallel;
  uint64_t checkpoint_every = 10;
  EvalConfig eval;
  std::string sample_prompt = "The ";  // printed sample after training
  uint32_t sample_tokens = 0;          // 0: no sample
  // monitor.serve: where `strata train` serves /metrics and the dashboard (HOST:PORT, :PORT or
  // PORT; loopback unless a host is given); empty: not served. `--serve` overrides it.
  std::string monitor_serve;
};

[[nodiscard]] Result<TrainConfig> load_train_config(const std::string& path);
[[nodiscard]] Result<TrainConfig> parse_train_config(ConfigNode root);
// optimizer.chunk_elements when the config does not set it: a power of two near a sixteenth of
// the memory chunks stream through (host + device on the CPU device, else the smaller budget)
// over 12 bytes an element, within 64 Ki … 16 Mi elements.
uint64_t chunk_elements_for_budgets(const TrainConfig& config);
// The tokenizer of the run's text: data.tokenizer, else a tokenizer.json / tokenizer.model in the
// Hugging Face folder model.init names; "" when there is none (bytes). Training records it in
// its commits (run/run_store.h), generation loads it (generate/generate.h make_codec).
std::string tokenizer_path_for(const TrainConfig& config);

}  // namespace strata
