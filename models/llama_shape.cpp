// models/llama_shape.cpp — the Llama family's parameter layout (llama_shape.h): one table of a
// block's tensors that the specs and bind_block both walk.
#include "models/llama_shape.h"

#include <array>

namespace strata::models::llama {

namespace {

inline constexpr int kBlockSlotCount = 13;

// Every tensor a block may hold, in canonical order, each with whether this config has it:
// block_param_specs lists the present ones and bind_block walks the same table, so the two
// never disagree on the packed layout.
struct BlockSlot {
  ParamSpec spec;
  bool present;
};

std::array<BlockSlot, kBlockSlotCount> block_slots(const Config& config) {
  const int64_t c = config.n_embd;
  const int64_t i = config.intermediate_size;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  return {{
      {{"input_layernorm.weight", {c, 0}, 1, false}, true},
      {{"self_attn.q_proj.weight", {qw, c}, 2, true}, true},
      {{"self_attn.q_proj.bias", {qw, 0}, 1, false}, config.qkv_bias},
      {{"self_attn.k_proj.weight", {kvw, c}, 2, true}, true},
      {{"self_attn.k_proj.bias", {kvw, 0}, 1, false}, config.qkv_bias},
      {{"self_attn.v_proj.weight", {kvw, c}, 2, true}, true},
      {{"self_attn.v_proj.bias", {kvw, 0}, 1, false}, config.qkv_bias},
      {{"self_attn.o_proj.weight", {c, qw}, 2, true}, true},
      {{"self_attn.o_proj.bias", {c, 0}, 1, false}, config.o_bias},
      {{"post_attention_layernorm.weight", {c, 0}, 1, false}, true},
      {{"mlp.gate_proj.weight", {i, c}, 2, true}, true},
      {{"mlp.up_proj.weight", {i, c}, 2, true}, true},
      {{"mlp.down_proj.weight", {c, i}, 2, true}, true},
  }};
}

}  // namespace

std::vector<ParamSpec> block_param_specs(const Config& config) {
  std::vector<ParamSpec> specs;
  for (const BlockSlot& slot : block_slots(config))
    if (slot.present) specs.push_back(slot.spec);
  return specs;
}

std::string block_param_name(int64_t layer, std::string_view name_suffix) {
  return layer_param_name("model.layers.", layer, name_suffix);
}

int64_t block_param_count(const Config& config) { return total_numel(block_param_specs(config)); }

template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base) {
  BlockTensors<T> t;
  T** members[kBlockSlotCount] = {&t.input_layernorm, &t.q_proj,      &t.q_proj_bias, &t.k_proj, &t.k_proj_bias,
                                  &t.v_proj,          &t.v_proj_bias, &t.o_proj,      &t.o_proj_bias,
                                  &t.post_attention_layernorm,        &t.gate_proj,   &t.up_proj, &t.down_proj};
  const auto slots = block_slots(config);
  for (int i = 0; i < kBlockSlotCount; ++i) {
    if (!slots[i].present) continue;  // stays nullptr
    *members[i] = base;
    base += slots[i].spec.numel();
  }
  return t;
}

template BlockTensors<const float> bind_block(const Config&, const float*);
template BlockTensors<float> bind_block(const Config&, float*);
template BlockTensors<const uint16_t> bind_block(const Config&, const uint16_t*);

}  // namespace strata::models::llama
