// models/gpt2_shape.cpp — GPT-2's parameter layout (gpt2_shape.h): specs, names, counts, and
// the binding of a packed block to its tensors.
#include "models/gpt2_shape.h"

#include <cassert>

namespace strata::models::gpt2 {

// ---------------------------------------------------------------------------------------------
// Parameter layout
// ---------------------------------------------------------------------------------------------

std::array<ParamSpec, kBlockParamCount> block_param_specs(const Config& config) {
  const int64_t c = config.n_embd;
  return {{
      {"ln_1.weight", {c, 0}, 1, false},
      {"ln_1.bias", {c, 0}, 1, false},
      {"attn.c_attn.weight", {c, 3 * c}, 2, true},
      {"attn.c_attn.bias", {3 * c, 0}, 1, false},
      {"attn.c_proj.weight", {c, c}, 2, true},
      {"attn.c_proj.bias", {c, 0}, 1, false},
      {"ln_2.weight", {c, 0}, 1, false},
      {"ln_2.bias", {c, 0}, 1, false},
      {"mlp.c_fc.weight", {c, 4 * c}, 2, true},
      {"mlp.c_fc.bias", {4 * c, 0}, 1, false},
      {"mlp.c_proj.weight", {4 * c, c}, 2, true},
      {"mlp.c_proj.bias", {c, 0}, 1, false},
  }};
}

std::array<ParamSpec, kOuterParamCount> outer_param_specs(const Config& config) {
  const int64_t c = config.n_embd;
  return {{
      {"wte.weight", {config.vocab_size, c}, 2, true},
      {"wpe.weight", {config.n_ctx, c}, 2, true},
      {"ln_f.weight", {c, 0}, 1, false},
      {"ln_f.bias", {c, 0}, 1, false},
  }};
}

std::string block_param_name(int64_t layer, std::string_view name_suffix) {
  return layer_param_name("h.", layer, name_suffix);
}

int64_t block_param_count(const Config& config) { return total_numel(block_param_specs(config)); }

int64_t model_param_count(const Config& config) {
  return config.n_layer * block_param_count(config) + total_numel(outer_param_specs(config));
}

template <typename T>
T*& BlockTensors<T>::at(int index) {
  switch (index) {
    case 0: return ln_1_weight;
    case 1: return ln_1_bias;
    case 2: return attn_c_attn_weight;
    case 3: return attn_c_attn_bias;
    case 4: return attn_c_proj_weight;
    case 5: return attn_c_proj_bias;
    case 6: return ln_2_weight;
    case 7: return ln_2_bias;
    case 8: return mlp_c_fc_weight;
    case 9: return mlp_c_fc_bias;
    case 10: return mlp_c_proj_weight;
    default: assert(index == 11); return mlp_c_proj_bias;
  }
}

template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base) {
  BlockTensors<T> tensors;
  const auto specs = block_param_specs(config);
  for (int i = 0; i < kBlockParamCount; ++i) {
    tensors.at(i) = base;
    base += specs[i].numel();
  }
  return tensors;
}

template struct BlockTensors<const float>;
template struct BlockTensors<float>;
template struct BlockTensors<const uint16_t>;
template BlockTensors<const float> bind_block(const Config&, const float*);
template BlockTensors<float> bind_block(const Config&, float*);
template BlockTensors<const uint16_t> bind_block(const Config&, const uint16_t*);

}  // namespace strata::models::gpt2
