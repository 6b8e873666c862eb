// strata/kernels/gpt2/gpt2_cuda.h — the cuBLAS Context every CUDA kernel of strata runs on, and
// the CUDA twin of gpt2.h's decoding: the same GPT-2 math and structs (Config, BlockWeights,
// HeadWeights, KvCacheBlock, Workspace), with DEVICE pointers and a stream. Training has no
// twin here: the model definitions compose the CUDA operations (kernels/cuda/cuda_ops.h).
//
// Contract (differences from gpt2.h only)
// - Every pointer (weights, activations, tokens, the KV cache, workspace, logits) is device
//   memory on the current device. Entry points enqueue work on the Context's stream and return
//   without synchronizing; buffers must stay alive until that stream reaches the work.
// - Errors: a failed launch or cuBLAS call comes back as a Status (operating error: the device
//   is gone or out of resources). Programmer errors (bad shapes, a short workspace) assert.
// - Matrix products are cuBLAS sgemm in pedantic fp32 (no TF32), so results match the CPU
//   kernels to fp32 rounding.
// - Determinism: no atomics; every reduction (LayerNorm statistics, softmax sums) runs in a
//   fixed order (sequential per thread, then a fixed shuffle / shared-memory tree). cuBLAS gives bit-wise
//   identical results run after run on the same GPU model with one stream per handle, so the
//   same inputs give bit-identical outputs run after run on the same GPU.
// - Threads: a Context (one cuBLAS handle) is used by one host thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/gpt2/gpt2.h"
#include "kernels/lora/lora.h"

namespace strata::kernels::gpt2::cuda {

// A cuBLAS handle bound to one stream, in pedantic fp32 math. Move-only owner.
class Context {
 public:
  [[nodiscard]] static Result<Context> create(cudaStream_t stream);
  Context(Context&& other) noexcept;
  Context& operator=(Context&& other) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

 private:
  Context(cudaStream_t stream, cublasHandle_t cublas) : stream_(stream), cublas_(cublas) {}
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// --- Decoding with a KV cache (gpt2.h's decode contract; device pointers; `tokens` DEVICE memory) ---
// Attention: one thread block per (new row, head) scores the cached keys, softmaxes (max and
// sum by fixed block trees, the sum in double) and sums the cached values in position order —
// no atomics. The workspace holds the block's activations for `max_rows` rows and the scores
// [max_rows, H, max_positions]; the head needs only a LayerNorm row.
size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions);
[[nodiscard]] Status embedding_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows,
                                      const int32_t* tokens, const float* wte, const float* wpe, float* x0);
[[nodiscard]] Status block_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows,
                                  const BlockWeights& weights, const float* x_in, float* x_out,
                                  const KvCacheBlock& cache, const Workspace& workspace);
[[nodiscard]] Status head_decode(const Context& ctx, const Config& config, int64_t rows, const HeadWeights& weights,
                                 const float* x_final, float* logits, const Workspace& workspace);

}  // namespace strata::kernels::gpt2::cuda
