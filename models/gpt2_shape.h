// strata/models/gpt2_shape.h — GPT-2's shape: its dimensions, its parameter tensors in canonical
// order with their names, and the pointer structs a block, the head and the decode path bind.
// What GPT-2 computes is composed in models/gpt2.cpp of kernels/ops.h's operations.
//
// Contract
// - Math (what the tensors mean): Hugging Face's GPT2LMHeadModel with dropout off. x0 =
//   wte[token] + wpe[pos]; each block is pre-LayerNorm: x1 = x + c_proj(causal_attention(
//   c_attn(ln_1(x)))), x_out = x1 + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x1)))); then ln_f;
//   logits = ln_f(x) @ wteᵀ (the head is tied to the token embedding). LayerNorm eps 1e-5
//   (biased variance); attention scores scaled by 1/sqrt(head_dim); GELU is HF's "gelu_new".
// - Layout: every tensor row-major, exactly as in GPT-2's safetensors files. Conv1D weights are
//   stored [in, out] (y = x @ W + b). Names are HF's without the `transformer.` prefix:
//   `wte.weight` [vocab, C], `wpe.weight` [n_ctx, C], `h.{i}.<suffix>` for block tensors
//   (block_param_specs lists the suffixes in their canonical order), `ln_f.weight`, `ln_f.bias`.
//   A block's tensors are packed back to back in that order (bind_block). Activations are
//   [B, T, C] row-major; tokens and targets are int32 [B, T].
// - LoRA: the targeted linears' indices in a kernels::lora::BlockAdapters are lora_target's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/ops.h"
#include "models/param_spec.h"

namespace strata::models::gpt2 {

// Model dimensions (the shape of the weights).
struct Config {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;      // C; must be a multiple of n_head
  int64_t vocab_size = 0;
  int64_t n_ctx = 0;       // number of learned positions (rows of wpe)
  int64_t head_dim() const { return n_embd / n_head; }
};

// LayerNorm's eps (HF's layer_norm_epsilon for every GPT-2 checkpoint).
inline constexpr float kLayerNormEps = 1e-5f;

// The batch notions every model shares: kernels/ops.h's.
using kernels::BatchShape;
using kernels::KvCacheBlock;
using kernels::PackedRows;
using kernels::Workspace;
using models::ParamSpec;

inline constexpr int kBlockParamCount = 12;
// A block's tensors in canonical order (the order of BlockTensors' members):
// ln_1.weight, ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
// attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
// mlp.c_proj.weight, mlp.c_proj.bias.
std::array<ParamSpec, kBlockParamCount> block_param_specs(const Config& config);
// "h.{layer}.{suffix}".
std::string block_param_name(int64_t layer, std::string_view name_suffix);
// The non-block tensors: wte.weight, wpe.weight, ln_f.weight, ln_f.bias.
inline constexpr int kOuterParamCount = 4;
std::array<ParamSpec, kOuterParamCount> outer_param_specs(const Config& config);
// Elements of one block's tensors together / of the whole model.
int64_t block_param_count(const Config& config);
int64_t model_param_count(const Config& config);

// Pointers to one block's tensors (weights: const float; gradients: float), in the memory of
// whichever backend runs the definition's operations (models/gpt2.cpp).
template <typename T>
struct BlockTensors {
  T* ln_1_weight = nullptr;         // [C]
  T* ln_1_bias = nullptr;           // [C]
  T* attn_c_attn_weight = nullptr;  // [C, 3C]
  T* attn_c_attn_bias = nullptr;    // [3C]
  T* attn_c_proj_weight = nullptr;  // [C, C]
  T* attn_c_proj_bias = nullptr;    // [C]
  T* ln_2_weight = nullptr;         // [C]
  T* ln_2_bias = nullptr;           // [C]
  T* mlp_c_fc_weight = nullptr;     // [C, 4C]
  T* mlp_c_fc_bias = nullptr;       // [4C]
  T* mlp_c_proj_weight = nullptr;   // [4C, C]
  T* mlp_c_proj_bias = nullptr;     // [C]

  // Member i in canonical order (block_param_specs()[i]).
  T*& at(int index);
  T* at(int index) const { return const_cast<BlockTensors*>(this)->at(index); }
};
using BlockWeights = BlockTensors<const float>;
using BlockGrads = BlockTensors<float>;
// The store's bf16 compute copy as it is (bit patterns), bound like the fp32 weights.
using BlockWeightsBf16 = BlockTensors<const uint16_t>;

// Binds a block's tensors packed back to back in canonical order starting at `base`
// (block_param_count elements). Works for weights, gradients, or any per-parameter state.
template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base);

// ln_f and the tied embedding: what the head reads.
struct HeadWeights {
  const float* ln_f_weight = nullptr;  // [C]
  const float* ln_f_bias = nullptr;    // [C]
  const float* wte = nullptr;          // [vocab, C]
};
// Their gradients, ACCUMULATED; a null member is a frozen tensor.
struct HeadGrads {
  float* d_ln_f_weight = nullptr;  // [C]
  float* d_ln_f_bias = nullptr;    // [C]
  float* d_wte = nullptr;          // [vocab, C]
};
struct HeadWeightsBf16 {
  const uint16_t* ln_f_weight = nullptr;  // [C]
  const uint16_t* ln_f_bias = nullptr;    // [C]
  const uint16_t* wte = nullptr;          // [vocab, C]
};

// The LoRA targets' linear indices (kernels::lora::BlockAdapters::adapters).
namespace lora_target {
inline constexpr int c_attn = 0, attn_c_proj = 1, c_fc = 2, mlp_c_proj = 3;
inline constexpr int count = 4;
}  // namespace lora_target

}  // namespace strata::models::gpt2
