// The AVX2 + FMA loop of the 8-bit AdamW (adamw8bit.h). It mirrors adamw8bit_loop in
// adamw8bit_cpu.cpp operation for operation — the same fp32 operations in the same order (the
// fp32 AdamW's FMAs, nothing else fused: -ffp-contract=off), the same quantiser
// (adamw8bit_element.h's table lookup, 8 lanes at a time, no gathers), an exact max — so it returns
// the scalar loop's bits; the last n % 8 elements of a block go through the element functions.
#include <immintrin.h>

#include <algorithm>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cpu_kernels.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::kernels::detail {
namespace {

STRATA_AVX2 inline __m256 load_grads8(const float* grads) { return _mm256_loadu_ps(grads); }
STRATA_AVX2 inline __m256 load_grads8(const uint16_t* grads) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grads)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The bf16 patterns of 8 floats with cast.h's rounding: (bits + 0x7FFF + lsb) >> 16, every NaN
// 0xFFFF. fp16 goes through the scalar function (rarely the compute dtype with fp32 masters).
STRATA_AVX2 inline void store_copy8(DType dtype, uint16_t* copy, __m256 value) {
  if (dtype == DType::bf16) {
    const __m256i bits = _mm256_castps_si256(value);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(kBf16NaNBits), is_nan);
    // Every lane is <= 0xFFFF: the unsigned-saturating pack only narrows.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(copy),
                     _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1)));
  } else if (dtype == DType::f16) {
    alignas(32) float values[8];
    _mm256_store_ps(values, value);
    for (int k = 0; k < 8; ++k) copy[k] = fp32_to_fp16_bits(values[k]);
  }
}

STRATA_AVX2 inline __m256 abs8(__m256 value) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(value), _mm256_set1_epi32(0x7FFFFFFF)));
}

STRATA_AVX2 inline float horizontal_max(__m256 value) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, value);
  float result = lanes[0];
  for (int k = 1; k < 8; ++k) result = lanes[k] > result ? lanes[k] : result;
  return result;
}

// quantize_moment over the `count` values of one block, 8 lanes at a time, in three sweeps so
// no gather is needed (vpgatherdd was no faster than plain loads on this AMD EPYC, and is far
// slower on Intel CPUs with the gather-data-sampling microcode mitigation): the ratio and its
// key on 8 lanes; the entries by plain loads; one compare per lane. CodeTable::quantize_entry
// holds the tie rule, keep_sign and the |x| > 1 codes (adamw8bit_avx512.cpp's quantize16 says
// why that is exact for every non-NaN ratio); NaN ratios take the scalar function. `count` is a
// multiple of 8. Each 8 lanes also prefetch one line of `prefetch` (the next block's params or
// grads): this sweep makes no demand misses, so without it the hardware prefetcher idles and
// the next block's first sweep waits on DRAM; one line per iteration keeps the fill buffers
// free, where prefetching a whole block at once did not help.
STRATA_AVX2 void quantize_block(const CodeTable& table, bool is_signed, const float* values, float inverse,
                                size_t count, float* ratios, uint32_t* entries, uint8_t* codes,
                                const char* prefetch, size_t prefetch_bytes) {
  const __m256 inverse8 = _mm256_set1_ps(inverse);
  int nan_lanes = 0;
  for (size_t q = 0; q < count; q += 8) {
    if (q * 8 < prefetch_bytes) _mm_prefetch(prefetch + q * 8, _MM_HINT_T0);
    const __m256 x = _mm256_mul_ps(_mm256_load_ps(values + q), inverse8);
    const __m256i bits = _mm256_castps_si256(x);
    // |x|'s exponent and top 8 mantissa bits less bucket 0's, saturating at 0 (16-bit lanes:
    // each upper half is 0), at most the |x| > 1 key; negative x in the second half.
    const __m256i magnitude_key = _mm256_srli_epi32(_mm256_slli_epi32(bits, 1), 16);
    __m256i key = _mm256_min_epu32(
        _mm256_subs_epu16(magnitude_key, _mm256_set1_epi32(static_cast<int>(kCodeBucketMinExponent << 8))),
        _mm256_set1_epi32(static_cast<int>(kCodeBucketsPerSign)));
    key = _mm256_add_epi32(key, _mm256_and_si256(_mm256_srai_epi32(bits, 31),
                                                 _mm256_set1_epi32(static_cast<int>(kQuantizeKeysPerSign))));
    nan_lanes |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    _mm256_store_ps(ratios + q, x);
    _mm256_store_si256(reinterpret_cast<__m256i*>(entries + q), key);
  }
  for (size_t q = 0; q < count; ++q) entries[q] = table.quantize_entry[entries[q]];
  for (size_t q = 0; q < count; q += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_load_ps(ratios + q));
    const __m256i entry = _mm256_load_si256(reinterpret_cast<const __m256i*>(entries + q));
    // The low 15 bits, complemented for negative x: they rise with x.
    const __m256i rising_low = _mm256_and_si256(_mm256_xor_si256(bits, _mm256_srai_epi32(bits, 31)),
                                                _mm256_set1_epi32(0x7FFF));
    // -1 where the limit is above the low bits: the code stays the entry's first.
    const __m256i stays = _mm256_cmpgt_epi32(_mm256_and_si256(entry, _mm256_set1_epi32(0xFFFF)), rising_low);
    const __m256i code = _mm256_add_epi32(_mm256_srli_epi32(entry, 16), _mm256_add_epi32(stays, _mm256_set1_epi32(1)));
    // Every lane is 0..255: the two saturating packs narrow without changing a value.
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + q), _mm_packus_epi16(words, words));
  }
  if (nan_lanes != 0) {  // rare: a NaN or infinite moment
    for (size_t q = 0; q < count; ++q) {
      if (ratios[q] != ratios[q]) codes[q] = quantize_moment(table, is_signed, values[q], inverse);
    }
  }
}

