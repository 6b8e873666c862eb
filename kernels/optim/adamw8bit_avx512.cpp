// The AVX-512 loop of the 8-bit AdamW (adamw8bit.h), 16 lanes at a time. It performs
// adamw8bit_loop's fp32 operations (adamw8bit_cpu.cpp) in the same order — the fp32 AdamW's
// FMAs, nothing else fused (-ffp-contract=off) — reads the code values' exact bits, and
// quantises by CodeTable::quantize_entry, which is quantize_moment tabulated (tests hold the
// two equal on every fp32 pattern below 2), so it returns the scalar loop's bits. Where the
// AVX2 loop spends one scalar load and store per element on each table lookup, this one looks
// up 64 code values at a time in registers (vpermi2b on byte tables) and the quantiser's
// entries with one 16-lane gather; a block's short tail runs the same vector code under a lane
// mask instead of the element functions.
//
// Built with __attribute__((target)) per function, not -mavx512f for the file: inline functions
// from shared headers compiled under -mavx512f could be the copy the linker keeps for every
// caller, and would then fault on a CPU without AVX-512. The driver calls these only where
// cpu_has_avx512() says so.
//
// GCC 12's AVX-512 intrinsic headers fill their "undefined" operands from themselves, which
// -Wuninitialized reports at every inlined call (GCC bug 105593, fixed in GCC 13); silenced
// before the include, for this file only: no intrinsic here takes an uninitialised value of ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cpu_kernels.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2,fma,f16c")))

namespace strata::kernels::detail {
namespace {

STRATA_AVX512 inline __mmask16 lanes_mask(size_t lanes) {
  return lanes >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << lanes) - 1u);
}

STRATA_AVX512 inline __m512 load_grads16(const float* grads, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, grads);
}
STRATA_AVX512 inline __m512 load_grads16(const uint16_t* grads, __mmask16 mask) {
  // bf16 → fp32 is exact: the pattern in the high half of the word.
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, grads));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// The compute copy of 16 params with cast.h's rounding. bf16: (bits + 0x7FFF + lsb) >> 16,
// every NaN 0xFFFF (not vcvtneps2bf16, which flushes subnormal inputs). fp16: vcvtps2ph rounds
// as IEEE says; only its NaN keeps the payload, so NaN lanes become 0x7E00 | sign.
STRATA_AVX512 inline void store_copy16(DType dtype, uint16_t* copy, __m512 value, __mmask16 mask) {
  const __mmask16 is_nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  const __m512i bits = _mm512_castps_si512(value);
  if (dtype == DType::bf16) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_set1_epi32(kBf16NaNBits));
    _mm256_mask_storeu_epi16(copy, mask, _mm512_cvtepi32_epi16(rounded));
  } else if (dtype == DType::f16) {
    __m256i half = _mm512_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (is_nan != 0) {
      const __m512i sign16 = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000));
      const __m512i canonical = _mm512_or_si512(sign16, _mm512_set1_epi32(0x7E00));
      half = _mm256_mask_mov_epi16(half, is_nan, _mm512_cvtepi32_epi16(canonical));
    }
    _mm256_mask_storeu_epi16(copy, mask, half);
  }
}

STRATA_AVX512 inline __m512 abs16(__m512 value) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(value), _mm512_set1_epi32(0x7FFFFFFF)));
}

STRATA_AVX512 inline __mmask64 bytes_mask(size_t lanes) {
  return lanes >= 64 ? ~__mmask64{0} : (__mmask64{1} << lanes) - 1u;
}

// Byte p = 16L + 4r + j of the permuted codes (128-bit lane L, group r, byte j) is code
// 16r + 4L + j: after the two rounds of in-lane unpacks in code_values64, group r of every
// lane forms output register r, so the transposed input makes each register 16 codes in order.
struct CodeOrder {
  alignas(64) uint8_t index[64];
  constexpr CodeOrder() : index{} {
    for (int lane = 0; lane < 4; ++lane) {
      for (int group = 0; group < 4; ++group) {
        for (int byte = 0; byte < 4; ++byte) {
          index[16 * lane + 4 * group + byte] = static_cast<uint8_t>(16 * group + 4 * lane + byte);
        }
      }
    }
  }
};
constexpr CodeOrder kCodeOrder;

