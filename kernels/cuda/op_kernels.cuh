// strata/kernels/cuda/op_kernels.cuh — the element-wise, row and column kernels of the CUDA
// operations (kernels/ops.h), one copy for every caller: the operations (cuda_ops.cu) and the
// per-model CUDA code they replaced (deleted since) launched these same kernels, so
// a model composed of operations runs the kernels its per-model code ran. Include from .cu files
// only; like cuda_common.cuh (whose reductions, softmax and loss kernels these sit beside) it is
// an unnamed namespace that each .cu file compiles for itself, so no relocatable device code.
//
// Contract
// - Pointers are device memory; rows are dense (`cols` / `c` floats apart) unless a `*_stride`
//   argument says otherwise. Launch shapes: "one warp per row" kernels take
//   blocks_for(rows, kWarpsPerBlock) blocks of kThreads; the rest one thread per element (or per
//   column) in blocks_for(count) blocks of kThreads.
// - Determinism as cublas_context.h says: no atomics; every sum in a fixed order (per-lane strides
//   then the warp butterfly; per-column loops walk the rows in order).
// - The generalisations the operations brought keep the old bits: a norm's weight_offset of 0
//   multiplies by w itself, an embedding scale of 1 multiplies by nothing, and RoPE's angle is
//   op_math.h's for the RopeSpec a model's shape makes of its config (models/).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/op_math.h"
#include "kernels/ops.h"

namespace strata::kernels::op_kernels {
namespace {

using kernels::cuda::kThreads;
using kernels::cuda::kWarpsPerBlock;
using kernels::cuda::warp_sum;

// A norm's gain of column j: w itself when offset is 0 (the bits of no offset), else offset + w
// (a 1 + w gain). Gradients of w are unchanged by it: d(offset + w)/dw = 1.
__device__ inline float norm_gain(const float* w, float offset, int64_t j) {
  return offset == 0.0f ? w[j] : offset + w[j];
}

// --- rows and columns ---

// y[r, j] = bias[j] (+ residual[r, j]).
__global__ void fill_rows_kernel(float* y, const float* bias, const float* residual, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const float b = bias[i % cols];
  y[i] = residual == nullptr ? b : residual[i] + b;
}

// y[r, j] += bias[j]: nn.Linear's bias after the product.
__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] += bias[i % cols];
}

// --- LayerNorm (statistics in double, as on the CPU) ---

// One warp per row: y = (x − mean)·rstd·gain + b, rstd = 1/sqrt(biased variance + eps).
__global__ void layernorm_forward_kernel(const float* x, int64_t x_stride, const float* w, float w_offset,
                                         const float* b, int64_t rows, int64_t c, double eps, float* y, float* mean,
                                         float* rstd) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* x_row = x + row * x_stride;
  double sum = 0.0;
  for (int64_t j = lane; j < c; j += 32) sum += x_row[j];
  const double mu = warp_sum(sum) / static_cast<double>(c);
  double sq = 0.0;
  for (int64_t j = lane; j < c; j += 32) {
    const double d = x_row[j] - mu;
    sq += d * d;
  }
  const double var = warp_sum(sq) / static_cast<double>(c);
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / sqrt(var + eps));
  float* y_row = y + row * c;
  for (int64_t j = lane; j < c; j += 32) y_row[j] = (x_row[j] - m) * rs * norm_gain(w, w_offset, j) + b[j];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dx (+)= rstd·(dy·gain − mean(dy·gain) − x̂·mean(dy·gain·x̂)); one warp per row.
__global__ void layernorm_backward_dx_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                             const float* w, float w_offset, int64_t rows, int64_t c, float* dx,
                                             bool accumulate) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* dy_row = dy + row * c;
  const float* x_row = x + row * c;
  const float mu = mean[row];
  const float rs = rstd[row];
  double s1 = 0.0;
  double s2 = 0.0;
  for (int64_t j = lane; j < c; j += 32) {
    const float dxhat = dy_row[j] * norm_gain(w, w_offset, j);
    const float xhat = (x_row[j] - mu) * rs;
    s1 += dxhat;
    s2 += static_cast<double>(dxhat) * xhat;
  }
  const float m1 = static_cast<float>(warp_sum(s1) / static_cast<double>(c));
  const float m2 = static_cast<float>(warp_sum(s2) / static_cast<double>(c));
  float* dx_row = dx + row * c;
  for (int64_t j = lane; j < c; j += 32) {
    const float xhat = (x_row[j] - mu) * rs;
    const float g = rs * (dy_row[j] * norm_gain(w, w_offset, j) - m1 - xhat * m2);
    dx_row[j] = accumulate ? dx_row[j] + g : g;
  }
}