template <typename Grad>
STRATA_AVX2 void adamw8bit_loop(const AdamWStepScalars& s, const AdamW8bitTile& t, const Grad* grads) {
  alignas(32) float fresh_m[kAdamW8bitMaxBlockElements];
  alignas(32) float fresh_v[kAdamW8bitMaxBlockElements];
  alignas(32) float ratios[kAdamW8bitMaxBlockElements];
  alignas(32) uint32_t entries[kAdamW8bitMaxBlockElements];
  const CodeTable& m_table = *t.exp_avg_table;
  const CodeTable& v_table = *t.exp_avg_sq_table;
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
  const __m256 decay = _mm256_set1_ps(s.decay);
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 bias_correction2_sqrt = _mm256_set1_ps(s.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step_size = _mm256_set1_ps(s.neg_step_size);
  const __m256i exponent_mask = _mm256_set1_epi32(0x7F800000);
  for (size_t begin = 0, block = 0; begin < t.count; begin += t.block_elements, ++block) {
    const size_t n = std::min(t.block_elements, t.count - begin);
    const float m_scale = t.exp_avg_absmax[block];
    const float v_scale = t.exp_avg_sq_absmax[block];
    const __m256 m_scale8 = _mm256_set1_ps(m_scale);
    const __m256 v_scale8 = _mm256_set1_ps(v_scale);
    __m256 m_max8 = _mm256_setzero_ps();
    __m256 v_max8 = _mm256_setzero_ps();
    const size_t n8 = n / 8 * 8;
    // The code values by plain loads first (no gathers, as in quantize_block).
    for (size_t i = 0; i < n8; ++i) {
      fresh_m[i] = m_table.values[t.exp_avg_codes[begin + i]];
      fresh_v[i] = v_table.values[t.exp_avg_sq_codes[begin + i]];
    }
    size_t i = 0;
    for (; i < n8; i += 8) {
      const size_t e = begin + i;
      const __m256 m0 = _mm256_mul_ps(_mm256_load_ps(fresh_m + i), m_scale8);
      const __m256 v0 = _mm256_mul_ps(_mm256_load_ps(fresh_v + i), v_scale8);
      const __m256 p0 = _mm256_loadu_ps(t.params + e);
      // adamw_element's operations in its order (the fp32 AVX2 loop's sequence).
      const __m256 g = _mm256_mul_ps(load_grads8(grads + e), grad_scale);
      const __m256 p = _mm256_mul_ps(p0, decay);
      const __m256 m1 = _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(m0, beta1));
      const __m256 v1 = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g, _mm256_mul_ps(v0, beta2));
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v1), bias_correction2_sqrt), eps);
      const __m256 p1 = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m1), denom));
      // A NaN/inf scaled gradient keeps the element's param and dequantised moments.
      const __m256 skip = _mm256_castsi256_ps(
          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(g), exponent_mask), exponent_mask));
      const __m256 m = _mm256_blendv_ps(m1, m0, skip);
      const __m256 v = _mm256_blendv_ps(v1, v0, skip);
      const __m256 param = _mm256_blendv_ps(p1, p0, skip);
      _mm256_storeu_ps(t.params + e, param);
      if (t.copy_dtype != DType::f32) store_copy8(t.copy_dtype, t.copy + e, param);
      _mm256_store_ps(fresh_m + i, m);
      _mm256_store_ps(fresh_v + i, v);
      // max(a, acc) returns acc where a is NaN: `a > acc ? a : acc`, the scalar rule.
      m_max8 = _mm256_max_ps(abs8(m), m_max8);
      v_max8 = _mm256_max_ps(abs8(v), v_max8);
    }
    float m_max = horizontal_max(m_max8);
    float v_max = horizontal_max(v_max8);
    for (; i < n; ++i) {
      adamw8bit_scalar_element(s, t, grads, begin + i, m_scale, v_scale, fresh_m[i], fresh_v[i], m_max, v_max);
    }
    t.exp_avg_absmax[block] = m_max;
    t.exp_avg_sq_absmax[block] = v_max;
    const float m_inverse = inverse_absmax(m_max), v_inverse = inverse_absmax(v_max);
    // The next block's codes now (2 x 4 lines), its params and grads spread over the quantiser.
    const size_t next = begin + n;
    const size_t next_n = next < t.count ? std::min(t.block_elements, t.count - next) : 0;
    if (next_n > 0) {
      for (size_t k = 0; k < next_n; k += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(t.exp_avg_codes + next + k), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(t.exp_avg_sq_codes + next + k), _MM_HINT_T0);
      }
    }
    quantize_block(m_table, true, fresh_m, m_inverse, n8, ratios, entries, t.exp_avg_codes + begin,
                   reinterpret_cast<const char*>(t.params + next), next_n * sizeof(float));
    quantize_block(v_table, false, fresh_v, v_inverse, n8, ratios, entries, t.exp_avg_sq_codes + begin,
                   reinterpret_cast<const char*>(grads + next), next_n * sizeof(Grad));
    size_t q = n8;
    for (; q < n; ++q) {
      t.exp_avg_codes[begin + q] = quantize_moment(m_table, true, fresh_m[q], m_inverse);
      t.exp_avg_sq_codes[begin + q] = quantize_moment(v_table, false, fresh_v[q], v_inverse);
    }
  }
}

}  // namespace

