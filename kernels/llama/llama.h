// strata/kernels/llama/llama.h — Llama forward and backward on the CPU, one block at a time.
//
// Contract (the same shape as gpt2.h; what differs is said here)
// - Math: exactly Hugging Face's LlamaForCausalLM in fp32 with no dropout (and Qwen2ForCausalLM,
//   which is the same block with biases on q/k/v).
//   x0 = embed_tokens[token]; each block is pre-norm:
//     h  = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rms_1(x)
//     x' = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                       n2 = rms_2(h)
//   Projections carry no bias, except: `qkv_bias` (Qwen 2 / 2.5, and HF Llama's
//   attention_bias) adds one to q_proj, k_proj and v_proj — before RoPE, as HF does, so the
//   cached keys hold it rotated — and `o_bias` (HF Llama's attention_bias only) one to o_proj.
//   then model.norm; logits = norm(x) @ Wᵀ with W = lm_head, or embed_tokens when tied; loss =
//   mean cross-entropy over the B·T positions.
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
// - Ownership, gradients (ACCUMULATED into weight grads, OVERWRITTEN for activation grads),
//   threads (TBB fan-out; OpenBLAS pinned to one thread; fixed GEMM tiles) and determinism
//   (bit-identical run after run whatever the thread count) exactly as gpt2.h says.
// - Precision: fp32 storage and products; RMSNorm statistics, softmax / cross-entropy sums and
//   column sums in double. Checked against a float64 PyTorch implementation of HF's semantics
//   (tests/llama): loss and every gradient within 1e-5 relative.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/gpt2/gpt2.h"
#include "kernels/op_math.h"  // STRATA_HOST_DEVICE

namespace strata::kernels::llama {

using gpt2::BatchShape;
using gpt2::PackedRows;
using gpt2::ParamSpec;
using gpt2::Workspace;

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
STRATA_HOST_DEVICE inline ops::RopeSpec rope_spec(const Config& config) {
  ops::RopeSpec spec;
  spec.head_dim = config.head_dim;
  spec.theta = config.rope_theta;
  spec.factor = config.rope_factor;
  spec.low_freq_factor = config.rope_low_freq_factor;
  spec.high_freq_factor = config.rope_high_freq_factor;
  spec.original_max_positions = config.rope_original_max_positions;
  return spec;
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

// A block packed back to back in canonical order from `base`.
template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base);

// model.norm and the output projection ([vocab, C]: lm_head, or embed_tokens when tied).
struct HeadWeights {
  const float* norm_weight = nullptr;
  const float* lm_head = nullptr;
};
struct HeadGrads {
  float* d_norm_weight = nullptr;  // accumulated
  float* d_lm_head = nullptr;      // accumulated
};

// Bytes of workspace for shapes up to `max_shape`: the block ops, the head, and one that serves both.
size_t block_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
size_t head_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape);

// x0[r, :] = embed[tokens[r], :]; tokens in [0, vocab) (asserted).
void embedding_forward(const Config& config, const BatchShape& shape, const int32_t* tokens, const float* embed,
                       float* x0);
// d_embed[tokens[r], :] += d_x0[r, :] in row order.
void embedding_backward(const Config& config, const BatchShape& shape, const int32_t* tokens, const float* d_x0,
                        float* d_embed);

// As gpt2::block_forward / block_backward (x_out must not alias x_in; d_in may alias d_out).
// `packed` (gpt2::PackedRows): RoPE rotates q and k by packed.positions (null: t within the
// row) and packed.segments keeps attention inside each example; the embedding has no positions.
// `adapters` (lora.h; null: none, today's bits): LoRA on q_proj (0), k_proj (1), v_proj (2),
// o_proj (3), gate_proj (4), up_proj (5), down_proj (6) — the term is added after the
// projection's bias (before RoPE for q and k, as PEFT wraps the nn.Linear). Null members of
// `grads` are frozen (gpt2.h, "Gradients"): a default BlockGrads{} computes d_in (and the
// adapters' grads) alone, bit for bit the full backward's d_in.
void block_forward(const Config& config, const BatchShape& shape, const BlockWeights& weights, const float* x_in,
                   float* x_out, const Workspace& workspace, const PackedRows& packed = {},
                   const lora::BlockAdapters* adapters = nullptr);
