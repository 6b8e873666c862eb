// strata/kernels/quant/quant_element.h — internal: the per-element math of quant.h, written once
// for the CPU kernel (quant.cpp, built with -ffp-contract=off) and the CUDA one (quant.cu, _rn
// intrinsics through elementwise.h), so both give the same bits. Include from kernels/quant only.
#pragma once

#include <cstdint>

#include "kernels/optim/elementwise.h"
#include "kernels/quant/quant.h"

namespace strata::kernels::quant::detail {

using kernels::detail::add_rn;
using kernels::detail::div_rn;
using kernels::detail::float_to_bits;
using kernels::detail::mul_rn;

// The NF4 levels as a plain array usable in device code (std::array's operator[] is not
// __device__ without relaxed constexpr).
struct Nf4Table {
  float levels[16];
};
STRATA_HOST_DEVICE constexpr Nf4Table nf4_table() {
  Nf4Table table{};
  for (int i = 0; i < 16; ++i) table.levels[i] = kNf4Levels[static_cast<size_t>(i)];
  return table;
}

// bitsandbytes' dQuantizeNF4 as a count: the code is the number of level midpoints (fp32) that
// x is strictly above, which is what its `x > t` tree computes (a tie stays below; a NaN is
// above none and gives 0). The midpoints are (a + b) * 0.5f of adjacent fp32 levels: the same
// fp32 values as bitsandbytes' literals.
STRATA_HOST_DEVICE inline uint32_t nf4_code(float x) {
  uint32_t code = 0;
  for (int i = 0; i < 15; ++i) {
    const float midpoint = (kNf4Levels[static_cast<size_t>(i)] + kNf4Levels[static_cast<size_t>(i + 1)]) * 0.5f;
    code += x > midpoint ? 1u : 0u;
  }
  return code;
}

// The scale a block's elements are multiplied by before the NF4 lookup: 1/absmax once per
// block in fp32 (1 for a block of zeros, whose elements then all take the zero code).
STRATA_HOST_DEVICE inline float nf4_inverse_absmax(float absmax) {
  return div_rn(1.0f, absmax == 0.0f ? 1.0f : absmax);
}
// x as the NF4 lookup sees it: x · inverse, bitsandbytes' multiply; but where the reciprocal
// overflowed to inf (absmax < 2^-128: a block of subnormals) x / absmax, so such a block still
// finds its nearest levels instead of ±inf and NaN codes.
STRATA_HOST_DEVICE inline float nf4_scaled(float x, float absmax, float inverse) {
  return (float_to_bits(inverse) & 0x7FFFFFFFu) == 0x7F800000u ? div_rn(x, absmax) : mul_rn(x, inverse);
}

// int8: the block's step, absmax / 127 in fp32.
STRATA_HOST_DEVICE inline float int8_scale(float absmax) { return div_rn(absmax, 127.0f); }

// int8's code of x for a block whose scale is `scale`: round-half-even(x / scale), clamped to
// ±127; 0 for a block of zeros and for a NaN (so the conversion is always defined).
inline int8_t int8_code(float x, float scale) {
  if (scale == 0.0f) return 0;
  const float scaled = x / scale;
  if (!(scaled == scaled)) return 0;
  const float clamped = scaled > 127.0f ? 127.0f : (scaled < -127.0f ? -127.0f : scaled);
  return static_cast<int8_t>(std::nearbyint(clamped));  // default rounding mode: half to even
}

// A double-quantised absmax: code[q] · absmax2 + mean, rounded after each operation.
STRATA_HOST_DEVICE inline float double_quant_absmax(float code_value, float absmax2, float mean) {
  return add_rn(mul_rn(code_value, absmax2), mean);
}

}  // namespace strata::kernels::quant::detail
