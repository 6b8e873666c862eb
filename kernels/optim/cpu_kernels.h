// strata/kernels/optim/cpu_kernels.h — internal: the single-thread loops behind cast.h and
// adamw.h, one set per ISA. The public functions split the work into tiles across TBB and call
// one of these per tile; nothing outside kernels/optim includes this file.
//
// Every avx2 function must return exactly the bits of its scalar twin for every input (tests
// compare them); the avx2 ones may only be called where detect_cpu_isa() says avx2.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/optim/adamw8bit_element.h"
#include "kernels/optim/elementwise.h"

namespace strata::kernels::detail {

// Sum of squares keeps 8 double lanes: element i of a block goes to lane i % 8, and the lanes
// are combined as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Both ISAs follow this exact shape.
inline constexpr size_t kSumSquaresLanes = 8;
inline double combine_sum_squares_lanes(const double* lanes) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

#define STRATA_OPTIM_DECLARE_KERNELS(suffix)                                                      \
  void cast_fp32_to_bf16_##suffix(const float* src, uint16_t* dst, size_t count);                 \
  void cast_bf16_to_fp32_##suffix(const uint16_t* src, float* dst, size_t count);                 \
  void cast_fp32_to_fp16_##suffix(const float* src, uint16_t* dst, size_t count);                 \
  void cast_fp16_to_fp32_##suffix(const uint16_t* src, float* dst, size_t count);                 \
  void adamw_fp32_grads_##suffix(const AdamWStepScalars& s, float* params, const float* grads,    \
                                 float* exp_avg, float* exp_avg_sq, DType copy_dtype,             \
                                 uint16_t* copy, size_t count);                                   \
  void adamw_bf16_grads_##suffix(const AdamWStepScalars& s, float* params,                        \
                                 const uint16_t* grads, float* exp_avg, float* exp_avg_sq,        \
                                 DType copy_dtype, uint16_t* copy, size_t count);                 \
  double sum_squares_fp32_##suffix(const float* values, size_t count);                            \
  double sum_squares_bf16_##suffix(const uint16_t* values, size_t count);                         \
  void adamw8bit_fp32_grads_##suffix(const AdamWStepScalars& s, const AdamW8bitTile& tile,        \
                                     const float* grads);                                         \
  void adamw8bit_bf16_grads_##suffix(const AdamWStepScalars& s, const AdamW8bitTile& tile,        \
                                     const uint16_t* grads);

// One tile of the 8-bit AdamW (adamw8bit.h): whole blocks from a block boundary, `count`
// elements; the absmax pointers point at the tile's first block.
struct AdamW8bitTile {
  const CodeTable* exp_avg_table = nullptr;     // signed dynamic code
  const CodeTable* exp_avg_sq_table = nullptr;  // unsigned dynamic code
  size_t block_elements = 0;
  float* params = nullptr;
  uint8_t* exp_avg_codes = nullptr;
  uint8_t* exp_avg_sq_codes = nullptr;
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
  DType copy_dtype = DType::f32;
  uint16_t* copy = nullptr;
  size_t count = 0;
};

inline float widen8(float grad) { return grad; }
inline float widen8(uint16_t grad_bf16) { return bf16_bits_to_fp32(grad_bf16); }
inline float abs_fp32(float value) { return bits_to_float(float_to_bits(value) & 0x7FFFFFFFu); }

// Pass 1 of an 8-bit step for element e of a tile, as the scalar loop runs every element and
// the AVX2 loop a block's tail: dequantise m and v (scale: the block's absmax), update the
// param from the fresh fp32 moments, write it and its copy, keep the fresh moments for pass 2
// and fold |m|, |v| into the block's maxima (`a > max ? a : max` skips a NaN, as bitsandbytes'
// fmaxf and the vector max do).
template <typename Grad>
inline void adamw8bit_scalar_element(const AdamWStepScalars& s, const AdamW8bitTile& t, const Grad* grads, size_t e,
                                     float m_scale, float v_scale, float& fresh_m, float& fresh_v, float& m_max,
                                     float& v_max) {
  float p = t.params[e];
  float m = mul_rn(t.exp_avg_table->values[t.exp_avg_codes[e]], m_scale);
  float v = mul_rn(t.exp_avg_sq_table->values[t.exp_avg_sq_codes[e]], v_scale);
  adamw8bit_element(s, widen8(grads[e]), p, m, v);
  t.params[e] = p;
  if (t.copy_dtype == DType::bf16) {
    t.copy[e] = fp32_to_bf16_bits(p);
  } else if (t.copy_dtype == DType::f16) {
    t.copy[e] = fp32_to_fp16_bits(p);
  }
  fresh_m = m;
  fresh_v = v;
  const float m_abs = abs_fp32(m), v_abs = abs_fp32(v);
  m_max = m_abs > m_max ? m_abs : m_max;
  v_max = v_abs > v_max ? v_abs : v_max;
}

STRATA_OPTIM_DECLARE_KERNELS(scalar)
STRATA_OPTIM_DECLARE_KERNELS(avx2)
#undef STRATA_OPTIM_DECLARE_KERNELS

// AVX-512 (F, BW, DQ, VL, VBMI) loops exist only where they beat the AVX2 ones by more than the
// memory bound allows the AVX2 ones to: the 8-bit AdamW, which is compute-bound. Callable only
// where cpu_has_avx512() says so.
void adamw8bit_fp32_grads_avx512(const AdamWStepScalars& s, const AdamW8bitTile& tile, const float* grads);
void adamw8bit_bf16_grads_avx512(const AdamWStepScalars& s, const AdamW8bitTile& tile, const uint16_t* grads);
// quantize_moment of `count` values of one block (whose inverse_absmax is `inverse`) by the
// AVX-512 quantiser: the step's own code path, exposed so tests can hold it to the scalar one
// on chosen values (ties, bucket edges, specials) that a step rarely produces.
void quantize_moments_avx512(const CodeTable& table, bool is_signed, const float* values, float inverse,
                             size_t count, uint8_t* codes);
// The same by the AVX2 loop's quantiser (its last count % 8 values by the scalar one).
void quantize_moments_avx2(const CodeTable& table, bool is_signed, const float* values, float inverse,
                           size_t count, uint8_t* codes);

}  // namespace strata::kernels::detail
