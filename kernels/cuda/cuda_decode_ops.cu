// The CUDA backend's decoding operations (cuda_decode_ops.h): a new position's k and v into the
// cache, attention over the cache, and products on the store's bf16 weights.
#include "kernels/cuda/cuda_decode_ops.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"

namespace strata::kernels::cuda {
namespace {

namespace gc = ::strata::kernels::cuda;
using gc::check_launch;  // STRATA_CUDA_LAUNCH names it unqualified

// One block per (new row r = first_row + blockIdx.x / n_head, query head h = blockIdx.x % n_head):
// p_j = softmax_j(scale·q·k_j) over cache positions 0..past+r, then out = Σ_j p_j v_j in position
// order; query head h reads k/v head h / group. `scores` [launched rows, n_head, max_positions].
// The same math as the per-model decode attention kernel it replaced (multi-head is its group-1 case), with
// the strides an op gives. Max and sum by fixed block trees, the sum in double: no atomics. A
// block's result depends on its row alone, so launching the rows in groups changes no bit.
__global__ void attention_decode_kernel(const float* q, int64_t q_stride, const float* keys, const float* values,
                                        int64_t kv_stride, float* out, int64_t out_stride, int64_t past,
                                        int64_t first_row, int64_t n_head, int64_t group, int64_t head_dim,
                                        int64_t max_positions, float scale, float* scores) {
  __shared__ double sum_shared[gc::kThreads];
  __shared__ float max_shared[gc::kThreads];
  const int64_t local_row = blockIdx.x / n_head;
  const int64_t r = first_row + local_row;
  const int64_t h = blockIdx.x % n_head;
  const int64_t d = head_dim;
  const int64_t kv = h / group;
  const int64_t count = past + r + 1;
  const float* q_row = q + r * q_stride + h * d;
  float* p = scores + (local_row * n_head + h) * max_positions;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < count; j += gc::kThreads) {
    const float* k = keys + j * kv_stride + kv * d;
    float dot = 0.0f;
    for (int64_t e = 0; e < d; ++e) dot += q_row[e] * k[e];
    p[j] = dot * scale;
    local_max = fmaxf(local_max, p[j]);
  }
  const float max_value = gc::block_max(local_max, max_shared);
  double local_sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += gc::kThreads) {
    p[j] = expf(p[j] - max_value);
    local_sum += p[j];
  }
  const auto inv_sum = static_cast<float>(1.0 / gc::block_sum(local_sum, sum_shared));
  __syncthreads();  // every p_j written before any thread reads them all
  for (int64_t e = threadIdx.x; e < d; e += gc::kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += (p[j] * inv_sum) * values[j * kv_stride + kv * d + e];
    out[r * out_stride + h * d + e] = acc;
  }
}

// dst[i, j] = W[i, j] widened (the bf16 bits in the top half of an fp32: exact) for the
// [rows, cols] block of a bf16 matrix whose rows are src_stride apart; dst row-major [rows, cols].
__global__ void widen_bf16_kernel(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols;
  const int64_t c = i % cols;
  dst[i] = __uint_as_float(static_cast<uint32_t>(src[r * src_stride + c]) << 16);
}

Status widen_bf16(cudaStream_t stream, const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols,
                  float* dst) {
  assert(rows > 0 && cols > 0 && src_stride >= cols);
  assert(gc::blocks_for(rows * cols) <= static_cast<unsigned>(std::numeric_limits<int>::max()));
  STRATA_CUDA_LAUNCH(widen_bf16_kernel, gc::blocks_for(rows * cols), gc::kThreads, stream, src, src_stride, rows,
                     cols, dst);
  return Status();
}

}  // namespace

size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions) {
  const int64_t score_rows = std::min(max_rows, gc::kDecodeScoreRows);
  return static_cast<size_t>(score_rows * n_head * max_positions) * sizeof(float);
}

size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out) {
  const int64_t piece_slices = std::min(kDecodeHeadPieceRows, std::max(max_in, max_out));
  return static_cast<size_t>(piece_slices * std::min(max_in, max_out)) * sizeof(float);
}

Status copy_rows(const ops::CopyRows& op, cudaStream_t stream) {
  assert(op.rows >= 0 && op.cols >= 0);
  if (op.rows == 0 || op.cols == 0) return Status();
  const size_t row_bytes = static_cast<size_t>(op.cols) * sizeof(float);
  cudaError_t code = cudaSuccess;
  // One row, or rows back to back on both sides: one plain copy (cudaMemcpy2DAsync would refuse
  // a single row's stride below its width, which the op leaves free).
  if (op.rows == 1 || (op.dst_stride == op.cols && op.src_stride == op.cols)) {
    code = cudaMemcpyAsync(op.dst, op.src, static_cast<size_t>(op.rows) * row_bytes, cudaMemcpyDeviceToDevice, stream);
  } else {
    assert(op.dst_stride >= op.cols && op.src_stride >= op.cols);
    code = cudaMemcpy2DAsync(op.dst, static_cast<size_t>(op.dst_stride) * sizeof(float), op.src,
                             static_cast<size_t>(op.src_stride) * sizeof(float), row_bytes,
                             static_cast<size_t>(op.rows), cudaMemcpyDeviceToDevice, stream);
  }
  if (code != cudaSuccess) return gc::cuda_error("memcpy rows (copy_rows)", code);
  return Status();
}