// code_table[code] of 64 codes, as 4 x 16 floats in code order. Each byte of the fp32 values is
// a 256-entry byte table: two 128-byte vpermi2b lookups and a blend on the code's top bit give
// that byte for all 64 codes; two rounds of unpacks put the four bytes back together. About a
// quarter of the time of one 16-lane gather per 16 codes (measured on this AMD EPYC), and
// exact: the floats are the table's bits.
STRATA_AVX512 inline void code_values64(const CodeTable& table, __m512i codes, __m512* out) {
  const __m512i ordered = _mm512_permutexvar_epi8(_mm512_load_si512(kCodeOrder.index), codes);
  const __mmask64 upper_half = _mm512_movepi8_mask(ordered);
  __m512i plane[4];
  for (int byte = 0; byte < 4; ++byte) {
    const uint8_t* bytes = table.value_bytes[byte];
    const __m512i lower = _mm512_permutex2var_epi8(_mm512_load_si512(bytes), ordered, _mm512_load_si512(bytes + 64));
    const __m512i upper =
        _mm512_permutex2var_epi8(_mm512_load_si512(bytes + 128), ordered, _mm512_load_si512(bytes + 192));
    plane[byte] = _mm512_mask_mov_epi8(lower, upper_half, upper);
  }
  const __m512i low01 = _mm512_unpacklo_epi8(plane[0], plane[1]);
  const __m512i high01 = _mm512_unpackhi_epi8(plane[0], plane[1]);
  const __m512i low23 = _mm512_unpacklo_epi8(plane[2], plane[3]);
  const __m512i high23 = _mm512_unpackhi_epi8(plane[2], plane[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(low01, low23));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(low01, low23));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(high01, high23));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(high01, high23));
}

// quantize_moment of 16 values of a block as bytes, by CodeTable::quantize_entry: the key
// (bucket of |x| clamped at both ends: tiny x share bucket 0, |x| > 1 the last key) picks one
// entry per lane by a gather, and one unsigned compare of x's rising low bits decides the step.
// keep_sign is in the entries: for a non-NaN x = value * inverse (inverse >= 0) the signs of x
// and value agree, and the only code it moves is a negative x's 127, which the negative keys
// store as 126. A NaN x (a NaN or infinite moment) takes the scalar function for its 16 lanes.
STRATA_AVX512 inline __m128i quantize16(const CodeTable& table, bool is_signed, const float* values, float inverse,
                                        __mmask16 mask) {
  const __m512 value = _mm512_maskz_loadu_ps(mask, values);
  const __m512 x = _mm512_mul_ps(value, _mm512_set1_ps(inverse));
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i sign = _mm512_srai_epi32(bits, 31);
  // |x|'s exponent and top 8 mantissa bits, less bucket 0's, saturating at 0 (16-bit lanes:
  // the upper half of each 32-bit lane is 0), then at most the |x| > 1 key.
  const __m512i magnitude_key = _mm512_srli_epi32(_mm512_slli_epi32(bits, 1), 16);
  __m512i key = _mm512_min_epu32(
      _mm512_subs_epu16(magnitude_key, _mm512_set1_epi32(static_cast<int>(kCodeBucketMinExponent << 8))),
      _mm512_set1_epi32(static_cast<int>(kCodeBucketsPerSign)));
  key = _mm512_add_epi32(key, _mm512_and_si512(sign, _mm512_set1_epi32(static_cast<int>(kQuantizeKeysPerSign))));
  const __m512i entry = _mm512_i32gather_epi32(key, table.quantize_entry, 4);
  // (bits ^ sign) & 0x7FFF: the low 15 bits, complemented for negative x.
  const __m512i rising_low = _mm512_ternarylogic_epi32(bits, sign, _mm512_set1_epi32(0x7FFF), 0x28);
  const __mmask16 up = _mm512_cmpge_epu32_mask(rising_low, _mm512_and_si512(entry, _mm512_set1_epi32(0xFFFF)));
  const __m512i first = _mm512_srli_epi32(entry, 16);
  const __m128i code = _mm512_cvtepi32_epi8(_mm512_mask_add_epi32(first, up, first, _mm512_set1_epi32(1)));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & mask;
  if (is_nan == 0) [[likely]] return code;
  alignas(16) uint8_t codes[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(codes), code);
  for (int k = 0; k < 16; ++k) {
    if ((is_nan >> k) & 1u) codes[k] = quantize_moment(table, is_signed, values[k], inverse);
  }
  return _mm_load_si128(reinterpret_cast<const __m128i*>(codes));
}

