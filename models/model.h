// strata/models/model.h — a model is a definition, not a hard-wired GPT-2.
//
// A definition says, from a ModelConfig (its `arch`):
// - its units, the sets of tensors that travel between tiers together, always in this order:
//   the embedding (unit 0), one unit per block, and the final unit (final norm, and the LM head
//   when it is not tied to the embedding). Each unit's tensors are packed back to back in the
//   kernels' canonical order, so one unit is one store tensor per kind of state and a kernel
//   binds a packed unit as is;
// - every tensor's Hugging Face name and shape in Hugging Face's layout (GPT-2: names without
//   `transformer.`, Conv1D weights [in, out]; Llama: the full `model.…` / `lm_head.weight` names,
//   nn.Linear weights [out, in]), so reading and writing HF checkpoints is a name lookup;
// - the init rule (normal std, or a constant) and the weight-decay rule of each tensor;
// - the ops of each unit, through the compute backend (kernels/backend.h) — the trainer,
//   `strata plan`'s timing and generation call these and never a model's kernels.
// - the shape keys a store records (store_metadata) so resume, export and generate rebuild the
//   same model, and the first key in which two shapes differ.
//
// Ops take a unit's packed fp32 weights and packed fp32 gradients (the same layout); gradients
// accumulate and activation gradients are overwritten, as kernels/ops.h says. The head
// reads the final unit and the embedding unit (the tied head's weights) and, tied, adds into
// the embedding's gradients.
//
// Threads: a definition is immutable after make_model_definition; share it freely.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "run/train_config.h"
#include "kernels/backend.h"
#include "models/gpt2_shape.h"

namespace strata {

struct UnitTensor {
  std::string name;              // "h.3.attn.c_attn.weight", "model.layers.3.mlp.up_proj.weight"
  std::vector<int64_t> shape;    // Hugging Face's
  uint64_t offset_elements = 0;  // within the unit's packed buffer
  uint64_t element_count = 0;
  bool weight_decay = false;     // AdamW decays 2-D tensors only
  bool token_embedding = false;  // the token embedding (optimizer.embedding_state applies to it)
  double init_std = 0.0;         // 0: constant init_value (or uniform, below)
  float init_value = 0.0f;
  double init_bound = 0.0;       // > 0: uniform in [-bound, bound] (LoRA's A: Kaiming-uniform, a = √5)
  int adapter_linear = -1;       // an adapter unit's lora_A / lora_B: the block linear's index (BlockLinear)
};

// A run of elements within a unit's packed buffer.
struct ElementRange {
  uint64_t begin_elements = 0;
  uint64_t element_count = 0;
};

struct Unit {
  std::string name;  // "embed", "h.3" / "layers.3", "ln_f" / "norm"; adapters "lora.h.3" / "lora.layers.3"
  int64_t block_index = -1;
  std::vector<UnitTensor> tensors;
  uint64_t element_count = 0;
  // LoRA (models/model_layout.h): the base's units are frozen — read by the forward and the
  // backward, never written, with no gradient and no optimizer state; each block's adapters are
  // a unit of their own (adapter_block: the block they serve; block_index stays -1).
  bool frozen = false;
  int64_t adapter_block = -1;
};

// A block linear LoRA may adapt, in the kernels' adapter index order (kernels/lora/lora.h):
// Llama q, k, v, o, gate, up, down; GPT-2 attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
struct BlockLinear {
  int index = 0;
  std::string suffix;          // within the block, as HF names it: "self_attn.q_proj", "attn.c_attn"
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool conv1d = false;         // GPT-2's Conv1D: the base weight is [in, out] (nn.Linear's is [out, in])
  size_t weight_tensor = 0;    // its weight's index among the block unit's tensors
};

// A unit's tensors as the optimizer seam sees them (optim/state.h).
std::vector<optim::TensorSpan> optim_spans(const Unit& unit);
// A unit's optimizer chunks (see OptimizerConfig::chunk_elements): ceil(n / chunk_elements)
// ranges of near-equal size covering it, each cut moved down to where the state layout allows
// (StateLayout::snap_cut: inside an 8-bit tensor, a block boundary of it); a range that the
// snapping empties is dropped. adamw cuts anywhere, so its chunks are the near-equal ranges.
// A frozen unit (LoRA's base) has none.
std::vector<ElementRange> optim_chunks(const Unit& unit, uint64_t chunk_elements, const optim::StateLayout& state);

namespace models {

using kernels::BatchShape;
using kernels::Workspace;

class ModelDefinition {
 public:
  virtual ~ModelDefinition() = default;
  ModelDefinition(const ModelDefinition&) = delete;
  ModelDefinition& operator=(const ModelDefinition&) = delete;