STRATA_AVX2 void quantize_moments_avx2(const CodeTable& table, bool is_signed, const float* values, float inverse,
                                       size_t count, uint8_t* codes) {
  alignas(32) float block_values[kAdamW8bitMaxBlockElements];
  alignas(32) float ratios[kAdamW8bitMaxBlockElements];
  alignas(32) uint32_t entries[kAdamW8bitMaxBlockElements];
  for (size_t begin = 0; begin < count; begin += kAdamW8bitMaxBlockElements) {
    const size_t n = std::min(kAdamW8bitMaxBlockElements, count - begin);
    const size_t n8 = n / 8 * 8;
    std::copy(values + begin, values + begin + n8, block_values);
    quantize_block(table, is_signed, block_values, inverse, n8, ratios, entries, codes + begin, nullptr, 0);
    for (size_t q = n8; q < n; ++q) codes[begin + q] = quantize_moment(table, is_signed, values[begin + q], inverse);
  }
}

STRATA_AVX2 void adamw8bit_fp32_grads_avx2(const AdamWStepScalars& s, const AdamW8bitTile& tile, const float* grads) {
  adamw8bit_loop(s, tile, grads);
}
STRATA_AVX2 void adamw8bit_bf16_grads_avx2(const AdamWStepScalars& s, const AdamW8bitTile& tile,
                                           const uint16_t* grads) {
  adamw8bit_loop(s, tile, grads);
}

}  // namespace strata::kernels::detail
