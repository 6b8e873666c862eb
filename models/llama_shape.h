// strata/models/llama_shape.h — the Llama family's shape (Llama, Qwen 2, and the Gemma variants
// models/gemma.cpp instantiates): its dimensions, its block's tensors in canonical order with
// their names, RoPE's parameters, and the pointer structs a block, the head and the decode path
// bind. What it computes is composed in models/decoder.cpp of kernels/ops.h's operations.
//
// Contract
// - Math (what the tensors mean): exactly Hugging Face's LlamaForCausalLM with no dropout (and
//   Qwen2ForCausalLM, which is the same block with biases on q/k/v).
//   x0 = embed_tokens[token]; each block is pre-norm:
//     h  = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rms_1(x)
//     x' = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                       n2 = rms_2(h)
//   Projections carry no bias, except: `qkv_bias` (Qwen 2 / 2.5, and HF Llama's
//   attention_bias) adds one to q_proj, k_proj and v_proj — before RoPE, as HF does, so the
//   cached keys hold it rotated — and `o_bias` (HF Llama's attention_bias only) one to o_proj.
//   then model.norm; logits = norm(x) @ Wᵀ with W = lm_head, or embed_tokens when tied.
//   RMSNorm: w · x · rsqrt(mean(x²) + eps) (the mean of squares in double; HF computes it in
//   fp32). RoPE: HF's rotate_half convention — pair (i, i + D/2) rotated by angle pos·inv_freq_i,
//   inv_freq_i = theta^(−2i/D), with the `llama3` rope_scaling form when given (long wavelengths
//   divided by `factor`, short kept, a smooth blend between). Grouped-query attention: query head
//   h reads k/v head h / (n_head / n_kv_head) (HF's repeat_kv); scores scaled by 1/sqrt(head_dim);
//   head_dim independent of n_embd / n_head.
// - Layout: every tensor fp32 row-major in Hugging Face's layout: nn.Linear weights [out, in]
//   (y = x · Wᵀ, a transposed GEMM). A block's tensors, in canonical order (BlockTensors'
//   members; a bias right after its weight, as HF's state_dict lists them, and only when the
//   config has it): input_layernorm [C], q_proj [H·D, C], (q_proj_bias [H·D]), k_proj [KV·D, C],
//   (k_proj_bias [KV·D]), v_proj [KV·D, C], (v_proj_bias [KV·D]), o_proj [C, H·D],
//   (o_proj_bias [C]), post_attention_layernorm [C], gate_proj [I, C], up_proj [I, C],
//   down_proj [C, I]. Names: block_param_name (a bias is `self_attn.q_proj.bias`...).
// - LoRA: the targeted linears' indices in a kernels::lora::BlockAdapters are lora_target's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/op_math.h"  // STRATA_HOST_DEVICE
#include "kernels/ops.h"
#include "models/param_spec.h"

namespace strata::models::llama {

// The batch notions every model shares: kernels/ops.h's.
using kernels::BatchShape;
using kernels::KvCacheBlock;
using kernels::PackedRows;
using kernels::Workspace;
using models::ParamSpec;

struct Config {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;          // divides n_head
  int64_t head_dim = 0;           // even (RoPE rotates pairs)
  int64_t n_embd = 0;             // C
  int64_t intermediate_size = 0;  // I
  int64_t vocab_size = 0;
  int64_t n_ctx = 0;              // longest sequence (RoPE needs no table of it)
  double rope_theta = 10000.0;
  // llama3 rope_scaling; factor 0: none.
  double rope_factor = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  double rope_original_max_positions = 8192.0;
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  bool qkv_bias = false;  // q_proj, k_proj and v_proj carry biases (Qwen 2, HF attention_bias)
  bool o_bias = false;    // o_proj carries one (HF Llama's attention_bias; never Qwen 2)
  int64_t q_width() const { return n_head * head_dim; }
  int64_t kv_width() const { return n_kv_head * head_dim; }
};

// RoPE's parameters of `config` (ops.h): what the rope operations take.
STRATA_HOST_DEVICE inline kernels::ops::RopeSpec rope_spec(const Config& config) {
  kernels::ops::RopeSpec spec;
  spec.head_dim = config.head_dim;
  spec.theta = config.rope_theta;
  spec.factor = config.rope_factor;
  spec.low_freq_factor = config.rope_low_freq_factor;
  spec.high_freq_factor = config.rope_high_freq_factor;
  spec.original_max_positions = config.rope_original_max_positions;
  return spec;
}

// The k/v head that query head h reads (Hugging Face's repeat_kv: n_head / n_kv_head query
// heads share one).
STRATA_HOST_DEVICE inline int64_t kv_head_of(const Config& config, int64_t h) {
  return h / (config.n_head / config.n_kv_head);
}

// A block's tensors in canonical order, with suffixes after "model.layers.{i}.": 9 without
// biases, 12 with qkv_bias, 13 with both.
std::vector<ParamSpec> block_param_specs(const Config& config);
// "model.layers.{layer}.{suffix}".
std::string block_param_name(int64_t layer, std::string_view name_suffix);
int64_t block_param_count(const Config& config);

template <typename T>
struct BlockTensors {
  T* input_layernorm = nullptr;           // [C]
  T* q_proj = nullptr;                    // [H·D, C]
  T* q_proj_bias = nullptr;               // [H·D]; nullptr without qkv_bias
  T* k_proj = nullptr;                    // [KV·D, C]
  T* k_proj_bias = nullptr;               // [KV·D]; nullptr without qkv_bias
  T* v_proj = nullptr;                    // [KV·D, C]
  T* v_proj_bias = nullptr;               // [KV·D]; nullptr without qkv_bias
  T* o_proj = nullptr;                    // [C, H·D]
  T* o_proj_bias = nullptr;               // [C]; nullptr without o_bias
  T* post_attention_layernorm = nullptr;  // [C]
  T* gate_proj = nullptr;                 // [I, C]
  T* up_proj = nullptr;                   // [I, C]
  T* down_proj = nullptr;                 // [C, I]
};
using BlockWeights = BlockTensors<const float>;
using BlockGrads = BlockTensors<float>;
// The store's bf16 compute copy as it is (bit patterns), bound like the fp32 weights.
using BlockWeightsBf16 = BlockTensors<const uint16_t>;

// A block packed back to back in canonical order from `base`.
template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base);

// model.norm and the output projection ([vocab, C]: lm_head, or embed_tokens when tied).
struct HeadWeights {
  const float* norm_weight = nullptr;
  const float* lm_head = nullptr;
};
struct HeadWeightsBf16 {
  const uint16_t* norm_weight = nullptr;  // [C]
  const uint16_t* lm_head = nullptr;      // [vocab, C] (config.vocab_size rows)
};
// Their gradients; a null member is a frozen tensor.
struct HeadGrads {
  float* d_norm_weight = nullptr;  // accumulated
  float* d_lm_head = nullptr;      // accumulated
};

// The LoRA targets' linear indices (kernels::lora::BlockAdapters::adapters). A term is added
// after its projection's bias (before RoPE for q and k, as PEFT wraps the nn.Linear).
namespace lora_target {
inline constexpr int q_proj = 0, k_proj = 1, v_proj = 2, o_proj = 3, gate_proj = 4, up_proj = 5, down_proj = 6;
inline constexpr int count = 7;
}  // namespace lora_target

}  // namespace strata::models::llama
