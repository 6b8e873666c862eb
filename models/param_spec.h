// strata/models/param_spec.h — one parameter tensor of a model's shape, as the store, the
// trainer and the exporters lay it out. Every model's shape header (gpt2_shape.h,
// llama_shape.h) lists its tensors as these, in the model's canonical order.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace strata::models {

struct ParamSpec {
  std::string_view name_suffix;     // e.g. "attn.c_attn.weight" (block) or "wte.weight"
  std::array<int64_t, 2> shape;     // shape[1] == 0 for 1-D tensors
  int rank;                         // 1 or 2
  bool weight_decay;                // AdamW decay: 2-D tensors yes, biases and norm gains no
  int64_t numel() const { return rank == 1 ? shape[0] : shape[0] * shape[1]; }
};

}  // namespace strata::models
