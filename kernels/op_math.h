// strata/kernels/op_math.h — the scalar math of the operations (ops.h), written once for the CPU
// and CUDA backends (compiles under nvcc as __host__ __device__), so both evaluate GELU, SiLU
// and RoPE's angles the same way. Internal to kernels/.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ops.h"

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels::op_math {

inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

// tanh(u) = 1 − 2/(e^{2u} + 1): one expf instead of glibc's tanhf (an expm1f and more), which
// profiled at a tenth of a CPU block. The result carries an absolute (not relative) error of
// about 1e-7. GELU itself uses 1 + t, where that is below fp32 rounding; its derivative
// multiplies 1 − t² by up to ~15 (|x| ≈ 5), so there it is ~2e-6 absolute (tanhf: 6e-7;
// measured in tests/backend/test_ops.cpp) — far below what training notices, and the bits every
// backend and the references were checked with. Saturates cleanly: e^{2u} = inf gives 1,
// e^{2u} = 0 gives −1.
STRATA_HOST_DEVICE inline float gelu_tanh_of(float u) { return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f); }

// HF "gelu_new" / "gelu_pytorch_tanh": 0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x³))).
STRATA_HOST_DEVICE inline float gelu_tanh(float x) {
  const float inner = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + gelu_tanh_of(inner));
}

// d gelu_tanh / dx = 0.5·(1 + t) + 0.5·x·(1 − t²)·sqrt(2/pi)·(1 + 3·0.044715·x²), t = tanh(inner).
STRATA_HOST_DEVICE inline float gelu_tanh_derivative(float x) {
  const float inner = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = gelu_tanh_of(inner);
  const float d_inner = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
}

// SiLU's sigmoid: silu(x) = x·sigmoid(x).
STRATA_HOST_DEVICE inline float silu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// RoPE's inverse frequency of pair i: theta^(−2i/D), with Hugging Face's llama3 rope_scaling
// (_compute_llama3_parameters) when spec.factor > 0. In double.
STRATA_HOST_DEVICE inline double rope_inverse_frequency(const ops::RopeSpec& spec, int64_t i) {
  double f = 1.0 / pow(spec.theta, static_cast<double>(2 * i) / static_cast<double>(spec.head_dim));
  if (spec.factor > 0.0) {
    const double old_len = spec.original_max_positions;
    const double low_wavelen = old_len / spec.low_freq_factor;
    const double high_wavelen = old_len / spec.high_freq_factor;
    const double wavelen = 2.0 * 3.14159265358979323846 / f;
    if (wavelen > low_wavelen) {
      f /= spec.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_len / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor);
      f = (1.0 - smooth) * f / spec.factor + smooth * f;
    }
  }
  return f;
}

// The cos and sin of pair i's angle at absolute position `position`: position·inv_freq in
// double, then rounded — so a decode step at position p rotates exactly as a full forward does
// at row p.
STRATA_HOST_DEVICE inline void rope_cos_sin(double inv_freq, int64_t position, float* cos_a, float* sin_a) {
  const double angle = static_cast<double>(position) * inv_freq;
  *cos_a = static_cast<float>(cos(angle));
  *sin_a = static_cast<float>(sin(angle));
}

// rotate_half on one head vector: the pair (i, i + D/2) rotated by the angle (sin negated: its
// transpose, the backward).
STRATA_HOST_DEVICE inline void rope_rotate_pair(float* head, int64_t i, int64_t half, float cos_a, float sin_a) {
  const float a = head[i];
  const float b = head[i + half];
  head[i] = a * cos_a - b * sin_a;
  head[i + half] = b * cos_a + a * sin_a;
}

}  // namespace strata::kernels::op_math