Status attention_decode(const ops::AttentionDecode& op, cudaStream_t stream) {
  assert(op.past >= 0 && op.rows > 0 && op.past + op.rows <= op.max_positions);
  assert(op.n_kv_head > 0 && op.n_head % op.n_kv_head == 0 && op.head_dim > 0);
  assert(op.scratch.size_bytes >= attention_decode_scratch_bytes(op.rows, op.n_head, op.max_positions));
  const int64_t group = op.n_head / op.n_kv_head;
  for (int64_t first = 0; first < op.rows; first += gc::kDecodeScoreRows) {
    const int64_t launched = std::min(gc::kDecodeScoreRows, op.rows - first);
    STRATA_CUDA_LAUNCH(attention_decode_kernel, static_cast<unsigned>(launched * op.n_head), gc::kThreads, stream,
                       op.q, op.q_stride, op.keys, op.values, op.kv_stride, op.out, op.out_stride, op.past, first,
                       op.n_head, group, op.head_dim, op.max_positions, op.scale, op.scratch.data);
  }
  return Status();
}

// y[rows, out] (+)= x[rows, in]·W through cuBLAS's row-major gemm (cuda_common.cuh), W stored
// [out, in] (w_out_major: x·Wᵀ) or [in, out] (x·W), widened a piece at a time into the scratch.
// The pieces run in order on the Context's stream, so a piece is widened only after the product
// before it has read the scratch.
Status matmul_bf16(const kernels::cuda::Context& ctx, const ops::MatmulBf16& op) {
  assert(op.rows > 0 && op.in > 0 && op.out > 0);
  assert(op.scratch.size_bytes >= matmul_bf16_scratch_bytes(op.in, op.out));
  const int64_t capacity = static_cast<int64_t>(op.scratch.size_bytes / sizeof(float));
  float* piece = op.scratch.data;
  // Bands of output columns: each y element is one dot product over all of `in`.
  const int64_t out_band = std::min({op.out, kDecodeHeadPieceRows, capacity / op.in});
  if (out_band > 0) {
    const float beta = op.accumulate ? 1.0f : 0.0f;
    for (int64_t o0 = 0; o0 < op.out; o0 += out_band) {
      const int64_t n = std::min(out_band, op.out - o0);
      if (op.w_out_major) {  // W[o0.., :]: n whole rows → piece [n, in]; y[:, o0..] = x·pieceᵀ
        STRATA_RETURN_IF_ERROR(widen_bf16(ctx.stream(), op.w + o0 * op.in, op.in, n, op.in, piece));
        STRATA_RETURN_IF_ERROR(
            gc::gemm(ctx, false, true, op.rows, n, op.in, op.x, op.in, piece, op.in, beta, op.y + o0, op.out));
      } else {  // W[:, o0..]: n columns of every row → piece [in, n]; y[:, o0..] = x·piece
        STRATA_RETURN_IF_ERROR(widen_bf16(ctx.stream(), op.w + o0, op.out, op.in, n, piece));
        STRATA_RETURN_IF_ERROR(
            gc::gemm(ctx, false, false, op.rows, n, op.in, op.x, op.in, piece, n, beta, op.y + o0, op.out));
      }
    }
    return Status();
  }
  // Not one output column's weights fit (in past the capacity): bands along `in` instead, the
  // first overwriting y (unless accumulating), each later one added. The scratch bound holds
  // out × min(in, kDecodeHeadPieceRows) in this case, so a band is never empty.
  const int64_t in_band = std::min({op.in, kDecodeHeadPieceRows, capacity / op.out});
  assert(in_band > 0);
  for (int64_t i0 = 0; i0 < op.in; i0 += in_band) {
    const int64_t k = std::min(in_band, op.in - i0);
    const float beta = i0 == 0 && !op.accumulate ? 0.0f : 1.0f;
    if (op.w_out_major) {  // W[:, i0..]: k columns of every row → piece [out, k]; y (+)= x[:, i0..]·pieceᵀ
      STRATA_RETURN_IF_ERROR(widen_bf16(ctx.stream(), op.w + i0, op.in, op.out, k, piece));
      STRATA_RETURN_IF_ERROR(
          gc::gemm(ctx, false, true, op.rows, op.out, k, op.x + i0, op.in, piece, k, beta, op.y, op.out));
    } else {  // W[i0.., :]: k whole rows → piece [k, out]; y (+)= x[:, i0..]·piece
      STRATA_RETURN_IF_ERROR(widen_bf16(ctx.stream(), op.w + i0 * op.out, op.out, k, op.out, piece));
      STRATA_RETURN_IF_ERROR(
          gc::gemm(ctx, false, false, op.rows, op.out, k, op.x + i0, op.in, piece, op.out, beta, op.y, op.out));
    }
  }
  return Status();
}

}  // namespace strata::kernels::cuda
