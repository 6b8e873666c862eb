// strata/kernels/gpt2/gpt2_math.h — GPT-2's element-wise math, written once.
// The scalar functions at the top compile for host and device (nvcc), so the CPU kernels and
// the CUDA kernels evaluate GELU the same way. The row helpers below them are CPU-only.
// Internal to kernels/gpt2; callers use gpt2.h.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/op_math.h"  // STRATA_HOST_DEVICE and the scalar math, shared with every op

namespace strata::kernels::gpt2 {

inline constexpr float kLayerNormEps = 1e-5f;
using op_math::gelu_tanh;
using op_math::gelu_tanh_derivative;
using op_math::gelu_tanh_of;

using kernels::WorkspaceCarver;  // ops.h's

// The decode workspace of every model's decode ops, CPU and CUDA (gpt2.h / llama.h,
// "Decoding"): the model's block layout for the new rows (its attention scratch unused), then
// `score_floats` of attention scores (a row of max_positions per head; per new row on CUDA).
template <class BlockLayout>
struct DecodeLayout {
  BlockLayout block;
  float* scores;
  size_t size_bytes;
};
template <class BlockLayout>
DecodeLayout<BlockLayout> decode_layout_after(const BlockLayout& block, int64_t score_floats, float* base) {
  WorkspaceCarver carve(base == nullptr ? nullptr : base + block.size_bytes / sizeof(float));
  float* scores = carve.take(score_floats);
  return DecodeLayout<BlockLayout>{block, scores, block.size_bytes + carve.used_bytes()};
}
// A head decode's scratch: one normed row and `statistics` one-float slices (mean, rstd); the
// logits go to the caller's buffer, so a 50k vocabulary needs no chunk × vocab scratch.
inline size_t head_decode_scratch_bytes(int64_t n_embd, int statistics) {
  WorkspaceCarver carve(nullptr);
  carve.take(n_embd);
  for (int i = 0; i < statistics; ++i) carve.take(1);
  return carve.used_bytes();
}

#ifndef __CUDACC__

// y[0..n) += a·x[0..n). Written with 8-float vectors so GCC emits SIMD at -O2 (its cheap cost
// model will not vectorize the plain loop); each y element is still one multiply and one add,
// so the vector body and the scalar tail round identically.
inline void axpy(float a, const float* __restrict x, float* __restrict y, int64_t n) {
  typedef float v8f __attribute__((vector_size(32)));
  const v8f av = {a, a, a, a, a, a, a, a};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f xv;
    v8f yv;
    __builtin_memcpy(&xv, x + i, sizeof(xv));
    __builtin_memcpy(&yv, y + i, sizeof(yv));
    yv += av * xv;
    __builtin_memcpy(y + i, &yv, sizeof(yv));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

struct LayerNormStats {
  float mean;
  float rstd;
};

// Mean and 1/sqrt(biased variance + eps) of one row, two passes in double.
inline LayerNormStats layernorm_stats(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = x[j] - mean;
    sq += d * d;
  }
  const double var = sq / static_cast<double>(n);
  return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(var + kLayerNormEps))};
}

// p[0..n) = softmax(scale·p[0..n)), in place; the sum in double, in index order.
inline void softmax_scaled_inplace(float* p, int64_t n, float scale) {
  float max_value = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    p[j] *= scale;
    max_value = p[j] > max_value ? p[j] : max_value;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = expf(p[j] - max_value);
    sum += p[j];
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) p[j] *= inv_sum;
}

// Cross-entropy of one row of logits against `target`: logsumexp − logit[target]. With
// write_grad the row becomes grad_scale·(softmax − onehot(target)) in place.
inline float cross_entropy_row(float* logits, int64_t n, int32_t target, bool write_grad,
                               float grad_scale) {
  const float target_logit = logits[target];
  float max_value = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max_value = logits[j] > max_value ? logits[j] : max_value;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = expf(logits[j] - max_value);
    sum += e;
    if (write_grad) logits[j] = e;
  }
  const double lse = static_cast<double>(max_value) + std::log(sum);
  if (write_grad) {
    const float scale = static_cast<float>(grad_scale / sum);
    for (int64_t j = 0; j < n; ++j) logits[j] *= scale;
    logits[target] -= grad_scale;
  }
  return static_cast<float>(lse - target_logit);
}

// A masked row (negative target, gpt2.h "Loss masks"): no loss, and with write_grad a gradient
// row of exact zeros, so the head's GEMMs carry nothing of it into any parameter.
inline float masked_row(float* logits, int64_t n, bool write_grad) {
  if (write_grad)
    for (int64_t j = 0; j < n; ++j) logits[j] = 0.0f;
  return 0.0f;
}

// N of gpt2.h's "Loss masks": the caller's, or this batch's count of trained rows.
inline int64_t resolve_loss_normalizer(const int32_t* targets, int64_t rows, int64_t loss_normalizer_tokens) {
  if (loss_normalizer_tokens > 0) return loss_normalizer_tokens;
  int64_t count = 0;
  for (int64_t row = 0; row < rows; ++row) count += targets[row] >= 0 ? 1 : 0;
  return count;
}

#endif  // !__CUDACC__

}  // namespace strata::kernels::gpt2
