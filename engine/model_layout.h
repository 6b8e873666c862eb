// strata/engine/model_layout.h — how a GPT-2's parameters are cut into units that travel.
//
// A unit is the set of tensors that move between tiers together: the embeddings
// (wte, wpe), each block h.{i}, and the final LayerNorm (ln_f). Each unit's tensors are
// packed back to back, in the kernels' canonical order, in one buffer per kind of state
// (compute copy, gradient, master, first and second moment) — so one unit is one store
// tensor per kind and one I/O, and kernels::gpt2::bind_block reads a packed block as is.
// Names are Hugging Face's without the `transformer.` prefix.
// Random initialization follows GPT-2's (normal, std 0.02; residual projections scaled by
// 1/sqrt(2·n_layer); biases 0; LayerNorm weights 1) from a counter-based generator keyed by
// (seed, tensor name, element index): any unit can be initialized alone, in any order, on
// any thread, and comes out the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/train_config.h"
#include "kernels/gpt2/gpt2.h"

namespace strata {

struct UnitTensor {
  std::string name;             // "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;
  uint64_t offset_elements = 0; // within the unit's packed buffer
  uint64_t element_count = 0;
  bool weight_decay = false;    // AdamW decays 2-D tensors only
  double init_std = 0.0;        // 0: constant init_value
  float init_value = 0.0f;
};

// A run of elements within a unit's packed buffer.
struct ElementRange {
  uint64_t begin_elements = 0;
  uint64_t element_count = 0;
};

struct Unit {
  std::string name;       // "embed", "h.3", "ln_f"
  int64_t block_index = -1;
  std::vector<UnitTensor> tensors;
  uint64_t element_count = 0;
};

// A unit's optimizer chunks (see OptimizerConfig::chunk_elements): ceil(n / chunk_elements) ranges of near-equal size covering it.
std::vector<ElementRange> optim_chunks(const Unit& unit, uint64_t chunk_elements);

class ModelLayout {
 public:
  explicit ModelLayout(const ModelConfig& model);

  const kernels::gpt2::Config& kernel_config() const { return kernel_config_; }
  const std::vector<Unit>& units() const { return units_; }
  size_t embed_unit() const { return 0; }
  size_t block_unit(int64_t block_index) const { return static_cast<size_t>(block_index) + 1; }
  size_t ln_f_unit() const { return units_.size() - 1; }
  uint64_t parameter_count() const;
  uint64_t largest_unit_elements() const;

  // Fills a unit's packed fp32 buffer with its initial values (in parallel; the values do not
  // depend on the thread count).
  void initialize_unit(size_t unit_index, uint64_t seed, float* out) const;

 private:
  kernels::gpt2::Config kernel_config_;
  std::vector<Unit> units_;
};

}  // namespace strata
