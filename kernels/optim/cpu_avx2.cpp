// The AVX2 + FMA + F16C single-thread loops. Each function carries the target attribute
// itself, so this file builds with the baseline flags and the code only runs where
// detect_cpu_isa() found those extensions. Eight fp32 lanes per step; the last count % 8
// elements go through the scalar element functions, which give the same bits (elementwise.h).
// Built with -ffp-contract=off: the one FMA per moment is written out, nothing else is fused.
#include <immintrin.h>

#include "kernels/optim/cpu_kernels.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::kernels::detail {
namespace {

// 8 fp32 → 8 bf16 patterns, torch's rounding: (bits + 0x7FFF + lsb) >> 16, NaN → 0xFFFF.
STRATA_AVX2 inline __m128i fp32x8_to_bf16x8(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256 is_nan = _mm256_cmp_ps(value, value, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(kBf16NaNBits), _mm256_castps_si256(is_nan));
  // Every lane is <= 0xFFFF, so the unsigned-saturating pack is a plain narrowing.
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

// 8 fp32 → 8 fp16 patterns: vcvtps2ph rounds to nearest even with subnormals and overflow as
// IEEE says; only its NaN differs from torch's (it keeps the payload), so NaN lanes are
// replaced by 0x7E00 | sign.
STRATA_AVX2 inline __m128i fp32x8_to_fp16x8(__m256 value) {
  __m128i half = _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 is_nan = _mm256_cmp_ps(value, value, _CMP_UNORD_Q);
  if (_mm256_movemask_ps(is_nan) != 0) {  // rare: keep the common path two instructions
    const __m256i bits = _mm256_castps_si256(value);
    const __m256i canonical = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)),
        _mm256_set1_epi32(0x7E00));
    const __m128i canonical16 = _mm_packus_epi32(_mm256_castsi256_si128(canonical),
                                                 _mm256_extracti128_si256(canonical, 1));
    const __m256i mask32 = _mm256_castps_si256(is_nan);
    const __m128i mask16 = _mm_packs_epi32(_mm256_castsi256_si128(mask32),
                                           _mm256_extracti128_si256(mask32, 1));
    half = _mm_blendv_epi8(half, canonical16, mask16);
  }
  return half;
}

STRATA_AVX2 inline __m256 bf16x8_to_fp32x8(const uint16_t* src) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

STRATA_AVX2 inline void store8(uint16_t* dst, __m128i value) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), value);
}

STRATA_AVX2 inline __m256 load_grads8(const float* grads) { return _mm256_loadu_ps(grads); }
STRATA_AVX2 inline __m256 load_grads8(const uint16_t* grads) { return bf16x8_to_fp32x8(grads); }
inline float widen(float grad) { return grad; }
inline float widen(uint16_t grad_bf16) { return bf16_bits_to_fp32(grad_bf16); }

template <DType kCopy, typename Grad>
STRATA_AVX2 void adamw_loop(const AdamWStepScalars& s, float* params, const Grad* grads,
                            float* exp_avg, float* exp_avg_sq, uint16_t* copy, size_t count) {
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
  const __m256 decay = _mm256_set1_ps(s.decay);
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 bias_correction2_sqrt = _mm256_set1_ps(s.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step_size = _mm256_set1_ps(s.neg_step_size);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // Same operations, same order as adamw_element.
    const __m256 g = _mm256_mul_ps(load_grads8(grads + i), grad_scale);
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(params + i), decay);
    const __m256 m = _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(exp_avg + i), beta1));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g,
                                     _mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bias_correction2_sqrt), eps);
    const __m256 updated = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom));
    _mm256_storeu_ps(params + i, updated);
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
    if constexpr (kCopy == DType::bf16) store8(copy + i, fp32x8_to_bf16x8(updated));
    if constexpr (kCopy == DType::f16) store8(copy + i, fp32x8_to_fp16x8(updated));
  }
  for (; i < count; ++i) {
    adamw_element(s, widen(grads[i]), params[i], exp_avg[i], exp_avg_sq[i]);
    if constexpr (kCopy == DType::bf16) copy[i] = fp32_to_bf16_bits(params[i]);
    if constexpr (kCopy == DType::f16) copy[i] = fp32_to_fp16_bits(params[i]);
  }
}