// dw[j] += Σ_r dy·x̂, db[j] += Σ_r dy; one thread per column walking the rows in order.
__global__ void layernorm_backward_params_kernel(const float* dy, const float* x, const float* mean,
                                                 const float* rstd, int64_t rows, int64_t c, float* dw, float* db) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  double acc_w = 0.0;
  double acc_b = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = dy[r * c + j];
    acc_w += static_cast<double>(g) * ((x[r * c + j] - mean[r]) * rstd[r]);
    acc_b += g;
  }
  dw[j] += static_cast<float>(acc_w);
  db[j] += static_cast<float>(acc_b);
}

// --- RMSNorm ---

// One warp per row: y = gain·x·rstd, rstd = 1/sqrt(mean(x²) + eps), the sum of squares in double.
__global__ void rmsnorm_forward_kernel(const float* x, int64_t x_stride, const float* w, float w_offset, int64_t rows,
                                       int64_t c, double eps, float* y, float* rstd) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* x_row = x + row * x_stride;
  double sq = 0.0;
  for (int64_t j = lane; j < c; j += 32) sq += static_cast<double>(x_row[j]) * x_row[j];
  const auto rs = static_cast<float>(1.0 / sqrt(warp_sum(sq) / static_cast<double>(c) + eps));
  float* y_row = y + row * c;
  for (int64_t j = lane; j < c; j += 32) y_row[j] = norm_gain(w, w_offset, j) * (x_row[j] * rs);
  if (lane == 0) rstd[row] = rs;
}

// dx (+)= rstd·(dy·gain) − x·rstd³·mean(dy·gain·x); one warp per row.
__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const float* rstd, const float* w,
                                           float w_offset, int64_t rows, int64_t c, float* dx, bool accumulate) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* dy_row = dy + row * c;
  const float* x_row = x + row * c;
  const float rs = rstd[row];
  double dot = 0.0;
  for (int64_t j = lane; j < c; j += 32) dot += static_cast<double>(dy_row[j] * norm_gain(w, w_offset, j)) * x_row[j];
  const auto coef = static_cast<float>(warp_sum(dot) / static_cast<double>(c) * rs * rs * rs);
  float* dx_row = dx + row * c;
  for (int64_t j = lane; j < c; j += 32) {
    const float g = rs * (dy_row[j] * norm_gain(w, w_offset, j)) - x_row[j] * coef;
    dx_row[j] = accumulate ? dx_row[j] + g : g;
  }
}

// dw[j] += Σ_r dy·x·rstd; one thread per column walking the rows in order.
__global__ void rmsnorm_backward_w_kernel(const float* dy, const float* x, const float* rstd, int64_t rows, int64_t c,
                                          float* dw) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  double acc = 0.0;
  for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(dy[r * c + j]) * (x[r * c + j] * rstd[r]);
  dw[j] += static_cast<float>(acc);
}

// --- RoPE ---

// rotate_half RoPE of every head of [rows, heads·D] in place, one thread per pair: row r at
// position first_position + (positions[r] for packed rows, else r % t_len) — the CPU op's
// tables hold positions first_position…, indexed by the packed or the in-row position — the
// angle in double (op_math.h) per pair. `sign` −1 applies the transpose (the backward).
__global__ void rope_kernel(ops::RopeSpec spec, float* x, int64_t rows, int64_t t_len, int64_t first_position,
                            int64_t heads, float sign, const int32_t* positions) {
  const int64_t half = spec.head_dim / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * heads * half) return;
  const int64_t pair = i % half;
  const int64_t row_head = i / half;
  const int64_t row = row_head / heads;
  const int64_t position = first_position + (positions == nullptr ? row % t_len : positions[row]);
  float c = 0.0f;
  float s = 0.0f;
  op_math::rope_cos_sin(op_math::rope_inverse_frequency(spec, pair), position, &c, &s);
  op_math::rope_rotate_pair(x + row_head * spec.head_dim, pair, half, c, sign * s);
}