  virtual const char* arch() const = 0;  // "gpt2", "llama", "gemma"
  const ModelConfig& config() const { return config_; }
  const std::vector<Unit>& units() const { return units_; }
  int64_t n_layer() const { return config_.n_layer; }
  int64_t n_embd() const { return config_.n_embd; }
  size_t embed_unit() const { return 0; }
  size_t block_unit(int64_t block_index) const { return static_cast<size_t>(block_index) + 1; }
  size_t final_unit() const { return units_.size() - 1; }
  // The linears of every block (the same in each), in adapter index order.
  const std::vector<BlockLinear>& block_linears() const { return linears_; }

  // Workspace the block and head ops need for shapes up to `max_shape`: on `backend`, or on a
  // device kind before any backend exists (planning).
  virtual size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const BatchShape& max_shape) const = 0;
  virtual size_t workspace_size_bytes(device::Kind kind, const BatchShape& max_shape) const = 0;

  // --- the ops, on the backend's stream (tokens and targets from its begin_step) ---
  [[nodiscard]] virtual Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape,
                                                 const float* embed, float* x0) const = 0;
  [[nodiscard]] virtual Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape,
                                                  const float* d_x0, float* embed_grads) const = 0;
  // `adapters`: the block's LoRA adapters (kernels/lora/lora.h; null: none). block_grads null:
  // a frozen base — d_in (and the adapters' grads) only, no block gradient.
  [[nodiscard]] virtual Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape,
                                             const float* block, const float* x_in, float* x_out,
                                             const Workspace& workspace,
                                             const kernels::lora::BlockAdapters* adapters = nullptr) const = 0;
  [[nodiscard]] virtual Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape,
                                              const float* block, const float* x_in, const float* d_out, float* d_in,
                                              float* block_grads, const Workspace& workspace, bool recompute,
                                              const kernels::lora::BlockAdapters* adapters = nullptr) const = 0;
  // Final norm, head and loss (the mean loss goes to the step's scalars). d_x_final,
  // final_grads and embed_grads all null: the loss only, no gradient (evaluation: head_loss).
  // d_x_final alone (both grads null): a frozen head, d_x_final only.
  [[nodiscard]] virtual Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape,
                                                     const float* final_weights, const float* embed,
                                                     const float* x_final, float* d_x_final, float* final_grads,
                                                     float* embed_grads, const Workspace& workspace) const = 0;
  [[nodiscard]] Status head_loss(kernels::ComputeBackend& backend, const BatchShape& shape, const float* final_weights,
                                 const float* embed, const float* x_final, const Workspace& workspace) const {
    return head_forward_backward(backend, shape, final_weights, embed, x_final, nullptr, nullptr, nullptr, workspace);
  }

  // --- generation with a KV cache (generate/generate.h; fp32 weights in the backend's memory) ---
  // What generation needs to know of the units' insides, so one generate path serves every
  // definition: K (and V) elements cached per position per block (GPT-2: C; Llama: KV·D);
  // learned position rows the embedding unit holds after its vocab token rows (GPT-2's wpe:
  // the window cannot pass them; Llama: 0, RoPE); the final unit's norm elements, which come
  // first in it; whether the output projection [vocab, C] is the embedding's token rows (tied)
  // or follows the norm in the final unit.
  virtual int64_t kv_cache_width() const = 0;
  virtual int64_t learned_positions() const = 0;
  virtual uint64_t final_norm_elements() const = 0;
  virtual bool head_tied() const = 0;
  // Workspace of the decode ops on `kind` for up to `max_rows` new rows and `max_positions` cached.
  virtual size_t decode_workspace_size_bytes(device::Kind kind, int64_t max_rows, int64_t max_positions) const = 0;
  // x0 of `rows` new tokens at positions past…: `tokens` index `token_table` ([table_rows, C]:
  // the embedding's token rows, or a gathered piece of them); `positions` is the learned
  // position table read at rows past… (all learned_positions() rows, or just the new rows'
  // piece with past 0), nullptr when there is none.
  [[nodiscard]] virtual Status embedding_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows,
                                                const int32_t* tokens, const float* token_table, int64_t table_rows,
                                                const float* positions, float* x0) const = 0;
  [[nodiscard]] virtual Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows,
                                            const float* block, const float* x_in, float* x_out,
                                            const kernels::KvCacheBlock& cache,
                                            const Workspace& workspace) const = 0;
  // Logits of `projection_rows` vocabulary rows (`projection`: those rows of the output
  // projection) for the last of `rows` new rows, after the final norm (`final_norm`).
  [[nodiscard]] virtual Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* final_norm,
                                           const float* projection, int64_t projection_rows, const float* x_final,
                                           float* logits, const Workspace& workspace) const = 0;

  // The same on bf16 units, as the store holds them (no unit widened whole where the backend
  // multiplies bf16 directly): `scratch` is the backend's memory of decode_bf16_scratch_bytes
  // for the device kind (kernels/backend.h). The head reads the whole output projection.
  virtual size_t decode_bf16_scratch_bytes(device::Kind kind) const = 0;
  [[nodiscard]] virtual Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows,
                                                 const uint16_t* block, const float* x_in, float* x_out,
                                                 const kernels::KvCacheBlock& cache, const Workspace& workspace,
                                                 const Workspace& scratch) const = 0;
  [[nodiscard]] virtual Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows,
                                                const uint16_t* final_norm, const uint16_t* projection,
                                                const float* x_final, float* logits, const Workspace& workspace,
                                                const Workspace& scratch) const = 0;

 protected:
  explicit ModelDefinition(const ModelConfig& config) : config_(config) {}
  // Appends a tensor to `unit`, packed after the ones before it.
  static void add_tensor(Unit& unit, std::string name, std::vector<int64_t> shape, bool weight_decay, double init_std,
                         float init_value);

  // Fills linears_ from block 0's tensors: `suffixes` in adapter index order, with their
  // shapes as (in, out) and whether each is a Conv1D.
  void find_linears(const std::vector<std::string>& suffixes, bool conv1d);

  ModelConfig config_;
  std::vector<Unit> units_;
  std::vector<BlockLinear> linears_;
};