template <typename Grad>
STRATA_AVX2 void adamw_dispatch_copy(const AdamWStepScalars& s, float* params, const Grad* grads,
                                     float* exp_avg, float* exp_avg_sq, DType copy_dtype,
                                     uint16_t* copy, size_t count) {
  switch (copy_dtype) {
    case DType::bf16:
      return adamw_loop<DType::bf16>(s, params, grads, exp_avg, exp_avg_sq, copy, count);
    case DType::f16:
      return adamw_loop<DType::f16>(s, params, grads, exp_avg, exp_avg_sq, copy, count);
    case DType::f32:
      return adamw_loop<DType::f32>(s, params, grads, exp_avg, exp_avg_sq, copy, count);
  }
}

// Lanes 0-3 in `low`, 4-7 in `high`: element i of the block lands in lane i % 8, as in the
// scalar loop; x*x is exact in double, so the FMA rounds exactly where the scalar add does.
template <typename Value>
STRATA_AVX2 double sum_squares_loop(const Value* values, size_t count) {
  __m256d low = _mm256_setzero_pd();
  __m256d high = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 x = load_grads8(values + i);
    const __m256d x_low = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d x_high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    low = _mm256_fmadd_pd(x_low, x_low, low);
    high = _mm256_fmadd_pd(x_high, x_high, high);
  }
  double lanes[kSumSquaresLanes];
  _mm256_storeu_pd(lanes, low);
  _mm256_storeu_pd(lanes + 4, high);
  for (size_t lane = 0; i < count; ++i, ++lane) {
    const double x = widen(values[i]);
    lanes[lane] += x * x;
  }
  return combine_sum_squares_lanes(lanes);
}

}  // namespace

STRATA_AVX2 void cast_fp32_to_bf16_avx2(const float* src, uint16_t* dst, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) store8(dst + i, fp32x8_to_bf16x8(_mm256_loadu_ps(src + i)));
  for (; i < count; ++i) dst[i] = fp32_to_bf16_bits(src[i]);
}
STRATA_AVX2 void cast_bf16_to_fp32_avx2(const uint16_t* src, float* dst, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, bf16x8_to_fp32x8(src + i));
  for (; i < count; ++i) dst[i] = bf16_bits_to_fp32(src[i]);
}
STRATA_AVX2 void cast_fp32_to_fp16_avx2(const float* src, uint16_t* dst, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) store8(dst + i, fp32x8_to_fp16x8(_mm256_loadu_ps(src + i)));
  for (; i < count; ++i) dst[i] = fp32_to_fp16_bits(src[i]);
}
STRATA_AVX2 void cast_fp16_to_fp32_avx2(const uint16_t* src, float* dst, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // vcvtph2ps is exact and quiets a signalling NaN keeping its payload, as torch does.
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
  for (; i < count; ++i) dst[i] = fp16_bits_to_fp32(src[i]);
}

STRATA_AVX2 void adamw_fp32_grads_avx2(const AdamWStepScalars& s, float* params,
                                       const float* grads, float* exp_avg, float* exp_avg_sq,
                                       DType copy_dtype, uint16_t* copy, size_t count) {
  adamw_dispatch_copy(s, params, grads, exp_avg, exp_avg_sq, copy_dtype, copy, count);
}
STRATA_AVX2 void adamw_bf16_grads_avx2(const AdamWStepScalars& s, float* params,
                                       const uint16_t* grads, float* exp_avg, float* exp_avg_sq,
                                       DType copy_dtype, uint16_t* copy, size_t count) {
  adamw_dispatch_copy(s, params, grads, exp_avg, exp_avg_sq, copy_dtype, copy, count);
}
STRATA_AVX2 double sum_squares_fp32_avx2(const float* values, size_t count) {
  return sum_squares_loop(values, count);
}
STRATA_AVX2 double sum_squares_bf16_avx2(const uint16_t* values, size_t count) {
  return sum_squares_loop(values, count);
}

}  // namespace strata::kernels::detail
