// strata/models/param_spec.h — one parameter tensor of a model's shape, as the store, the
// trainer and the exporters lay it out. Every model's shape header (gpt2_shape.h,
// llama_shape.h) lists its tensors as these, in the model's canonical order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::models {

struct ParamSpec {
  std::string_view name_suffix;     // e.g. "attn.c_attn.weight" (block) or "wte.weight"
  std::array<int64_t, 2> shape;     // shape[1] == 0 for 1-D tensors
  int rank;                         // 1 or 2
  bool weight_decay;                // AdamW decay: 2-D tensors yes, biases and norm gains no
  int64_t numel() const { return rank == 1 ? shape[0] : shape[0] * shape[1]; }
};

// Elements of `specs` together (a block's, or the tensors outside the blocks).
template <class Specs>
int64_t total_numel(const Specs& specs) {
  int64_t total = 0;
  for (const ParamSpec& spec : specs) total += spec.numel();
  return total;
}

// A block tensor's full name: `prefix`, the layer, a dot, the suffix ("h." → "h.3.ln_1.weight";
// "model.layers." → "model.layers.3.input_layernorm.weight").
inline std::string layer_param_name(std::string_view prefix, int64_t layer, std::string_view name_suffix) {
  std::string name(prefix);
  name += std::to_string(layer);
  name += '.';
  name.append(name_suffix);
  return name;
}

}  // namespace strata::models
