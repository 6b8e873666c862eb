// strata/kernels/gpt2/gpt2_cuda.h — the CUDA twin of gpt2.h: the same GPT-2 math, entry
// points, tensor layout, gradient semantics and structs (Config, BatchShape, BlockWeights,
// BlockGrads, HeadWeights, HeadGrads, Workspace), with DEVICE pointers and a stream.
//
// Contract (differences from gpt2.h only)
// - Every pointer (weights, activations, gradients, tokens, targets, workspace, loss) is device
//   memory on the current device. Entry points enqueue work on the Context's stream and return
//   without synchronizing; buffers must stay alive until that stream reaches the work.
// - Errors: a failed launch or cuBLAS call comes back as a Status (operating error: the device
//   is gone or out of resources). Programmer errors (bad shapes, a short workspace) assert.
// - Matrix products are cuBLAS sgemm in pedantic fp32 (no TF32), so results match the CPU
//   kernels to fp32 rounding. Attention materializes its [B, H, T, T] probabilities (and their
//   gradient) in the workspace and uses strided-batched sgemm per batch row, so this workspace
//   grows with T² (block_workspace_size_bytes says how much).
// - Determinism: no atomics; every reduction (LayerNorm statistics, softmax and cross-entropy
//   sums, column sums for biases / LayerNorm / embeddings, the loss mean) runs in a fixed order
//   (sequential per thread, then a fixed shuffle / shared-memory tree). cuBLAS gives bit-wise
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

// Bytes of device workspace each entry point needs for shapes up to max_shape (256-byte
// aligned base required).
size_t block_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
size_t head_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape);

// `packed` (gpt2.h's PackedRows) holds DEVICE pointers here. Packed attention skips the keys
// before each query's example (a binary search of its row's segment ids) and leaves their
// probabilities 0; the packed wpe gradient walks the rows in order, one thread per column.
[[nodiscard]] Status embedding_forward(const Context& ctx, const Config& config,
                                       const BatchShape& shape, const int32_t* tokens,
                                       const float* wte, const float* wpe, float* x0,
                                       const PackedRows& packed = {});
[[nodiscard]] Status embedding_backward(const Context& ctx, const Config& config,
                                        const BatchShape& shape, const int32_t* tokens,
                                        const float* d_x0, float* d_wte, float* d_wpe,
                                        const PackedRows& packed = {});

// `adapters` (lora.h, device tensors and scratch; null: none) and frozen (null) grads as gpt2.h's.
[[nodiscard]] Status block_forward(const Context& ctx, const Config& config,
                                   const BatchShape& shape, const BlockWeights& weights,
                                   const float* x_in, float* x_out, const Workspace& workspace,
                                   const PackedRows& packed = {},
                                   const lora::BlockAdapters* adapters = nullptr);
[[nodiscard]] Status block_backward(const Context& ctx, const Config& config,
                                    const BatchShape& shape, const BlockWeights& weights,
                                    const float* x_in, const float* d_out, float* d_in,
                                    const BlockGrads& grads, const Workspace& workspace,
                                    bool recompute = true, const PackedRows& packed = {},
                                    const lora::BlockAdapters* adapters = nullptr);

// As the CPU head (masks included), but the loss is written to *loss (one device float) instead
// of returned, so nothing waits for the device. The targets are device memory, so the caller
// resolves N itself: `loss_normalizer_tokens` is the divisor (the host's
// count_trained_targets when the batch has no other), 0 only when no row is trained.
[[nodiscard]] Status head_forward_backward(const Context& ctx, const Config& config,
                                           const BatchShape& shape, const HeadWeights& weights,
                                           const float* x_final, const int32_t* targets,
                                           float* d_x_final, const HeadGrads& grads, float* loss,
                                           const Workspace& workspace, int64_t loss_normalizer_tokens);
[[nodiscard]] Status head_loss(const Context& ctx, const Config& config, const BatchShape& shape,
                               const HeadWeights& weights, const float* x_final,
                               const int32_t* targets, float* loss, const Workspace& workspace,
                               int64_t loss_normalizer_tokens);
[[nodiscard]] Status head_forward(const Context& ctx, const Config& config,
                                  const BatchShape& shape, const HeadWeights& weights,
                                  const float* x_final, float* logits,
                                  const Workspace& workspace);

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
