// strata/models/model_layout.h — a model's units as the trainer moves them, over its
// definition (models/model.h: units, tensors, HF names, init and decay rules, ops).
//
// A unit is the set of tensors that move between tiers together: the embedding, each block,
// and the final unit (final norm, and an untied LM head). Each unit's tensors are packed back
// to back, in the kernels' canonical order, in one buffer per kind of state (compute copy,
// gradient, master, first and second moment) — so one unit is one store tensor per kind and
// one I/O, and a model's kernels bind a packed unit as is.
// Random initialization follows the definition's rules (normal with the tensor's std, or a
// constant) from a counter-based generator keyed by (seed, tensor name, element index): any
// unit can be initialized alone, in any order, on any thread, and comes out the same.
//
// LoRA (`adapter:`, ModelConfig::adapter; docs/lora.md): the definition's units are the base,
// all frozen; after them come one adapter unit per block ("lora.h.3" / "lora.layers.3") holding,
// for each targeted linear in adapter index order, lora_A [r, in] (Kaiming-uniform, a = √5:
// U(±1/√in)) then lora_B [out, r] (zeros), named after the base weight as PEFT names them
// ("model.layers.3.self_attn.q_proj.lora_A.weight", without PEFT's "base_model.model." prefix).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/lora/lora.h"
#include "kernels/quant/quant.h"
#include "models/model.h"
#include "run/train_config.h"

namespace strata {

class ModelLayout {
 public:
  explicit ModelLayout(const ModelConfig& model);

  const models::ModelDefinition& definition() const { return *definition_; }
  // The base's units (the definition's), then the adapters' when there are any.
  const std::vector<Unit>& units() const { return units_; }
  bool has_adapters() const { return !adapter_units_.empty(); }
  // The adapter unit of block `block_index`; only with has_adapters().
  size_t adapter_unit(int64_t block_index) const { return adapter_units_[static_cast<size_t>(block_index)]; }
  // Elements of the units that train (all of them without adapters).
  uint64_t trainable_parameter_count() const;
  // A frozen unit's compute copy in the store and in memory (adapter.base_dtype): fp32 or bf16
  // as it says; int8 / nf4 quantise each block's 2-D linear weights (kernels/quant/quant.h —
  // QLoRA's choice; norms and biases stay fp32 inside the quantised buffer), while the
  // embedding and final units stay bf16, the compute dtype QLoRA keeps them in.
  // quant_layout: that unit's quantised layout, or null when it is not quantised.
  const kernels::quant::UnitLayout* quant_layout(size_t unit) const;
  // The bytes of a frozen unit's compute copy, as above.
  uint64_t frozen_params_bytes(size_t unit) const;
  // Block `block_index`'s adapters as the kernels take them (kernels/lora/lora.h), over its
  // adapter unit's packed fp32 weights and, for a backward, its gradients (else null): rank and
  // scale from the config, `dropout` (the config's in training, 0 in evaluation) keyed by
  // `mask_key`, the op's scratch.
  kernels::lora::BlockAdapters bind_adapters(int64_t block_index, const float* weights, float* grads, float dropout,
                                             uint64_t mask_key, const kernels::Workspace& scratch) const;
  int64_t n_layer() const { return definition_->n_layer(); }
  size_t embed_unit() const { return definition_->embed_unit(); }
  size_t block_unit(int64_t block_index) const { return definition_->block_unit(block_index); }
  // The final unit: GPT-2's ln_f, Llama's norm (and lm_head when untied).
  size_t ln_f_unit() const { return definition_->final_unit(); }
  uint64_t parameter_count() const;
  uint64_t largest_unit_elements() const;

  // Fills a unit's packed fp32 buffer with its initial values (in parallel; the values do not
  // depend on the thread count).
  void initialize_unit(size_t unit_index, uint64_t seed, float* out) const;

 private:
  std::shared_ptr<const models::ModelDefinition> definition_;
  std::vector<Unit> units_;
  std::vector<size_t> adapter_units_;  // per block
  std::vector<std::optional<kernels::quant::UnitLayout>> quant_layouts_;  // per unit; int8 / nf4 blocks only
};

}  // namespace strata
