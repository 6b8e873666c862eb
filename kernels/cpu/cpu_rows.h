// strata/kernels/cpu/cpu_rows.h — the CPU's per-row helpers, written once: the loops of the CPU
// backend's ops (cpu_ops.cpp, cpu_math.cpp), the LoRA op, and the reference kernels the
// composed models are held to (tests/reference) all call these, so they round alike.
// CPU-only; internal to kernels/ and its reference tests (callers use backend.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"  // count_trained_targets

namespace strata::kernels::cpu_rows {

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
inline LayerNormStats layernorm_stats(const float* x, int64_t n, double eps) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const double mean = sum / static_cast<double>(n);
  double sq = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = x[j] - mean;
    sq += d * d;
  }
  const double var = sq / static_cast<double>(n);
  return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(var + eps))};
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

// A masked row (negative target, ops.h count_trained_targets' "Loss masks"): no loss, and with write_grad a gradient
// row of exact zeros, so the head's GEMMs carry nothing of it into any parameter.
inline float masked_row(float* logits, int64_t n, bool write_grad) {
  if (write_grad)
    for (int64_t j = 0; j < n; ++j) logits[j] = 0.0f;
  return 0.0f;
}

// N of ops.h's "Loss masks": the caller's, or this batch's count of trained rows.
inline int64_t resolve_loss_normalizer(const int32_t* targets, int64_t rows, int64_t loss_normalizer_tokens) {
  if (loss_normalizer_tokens > 0) return loss_normalizer_tokens;
  return count_trained_targets(targets, rows);
}

}  // namespace strata::kernels::cpu_rows
