// strata/kernels/optim/elementwise.h — the per-element math of the casts and of AdamW, written
// once for the CPU (scalar path and vector tails) and for CUDA device code.
//
// Contract: pure functions on values, any thread, no state. Every operation is one IEEE-754
// binary32 operation rounded to nearest even, in the exact order PyTorch 1.13 performs it on
// CPU, so the scalar path, the AVX2 path and the CUDA kernels give identical bits:
//   * on the host the including translation unit must be compiled with -ffp-contract=off (the
//     optim CPU library is) so `a * b + c` is never fused behind our back; the one fused
//     multiply-add PyTorch does is spelled out with fmaf;
//   * in device code nvcc would fuse by default, so each operation uses its _rn intrinsic.
// Why fused where PyTorch fuses: torch's `add_(x, alpha=a)` and `addcmul_` compile to one FMA
// on x86 (checked bit for bit against torch.optim.AdamW), so ours must too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::kernels::detail {

STRATA_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// a * b + c with one rounding.
STRATA_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

STRATA_HOST_DEVICE inline uint32_t float_to_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}
STRATA_HOST_DEVICE inline float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// --- bf16 -------------------------------------------------------------------------------------
// PyTorch's tensor conversion (its vectorized kernel, used for every contiguous tensor, even of
// length 1): round to nearest even on the upper 16 bits; every NaN becomes 0xFFFF. (Only the
// 0-dim scalar path gives 0x7FC0; tensors never do.)
inline constexpr uint16_t kBf16NaNBits = 0xFFFF;

STRATA_HOST_DEVICE inline uint16_t fp32_bits_to_bf16_bits(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaNBits;
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}
STRATA_HOST_DEVICE inline uint16_t fp32_to_bf16_bits(float value) {
  return fp32_bits_to_bf16_bits(float_to_bits(value));
}
// Exact: bf16 is the top half of an fp32; NaN payloads and the quiet bit pass through unchanged.
STRATA_HOST_DEVICE inline float bf16_bits_to_fp32(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

// --- fp16 (IEEE binary16) ---------------------------------------------------------------------
// fp32 → fp16: round to nearest even, subnormals kept, overflow to ±inf. A NaN becomes the
// canonical quiet NaN 0x7E00 with its sign kept, as PyTorch does (its payload is dropped).
STRATA_HOST_DEVICE inline uint16_t fp32_bits_to_fp16_bits(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;
  // 0x477FF000 is halfway between 65504 (largest half, odd mantissa) and 65536: the tie rounds
  // to the even neighbour, which is infinity.
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;
  if (magnitude >= 0x38800000u) {  // a normal half (>= 2^-14): rebias 127 → 15, keep 10 bits
    const uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  // Subnormal half: the result counts units of 2^-24. 2^-25 itself is a tie that rounds to 0.
  if (magnitude <= 0x33000000u) return sign;
  const uint32_t exponent = magnitude >> 23;                        // 102..112 here
  const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;    // implicit bit restored
  const uint32_t shift = 126u - exponent;                           // 14..24
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (remainder > half || (remainder == half && (result & 1u) != 0)) ++result;
  return static_cast<uint16_t>(sign | result);
}
STRATA_HOST_DEVICE inline uint16_t fp32_to_fp16_bits(float value) {
  return fp32_bits_to_fp16_bits(float_to_bits(value));
}
// fp16 → fp32 is exact. A NaN keeps its sign and payload and gets the quiet bit set (what both
// PyTorch and F16C's vcvtph2ps do).
STRATA_HOST_DEVICE inline uint32_t fp16_bits_to_fp32_bits(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu;
  uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) {
    return mantissa == 0 ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return sign;
    uint32_t biased = 113;  // fp32 exponent of 2^-14, lowered once per normalising shift
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --biased;
    }
    return sign | (biased << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return sign | ((exponent + 112u) << 23) | (mantissa << 13);
}
STRATA_HOST_DEVICE inline float fp16_bits_to_fp32(uint16_t half) {
  return bits_to_float(fp16_bits_to_fp32_bits(half));
}

// --- AdamW --------------------------------------------------------------------------------------
// The fp32 constants of one step. PyTorch computes them in double on the host (Python floats)
// and each is rounded to fp32 where it meets a float tensor; `adamw_step_scalars` in adamw.h
// does the same, so these are the exact operands torch's kernels see.
struct AdamWStepScalars {
  float decay;              // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;      // -lr / (1 - beta1^step)
  float grad_scale;         // gradients are multiplied by this first (1 = unscaled: exact)
};

// One element of torch 1.13's _single_tensor_adamw (and of _multi_tensor_adamw, which does the
// same operations), in its order:
//   p.mul_(decay); m.mul_(b1).add_(g, alpha=1-b1); v.mul_(b2).addcmul_(g, g, value=1-b2);
//   denom = (v.sqrt() / bc2_sqrt).add_(eps); p.addcdiv_(m, denom, value=-step_size)
// addcdiv computes p + (value * m) / denom; add_ with alpha and addcmul each fuse into one FMA.
STRATA_HOST_DEVICE inline void adamw_element(const AdamWStepScalars& s, float grad, float& param,
                                             float& exp_avg, float& exp_avg_sq) {
  const float g = mul_rn(grad, s.grad_scale);
  const float p = mul_rn(param, s.decay);
  const float m = fma_rn(g, s.one_minus_beta1, mul_rn(exp_avg, s.beta1));
  const float v = fma_rn(mul_rn(s.one_minus_beta2, g), g, mul_rn(exp_avg_sq, s.beta2));
  const float denom = add_rn(div_rn(sqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  param = add_rn(p, div_rn(mul_rn(s.neg_step_size, m), denom));
  exp_avg = m;
  exp_avg_sq = v;
}

}  // namespace strata::kernels::detail
