// strata/kernels/llama/llama_cuda.h — the CUDA twin of llama.h's decoding: the same Llama math
// and layouts, with DEVICE pointers and a stream (the Context of gpt2_cuda.h: one cuBLAS handle
// in pedantic fp32). Training has no twin here: the model definitions compose the CUDA
// operations (kernels/cuda/cuda_ops.h).
//
// Contract (differences from llama.h only; the rest as gpt2_cuda.h)
// - Every pointer is device memory; entry points enqueue on the Context's stream and return
//   without synchronizing.
// - Determinism: no atomics.
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
