// strata/kernels/cuda/cuda_common.cuh — the CUDA building blocks the operations and
// LoRA's share (cuda_ops.cu, cuda_decode_ops.cu, lora_cuda.cu, cublas_context.cu; include from .cu files only):
// error values, the launch check, fixed-order warp and block reductions, the causal softmax and
// its backward over [rows, T] scores, the cross-entropy row and the loss mean, row-major cuBLAS
// sgemm (plain and strided batched, pedantic fp32) and column sums. Everything here is in an unnamed namespace: each
// .cu file compiles its own copy, so no relocatable device code is needed.
//
// Determinism as cublas_context.h says: no atomics; sums in a fixed order.
#pragma once

#include <cmath>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/narrow.h"
#include "common/status.h"
#include "kernels/cuda/cublas_context.h"

namespace strata::kernels::cuda {
namespace {

Error cuda_error(const char* what, cudaError_t code) {
  return make_error(ErrorKind::internal,
                    std::string("CUDA ") + what + " failed: " + cudaGetErrorString(code));
}

Error cublas_error(const char* what, cublasStatus_t code) {
  return make_error(ErrorKind::internal, std::string("cuBLAS ") + what + " failed: status " +
                                             std::to_string(static_cast<int>(code)));
}

// After each launch: a bad configuration or a dead device surfaces here.
Status check_launch(const char* kernel) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess) return cuda_error(kernel, code);
  return Status();
}

#define STRATA_CUDA_LAUNCH(name, grid, block, stream, ...)               \
  do {                                                                   \
    name<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);                 \
    STRATA_RETURN_IF_ERROR(check_launch(#name));                         \
  } while (0)

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// Decoding: the attention of at most this many new rows runs per launch, so the scores buffer
// holds this many rows × H × max_positions floats, not a whole prompt's (cuda_decode_ops.cu).
constexpr int64_t kDecodeScoreRows = 64;

unsigned blocks_for(int64_t count, int64_t per_block = kThreads) {
  return static_cast<unsigned>((count + per_block - 1) / per_block);
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

// Fixed butterfly: every lane ends with the same, run-to-run identical sum.
__device__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide reductions through shared memory in a fixed tree (blockDim.x == kThreads).
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}
__device__ float block_max(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__global__ void column_sums_kernel(const float* in, int64_t rows, int64_t cols, float* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double acc = 0.0;
  for (int64_t r = 0; r < rows; ++r) acc += in[r * cols + j];
  out[j] += static_cast<float>(acc);
}

// The first key that query i of score row `row` ([B·H·T] rows, H = heads) may see: 0 unpacked;
// with packed rows (ops.h PackedRows' `segments`, [B·T], non-decreasing along a batch row) the
// start of i's example — the lower bound of its id in the row, a binary search each lane runs.
__device__ inline int64_t first_key(const int32_t* segments, int64_t row, int64_t t_len, int64_t heads, int64_t i) {
  if (segments == nullptr) return 0;
  const int32_t* ids = segments + row / (heads * t_len) * t_len;
  const int32_t id = ids[i];
  int64_t low = 0;
  int64_t high = i;
  while (low < high) {
    const int64_t mid = (low + high) / 2;
    if (ids[mid] < id) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

// Row r of [B·H·T, T] scores → causal softmax of scale·scores over keys first..i (first_key);
// every other entry 0. `segments` null: first = 0, the plain causal softmax.
__global__ void causal_softmax_kernel(float* scores, int64_t t_len, int64_t total_rows,
                                      float scale, const int32_t* segments, int64_t heads) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= total_rows) return;
  const int64_t i = row % t_len;
  const int64_t first = first_key(segments, row, t_len, heads, i);
  float* p = scores + row * t_len;
  float max_value = -INFINITY;
  for (int64_t j = first + lane; j <= i; j += 32) max_value = fmaxf(max_value, p[j] * scale);
  max_value = warp_max(max_value);
  double sum = 0.0;
  for (int64_t j = first + lane; j <= i; j += 32) {
    const float e = expf(p[j] * scale - max_value);
    p[j] = e;
    sum += e;
  }
  const float inv_sum = static_cast<float>(1.0 / warp_sum(sum));
  for (int64_t j = lane; j < t_len; j += 32) p[j] = j >= first && j <= i ? p[j] * inv_sum : 0.0f;
}

// dP → dS in place: dS_j = P_j·(dP_j − Σ_k P_k dP_k)·scale over keys first..i, 0 elsewhere.
__global__ void softmax_backward_kernel(const float* probs, float* d, int64_t t_len,
                                        int64_t total_rows, float scale, const int32_t* segments,
                                        int64_t heads) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= total_rows) return;
  const int64_t i = row % t_len;
  const int64_t first = first_key(segments, row, t_len, heads, i);
  const float* p = probs + row * t_len;
  float* dp = d + row * t_len;
  double dot = 0.0;
  for (int64_t j = first + lane; j <= i; j += 32) dot += static_cast<double>(p[j]) * dp[j];
  const float mean_dp = static_cast<float>(warp_sum(dot));
  for (int64_t j = lane; j < t_len; j += 32) {
    dp[j] = j >= first && j <= i ? p[j] * (dp[j] - mean_dp) * scale : 0.0f;
  }
}