template <typename Grad>
STRATA_AVX512 void adamw8bit_loop(const AdamWStepScalars& s, const AdamW8bitTile& t, const Grad* grads) {
  // Whole 16-lane groups: a short last group's lanes past the block are zeros, never stored.
  alignas(64) float fresh_m[kAdamW8bitMaxBlockElements + 16];
  alignas(64) float fresh_v[kAdamW8bitMaxBlockElements + 16];
  const CodeTable& m_table = *t.exp_avg_table;
  const CodeTable& v_table = *t.exp_avg_sq_table;
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
  const __m512 decay = _mm512_set1_ps(s.decay);
  const __m512 beta1 = _mm512_set1_ps(s.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 bias_correction2_sqrt = _mm512_set1_ps(s.bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps);
  const __m512 neg_step_size = _mm512_set1_ps(s.neg_step_size);
  const __m512i exponent_mask = _mm512_set1_epi32(0x7F800000);
  for (size_t begin = 0, block = 0; begin < t.count; begin += t.block_elements, ++block) {
    const size_t n = std::min(t.block_elements, t.count - begin);
    const __m512 m_scale = _mm512_set1_ps(t.exp_avg_absmax[block]);
    const __m512 v_scale = _mm512_set1_ps(t.exp_avg_sq_absmax[block]);
    __m512 m_max16 = _mm512_setzero_ps();
    __m512 v_max16 = _mm512_setzero_ps();
    for (size_t i64 = 0; i64 < n; i64 += 64) {
      const __mmask64 mask64 = bytes_mask(n - i64);
      __m512 m_values[4], v_values[4];
      code_values64(m_table, _mm512_maskz_loadu_epi8(mask64, t.exp_avg_codes + begin + i64), m_values);
      code_values64(v_table, _mm512_maskz_loadu_epi8(mask64, t.exp_avg_sq_codes + begin + i64), v_values);
      for (size_t group = 0; group < 4 && i64 + 16 * group < n; ++group) {
        const size_t i = i64 + 16 * group;
        const size_t e = begin + i;
        const __mmask16 mask = lanes_mask(n - i);
        const __m512 m0 = _mm512_mul_ps(m_values[group], m_scale);
        const __m512 v0 = _mm512_mul_ps(v_values[group], v_scale);
        const __m512 p0 = _mm512_maskz_loadu_ps(mask, t.params + e);
        // adamw_element's operations in its order (the fp32 loops' sequence).
        const __m512 g = _mm512_mul_ps(load_grads16(grads + e, mask), grad_scale);
        const __m512 p = _mm512_mul_ps(p0, decay);
        const __m512 m1 = _mm512_fmadd_ps(g, one_minus_beta1, _mm512_mul_ps(m0, beta1));
        const __m512 v1 = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(v0, beta2));
        const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v1), bias_correction2_sqrt), eps);
        const __m512 p1 = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m1), denom));
        // A NaN/inf scaled gradient keeps the element's param and dequantised moments.
        const __mmask16 skip =
            _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(g), exponent_mask), exponent_mask);
        const __m512 m = _mm512_mask_mov_ps(m1, skip, m0);
        const __m512 v = _mm512_mask_mov_ps(v1, skip, v0);
        const __m512 param = _mm512_mask_mov_ps(p1, skip, p0);
        _mm512_mask_storeu_ps(t.params + e, mask, param);
        if (t.copy_dtype != DType::f32) store_copy16(t.copy_dtype, t.copy + e, param, mask);
        _mm512_store_ps(fresh_m + i, m);
        _mm512_store_ps(fresh_v + i, v);
        // max(a, acc) returns acc where a is NaN: `a > acc ? a : acc`, the scalar rule. Lanes
        // past the block (computed from zero codes and grads, never stored) keep acc.
        m_max16 = _mm512_mask_max_ps(m_max16, mask, abs16(m), m_max16);
        v_max16 = _mm512_mask_max_ps(v_max16, mask, abs16(v), v_max16);
      }
    }
    // No lane holds a NaN or a -0, so the order of the reduction cannot change the result.
    const float m_max = _mm512_reduce_max_ps(m_max16);
    const float v_max = _mm512_reduce_max_ps(v_max16);
    t.exp_avg_absmax[block] = m_max;
    t.exp_avg_sq_absmax[block] = v_max;
    const float m_inverse = inverse_absmax(m_max), v_inverse = inverse_absmax(v_max);
    // The next block's lines, spread over the quantiser: it makes no demand misses, so without
    // them the hardware prefetcher idles and the next block's first pass waits on DRAM (the
    // AVX2 loop's measurement).
    const size_t next = begin + n;
    const size_t next_n = next < t.count ? std::min(t.block_elements, t.count - next) : 0;
    const char* next_params = reinterpret_cast<const char*>(t.params + next);
    const char* next_grads = reinterpret_cast<const char*>(grads + next);
    for (size_t k = 0; k < next_n; k += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(t.exp_avg_codes + next + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(t.exp_avg_sq_codes + next + k), _MM_HINT_T0);
    }
    for (size_t q = 0; q < n; q += 16) {
      if (q < next_n) {  // a group of 16 is one line of params and one (fp32) line of grads
        _mm_prefetch(next_params + q * sizeof(float), _MM_HINT_T0);
        _mm_prefetch(next_grads + q * sizeof(Grad), _MM_HINT_T0);
      }
      const __mmask16 mask = lanes_mask(n - q);
      _mm_mask_storeu_epi8(t.exp_avg_codes + begin + q, mask, quantize16(m_table, true, fresh_m + q, m_inverse, mask));
      _mm_mask_storeu_epi8(t.exp_avg_sq_codes + begin + q, mask,
                           quantize16(v_table, false, fresh_v + q, v_inverse, mask));
    }
  }
}

}  // namespace

STRATA_AVX512 void quantize_moments_avx512(const CodeTable& table, bool is_signed, const float* values, float inverse,
                                           size_t count, uint8_t* codes) {
  for (size_t q = 0; q < count; q += 16) {
    const __mmask16 mask = lanes_mask(count - q);
    _mm_mask_storeu_epi8(codes + q, mask, quantize16(table, is_signed, values + q, inverse, mask));
  }
}

STRATA_AVX512 void adamw8bit_fp32_grads_avx512(const AdamWStepScalars& s, const AdamW8bitTile& tile,
                                               const float* grads) {
  adamw8bit_loop(s, tile, grads);
}
STRATA_AVX512 void adamw8bit_bf16_grads_avx512(const AdamWStepScalars& s, const AdamW8bitTile& tile,
                                               const uint16_t* grads) {
  adamw8bit_loop(s, tile, grads);
}

}  // namespace strata::kernels::detail
