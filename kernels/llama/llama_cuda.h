// strata/kernels/llama/llama_cuda.h — the CUDA twin of llama.h: the same Llama math, entry
// points, layouts and gradient semantics, with DEVICE pointers and a stream (the Context of
// gpt2_cuda.h: one cuBLAS handle in pedantic fp32).
//
// Contract (differences from llama.h only; the rest as gpt2_cuda.h)
// - Every pointer is device memory; entry points enqueue on the Context's stream and return
//   without synchronizing.
// - Attention materializes its [B, H, T, T] probabilities and their gradient in the workspace
//   (strided-batched sgemm per batch row and k/v group), so the workspace grows with T².
// - Determinism: no atomics; the k/v gradients of a group add its query heads in head order.
// - Numerics: agree with the CPU kernels to fp32 rounding (cuBLAS vs OpenBLAS summation order);
//   RoPE angles in double as on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/gpt2/gpt2_cuda.h"
#include "kernels/llama/llama.h"

namespace strata::kernels::llama::cuda {

using gpt2::cuda::Context;

size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape);

[[nodiscard]] Status embedding_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                                       const int32_t* tokens, const float* embed, float* x0);
[[nodiscard]] Status embedding_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                                        const int32_t* tokens, const float* d_x0, float* d_embed);
// `packed`: llama.h's semantics, DEVICE pointers (RoPE reads positions per row; attention as
// gpt2_cuda.h's packed attention).
// `adapters` (lora.h, device tensors and scratch; null: none) and frozen (null) grads as llama.h's.
[[nodiscard]] Status block_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                                   const BlockWeights& weights, const float* x_in, float* x_out,
                                   const Workspace& workspace, const PackedRows& packed = {},
                                   const lora::BlockAdapters* adapters = nullptr);
[[nodiscard]] Status block_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                                    const BlockWeights& weights, const float* x_in, const float* d_out, float* d_in,
                                    const BlockGrads& grads, const Workspace& workspace, bool recompute = true,
                                    const PackedRows& packed = {}, const lora::BlockAdapters* adapters = nullptr);
// The loss goes to *loss (one device float); masks and `loss_normalizer_tokens` as GPT-2's
// CUDA head (gpt2_cuda.h). d_x_final null: the loss only (grads are not touched) — evaluation.
// Null grads are frozen: d_x_final with a default HeadGrads{} gives d_x_final alone.
[[nodiscard]] Status head_forward_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                                           const HeadWeights& weights, const float* x_final, const int32_t* targets,
                                           float* d_x_final, const HeadGrads& grads, float* loss,
                                           const Workspace& workspace, int64_t loss_normalizer_tokens);

// --- Decoding with a KV cache (llama.h's decode contract; device pointers; `tokens` DEVICE memory) ---
// Attention: one thread block per (new row, query head) scores the cached keys, softmaxes (max
// and sum by fixed block trees) and sums the cached values in position order — no atomics.
size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions);
[[nodiscard]] Status embedding_decode(const Context& ctx, const Config& config, int64_t rows, const int32_t* tokens,
                                      const float* embed, float* x0);
[[nodiscard]] Status block_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows,
                                  const BlockWeights& weights, const float* x_in, float* x_out,
                                  const KvCacheBlock& cache, const Workspace& workspace);
[[nodiscard]] Status head_decode(const Context& ctx, const Config& config, int64_t rows, const HeadWeights& weights,
                                 const float* x_final, float* logits, const Workspace& workspace);

}  // namespace strata::kernels::llama::cuda
