// strata/kernels/cuda/cublas_context.h — the cuBLAS Context every CUDA kernel of strata runs on:
// one compute stream and one cuBLAS handle bound to it in pedantic fp32. The CUDA backend owns
// one (cuda_backend.cpp); the operations (cuda_ops.h, cuda_decode_ops.h) and LoRA's CUDA half
// (lora_cuda.h) take it by const reference.
//
// Contract
// - Ownership: move-only; the Context owns its cuBLAS handle and destroys it, never the stream,
//   which its creator owns and keeps alive for as long as the Context.
// - Every kernel that runs on a Context takes DEVICE pointers, enqueues on `stream()` and
//   returns without synchronizing; buffers stay alive until that stream reaches the work.
// - Errors: a failed launch or cuBLAS call is a Status (an operating error: the device is gone
//   or out of resources); cuBLAS missing at run time is `unsupported`, naming where it looked.
//   Programmer errors (bad shapes, a short workspace) assert.
// - Products are cuBLAS sgemm in pedantic fp32 (no TF32), so results match the CPU to fp32
//   rounding.
// - Determinism: no atomics in strata's kernels; every reduction (norm statistics, softmax
//   sums) runs in a fixed order (sequential per thread, then a fixed shuffle / shared-memory
//   tree). cuBLAS gives bit-wise identical results run after run on the same GPU model with one
//   stream per handle, so the same inputs give the same bits run after run on one GPU model.
// - Threads: a Context (one cuBLAS handle) is used by one host thread at a time.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/status.h"

namespace strata::kernels::cuda {

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

}  // namespace strata::kernels::cuda
