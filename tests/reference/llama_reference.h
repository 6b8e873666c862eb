// strata/tests/reference/llama_reference.h — the Llama family's forward and backward on the
// CPU, one block at a time: the per-model kernels the composed definition (models/decoder.cpp)
// is held to bit for bit (tests/backend/test_compose_llama.cpp) and that tests/llama checks
// against PyTorch. Test code only. The shape is models/llama_shape.h's; this header brings its
// names into strata::reference::llama.
//
// Contract
// - Math: models/llama_shape.h's; loss = the cross-entropy over the trained rows divided by N
//   (kernels/ops.h, count_trained_targets). RMSNorm's mean of squares in double (HF: fp32).
// - Ownership, gradients (ACCUMULATED into weight grads, OVERWRITTEN for activation grads),
//   threads (TBB fan-out; OpenBLAS pinned to one thread; fixed GEMM tiles) and determinism
//   (bit-identical run after run whatever the thread count) exactly as gpt2_reference.h says.
// - Precision: fp32 storage and products; RMSNorm statistics, softmax / cross-entropy sums and
//   column sums in double. Checked against a float64 PyTorch implementation of HF's semantics
//   (tests/llama): loss and every gradient within 1e-5 relative.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "models/llama_shape.h"

namespace strata::reference::llama {

// The shape's vocabulary (Config, BlockWeights, bind_block, rope_spec, ...) is the reference's.
using namespace models::llama;
namespace lora = kernels::lora;

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
// `packed` (kernels::PackedRows): RoPE rotates q and k by packed.positions (null: t within the
// row) and packed.segments keeps attention inside each example; the embedding has no positions.
// `adapters` (kernels/lora/lora.h; null: none, today's bits): LoRA on
// models::llama::lora_target's linears. Null members of
// `grads` are frozen (gpt2_reference.h, "Gradients"): a default BlockGrads{} computes d_in (and the
// adapters' grads) alone, bit for bit the full backward's d_in.
void block_forward(const Config& config, const BatchShape& shape, const BlockWeights& weights, const float* x_in,
                   float* x_out, const Workspace& workspace, const PackedRows& packed = {},
                   const lora::BlockAdapters* adapters = nullptr);
void block_backward(const Config& config, const BatchShape& shape, const BlockWeights& weights, const float* x_in,
                    const float* d_out, float* d_in, const BlockGrads& grads, const Workspace& workspace,
                    bool recompute = true, const PackedRows& packed = {},
                    const lora::BlockAdapters* adapters = nullptr);

// Final RMSNorm, logits and cross-entropy; writes d_x_final, accumulates the head grads. Loss
// masks (negative targets) and the normalizer N are ops.h's ("Loss masks"). Null
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

// --- Decoding with a KV cache (generation); gpt2_reference.h's decode contract, with Llama's shapes ---
// A block's cache is a kernels::KvCacheBlock whose keys and values are [max_positions, KV·D]
// (k/v head g in columns g·D..): the keys cached after RoPE at their absolute positions, so a
// new row only rotates itself. Llama has no learned positions: max_positions is the caller's
// window (<= n_ctx is not required; RoPE has no table of it).

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

// --- Decoding on bf16 weights (gpt2_reference.h's bf16 decode contract, with Llama's shapes) ---
// block_decode and head_decode on bf16 bit patterns: the RMSNorm gains widened into `scratch`
// (decode_bf16_scratch_bytes, beside the workspace), every nn.Linear product read once through
// cpu_math::matmul_bf16. Equal to widening first and the fp32 ops up to fp32 summation order.
// BlockWeightsBf16 / HeadWeightsBf16: llama_shape.h.
size_t decode_bf16_scratch_bytes(const Config& config);
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch);
void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& weights, const float* x_final,
                 float* logits, const Workspace& workspace, const Workspace& scratch);

// RoPE's inverse frequencies (head_dim / 2 of them), llama3 scaling applied (op_math.h's).
void rope_inverse_frequencies(const Config& config, double* inv_freq);

}  // namespace strata::reference::llama