// LoRA's target names of an architecture, and PEFT's defaults: models/architectures.h.
// Whether `linear` is adapted under `targets` (PEFT's rule: the name equals the suffix or ends it
// after a dot).
bool adapter_targets_linear(const std::vector<std::string>& targets, const BlockLinear& linear);

// GPT-2's shape (models/gpt2_shape.h) of a gpt2 `model`: n_ctx is its seq_len.
models::gpt2::Config gpt2_shape_config(const ModelConfig& model);

// The definition of `config.arch` (its row in models/architectures.h, which every reader of a
// config, store or folder has checked).
std::unique_ptr<const ModelDefinition> make_model_definition(const ModelConfig& config);

// The shape keys of `model` a store records ("model.arch", "model.n_layer", …; the Llama keys
// only for llama and gemma), and the model read back from them — untrusted input: numbers parsed whole
// and bounded, a bad one an error naming the key and `dir`. Stores written before `model.arch`
// existed are GPT-2.
// With an adapter, its keys too ("adapter.rank", …; docs/lora.md).
std::map<std::string, std::string> store_metadata(const ModelConfig& model);
[[nodiscard]] Result<ModelConfig> model_from_store_metadata(const std::map<std::string, std::string>& metadata,
                                                            const std::string& dir);
// A whole number in [min, max] under `key` of untrusted store metadata; missing, malformed or out
// of range is an error naming the key and `dir`.
[[nodiscard]] Result<uint64_t> metadata_integer(const std::map<std::string, std::string>& metadata,
                                                const std::string& key, uint64_t min, uint64_t max,
                                                const std::string& dir);
// The first shape key (as store_metadata names it) whose value differs; none when the two
// configs build the same model.
std::optional<std::string> first_shape_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace models
}  // namespace strata
