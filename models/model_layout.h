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
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "run/train_config.h"

namespace strata {

class ModelLayout {
 public:
  explicit ModelLayout(const ModelConfig& model);

  const models::ModelDefinition& definition() const { return *definition_; }
  const std::vector<Unit>& units() const { return definition_->units(); }
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
};

}  // namespace strata