// --- activations ---

__global__ void gelu_forward_kernel(const float* in, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = op_math::gelu_tanh(in[i]);
}

__global__ void gelu_backward_kernel(float* d, const float* pre, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) d[i] *= op_math::gelu_tanh_derivative(pre[i]);
}

// SwiGLU: act = silu(gate)·up.
__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* act, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) act[i] = gate[i] * op_math::silu_sigmoid(gate[i]) * up[i];
}

// gate and up become their gradients in place (up read before it is overwritten).
__global__ void swiglu_backward_kernel(const float* d_act, float* gate, float* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = gate[i];
  const float s = op_math::silu_sigmoid(x);
  const float da = d_act[i];
  gate[i] = da * up[i] * (s * (1.0f + x * (1.0f - s)));
  up[i] = da * x * s;
}

// GeGLU: act = gelu_tanh(gate)·up.
__global__ void geglu_forward_kernel(const float* gate, const float* up, float* act, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) act[i] = op_math::gelu_tanh(gate[i]) * up[i];
}

// d_gate = d_act·up·gelu'(gate), d_up = d_act·gelu(gate), in place as SwiGLU's.
__global__ void geglu_backward_kernel(const float* d_act, float* gate, float* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = gate[i];
  const float da = d_act[i];
  gate[i] = da * up[i] * op_math::gelu_tanh_derivative(x);
  up[i] = da * op_math::gelu_tanh(x);
}

// --- embedding ---

// x[r, j] = table[token_r, j] + pos_table[p_r, j] with learned positions (p_r = positions[r]
// for packed rows, else r % t_len), else table[token_r, j]·scale (scale 1: the row itself).
__global__ void embedding_forward_kernel(const int32_t* tokens, const int32_t* positions, const float* table,
                                         const float* pos_table, float scale, int64_t rows, int64_t t_len, int64_t c,
                                         float* x) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * c) return;
  const int64_t r = i / c;
  const int64_t j = i % c;
  const float value = table[static_cast<int64_t>(tokens[r]) * c + j];
  if (pos_table != nullptr) {
    const int64_t position = positions == nullptr ? r % t_len : positions[r];
    x[i] = value + pos_table[position * c + j];
  } else {
    x[i] = scale != 1.0f ? value * scale : value;
  }
}

// d_table[token_r, j] += scale·d_x[r, j] (scale 1: d_x itself); one thread per column walks the
// rows in order, so repeated tokens add in row order.
__global__ void embedding_backward_table_kernel(const int32_t* tokens, const float* d_x, int64_t rows, int64_t c,
                                                float scale, float* d_table) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = d_x[r * c + j];
    d_table[static_cast<int64_t>(tokens[r]) * c + j] += scale != 1.0f ? g * scale : g;
  }
}

// Packed rows: d_pos[positions[r], j] += d_x[r, j], one thread per column walking the rows in
// order (positions repeat within a row, so one thread per (t, j) would race).
__global__ void embedding_backward_positions_packed_kernel(const int32_t* positions, const float* d_x, int64_t rows,
                                                           int64_t c, float* d_pos) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  for (int64_t r = 0; r < rows; ++r) d_pos[static_cast<int64_t>(positions[r]) * c + j] += d_x[r * c + j];
}

// d_pos[t, j] += Σ_b d_x[b, t, j] in b order (one thread per (t, j): the rows of position t are
// b·T + t, the order the CPU's row walk adds them).
__global__ void embedding_backward_positions_kernel(const float* d_x, int64_t batch, int64_t t_len, int64_t c,
                                                    float* d_pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= t_len * c) return;
  float acc = d_pos[i];
  for (int64_t b = 0; b < batch; ++b) acc += d_x[b * t_len * c + i];
  d_pos[i] = acc;
}

}  // namespace
}  // namespace strata::kernels::op_kernels