// One block per row: loss = logsumexp − logit[target]; with write_grad the row becomes
// grad_scale·(softmax − onehot). All reads finish (block reductions sync) before any write.
// A negative target is a masked row (ops.h, "Loss masks"): loss 0 and a gradient row of exact
// zeros, as the CPU's masked_row. A target at or past vocab never indexes the row: its loss is
// NaN and its gradient row zero. The backend refuses such targets before launching
// (kernels::check_targets); this keeps a direct caller from reading past the row all the same.
__global__ void cross_entropy_kernel(float* logits, int64_t vocab, const int32_t* targets,
                                     bool write_grad, float grad_scale, float* row_loss) {
  __shared__ double shared_sum[kThreads];
  __shared__ float shared_max[kThreads];
  const int64_t row = blockIdx.x;
  float* l = logits + row * vocab;
  const int32_t target = targets[row];
  if (target < 0 || target >= vocab) {
    if (threadIdx.x == 0) row_loss[row] = target < 0 ? 0.0f : NAN;
    if (write_grad)
      for (int64_t j = threadIdx.x; j < vocab; j += kThreads) l[j] = 0.0f;
    return;
  }
  const float target_logit = l[target];
  float max_value = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) max_value = fmaxf(max_value, l[j]);
  max_value = block_max(max_value, shared_max);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) sum += expf(l[j] - max_value);
  sum = block_sum(sum, shared_sum);
  if (threadIdx.x == 0) {
    row_loss[row] = static_cast<float>(static_cast<double>(max_value) + log(sum) - target_logit);
  }
  if (!write_grad) return;
  const float scale = static_cast<float>(grad_scale / sum);
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float g = expf(l[j] - max_value) * scale;
    l[j] = j == target ? g - grad_scale : g;
  }
}

// *loss = sum of row_loss[0..n) / normalizer (0 when the normalizer is 0: no trained row),
// fixed-order (one block). Masked rows hold 0, so this is the CPU head's sum over trained rows.
__global__ void mean_kernel(const float* row_loss, int64_t n, int64_t normalizer, float* loss) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += row_loss[i];
  const double total = block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = normalizer > 0 ? static_cast<float>(total / static_cast<double>(normalizer)) : 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Host-side helpers
// ---------------------------------------------------------------------------------------------

// Row-major C[M,N] = alpha·op(A)·op(B) + beta·C through column-major cuBLAS: Cᵀ = op(B)ᵀ·op(A)ᵀ.
Status gemm_scaled(const Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // cuBLAS takes int: a size past INT_MAX would wrap silently into a wrong-memory access.
  if (!all_fit_int({m, n, k, lda, ldb, ldc}))
    return make_error(ErrorKind::invalid_argument, "cuBLAS sgemm: a dimension or leading dimension exceeds INT_MAX");
  const cublasStatus_t code = cublasSgemm(
      ctx.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc));
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("sgemm", code);
  return Status();
}

// Row-major C[M,N] = op(A)·op(B) + beta·C.
Status gemm(const Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) {
  return gemm_scaled(ctx, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

// The same over `count` matrices spaced stride_* floats apart.
Status gemm_batched(const Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b,
                    int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                    int64_t stride_c, int64_t count) {
  if (!all_fit_int({m, n, k, lda, ldb, ldc, count}))
    return make_error(ErrorKind::invalid_argument,
                      "cuBLAS sgemm strided batched: a dimension, leading dimension or count exceeds INT_MAX");
  const float one = 1.0f;
  const cublasStatus_t code = cublasSgemmStridedBatched(
      ctx.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b,
      static_cast<int>(ldb), stride_b, a, static_cast<int>(lda), stride_a, &beta, c,
      static_cast<int>(ldc), stride_c, static_cast<int>(count));
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("sgemm strided batched", code);
  return Status();
}

// out[j] += Σ_r in[r, j]; nothing when out is null (a frozen bias: ops.h, "Accumulation").
Status column_sums(const Context& ctx, const float* in, int64_t rows, int64_t cols, float* out) {
  if (out == nullptr) return Status();
  STRATA_CUDA_LAUNCH(column_sums_kernel, blocks_for(cols), kThreads, ctx.stream(), in, rows, cols,
                     out);
  return Status();
}

}  // namespace
}  // namespace strata::kernels::cuda
