// strata/kernels/llama/llama_math.h — Llama's scalar math written once for the CPU and CUDA
// kernels (compiles under nvcc as __host__ __device__). Internal to kernels/llama.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/gpt2/gpt2_math.h"  // STRATA_HOST_DEVICE
#include "kernels/llama/llama.h"

namespace strata::kernels::llama {

// RoPE's inverse frequency of pair i: theta^(−2i/D), with Hugging Face's llama3 rope_scaling
// (_compute_llama3_parameters) when config.rope_factor > 0. In double.
STRATA_HOST_DEVICE inline double rope_inverse_frequency(const Config& config, int64_t i) {
  double f = 1.0 / pow(config.rope_theta, static_cast<double>(2 * i) / static_cast<double>(config.head_dim));
  if (config.rope_factor > 0.0) {
    const double old_len = config.rope_original_max_positions;
    const double low_wavelen = old_len / config.rope_low_freq_factor;
    const double high_wavelen = old_len / config.rope_high_freq_factor;
    const double wavelen = 2.0 * 3.14159265358979323846 / f;
    if (wavelen > low_wavelen) {
      f /= config.rope_factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - config.rope_low_freq_factor) / (config.rope_high_freq_factor - config.rope_low_freq_factor);
      f = (1.0 - smooth) * f / config.rope_factor + smooth * f;
    }
  }
  return f;
}

// The k/v head that query head h reads (Hugging Face's repeat_kv: n_head / n_kv_head query
// heads share one).
STRATA_HOST_DEVICE inline int64_t kv_head_of(const Config& config, int64_t h) {
  return h / (config.n_head / config.n_kv_head);
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

STRATA_HOST_DEVICE inline float silu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

}  // namespace strata::kernels::llama