void block_backward(const Config& config, const BatchShape& shape, const BlockWeights& weights, const float* x_in,
                    const float* d_out, float* d_in, const BlockGrads& grads, const Workspace& workspace,
                    bool recompute = true, const PackedRows& packed = {},
                    const lora::BlockAdapters* adapters = nullptr);

// Final RMSNorm, logits and cross-entropy; writes d_x_final, accumulates the head grads. Loss
// masks (negative targets) and the normalizer N are GPT-2's (gpt2.h, "Loss masks"). Null
// members of `grads` are frozen: a default HeadGrads{} gives d_x_final alone.
float head_forward_backward(const Config& config, const BatchShape& shape, const HeadWeights& weights,
                            const float* x_final, const int32_t* targets, float* d_x_final, const HeadGrads& grads,
                            const Workspace& workspace, int64_t loss_normalizer_tokens = 0);
// The same loss with no gradients (evaluation).
float head_loss(const Config& config, const BatchShape& shape, const HeadWeights& weights, const float* x_final,
                const int32_t* targets, const Workspace& workspace, int64_t loss_normalizer_tokens = 0);
// For sampling: logits [batch, vocab] of the last position of each sequence.
void head_forward(const Config& config, const BatchShape& shape, const HeadWeights& weights, const float* x_final,
                  float* logits, const Workspace& workspace);

// --- Decoding with a KV cache (generation); gpt2.h's decode contract, with Llama's shapes ---
// A block's cache is a gpt2::KvCacheBlock whose keys and values are [max_positions, KV·D]
// (k/v head g in columns g·D..): the keys cached after RoPE at their absolute positions, so a
// new row only rotates itself. Llama has no learned positions: max_positions is the caller's
// window (<= n_ctx is not required; RoPE has no table of it).
using gpt2::KvCacheBlock;

// Workspace for block_decode and head_decode with up to `max_rows` new rows per call and a
// cache of `max_positions`.
size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions);

// x0[r] = embed[tokens[r]] for the `rows` new tokens (positions enter through RoPE, in the block).
void embedding_decode(const Config& config, int64_t rows, const int32_t* tokens, const float* embed, float* x0);

// The block for `rows` new positions past..past+rows−1 over the cached 0..past−1: RMSNorm, the
// q/k/v projections, RoPE at the absolute positions, the new k and v into the cache, causal GQA
// attention over the cache, o_proj, RMSNorm, SwiGLU — block_forward's math for those rows.
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeights& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace);

// logits [vocab] of the last of `rows` rows of x_final: the final RMSNorm and the output
// projection (config.vocab_size rows of weights.lm_head: a caller may pass a piece).
void head_decode(const Config& config, int64_t rows, const HeadWeights& weights, const float* x_final, float* logits,
                 const Workspace& workspace);

// --- Decoding on bf16 weights (gpt2.h's bf16 decode contract, with Llama's shapes) ---
// block_decode and head_decode on bf16 bit patterns: the RMSNorm gains widened into `scratch`
// (decode_bf16_scratch_bytes, beside the workspace), every nn.Linear product read once through
// cpu_math::matmul_bf16. Equal to widening first and the fp32 ops up to fp32 summation order.
using BlockWeightsBf16 = BlockTensors<const uint16_t>;
struct HeadWeightsBf16 {
  const uint16_t* norm_weight = nullptr;  // [C]
  const uint16_t* lm_head = nullptr;      // [vocab, C] (config.vocab_size rows)
};
size_t decode_bf16_scratch_bytes(const Config& config);
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch);
void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& weights, const float* x_final,
                 float* logits, const Workspace& workspace, const Workspace& scratch);

// RoPE's inverse frequencies (head_dim / 2 of them), llama3 scaling applied: the CPU and CUDA
// kernels both take them from here.
void rope_inverse_frequencies(const Config& config, double* inv_freq);

}  // namespace strata::kernels::llama
