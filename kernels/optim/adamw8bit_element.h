// strata/kernels/optim/adamw8bit_element.h — internal: the per-element pieces of the 8-bit AdamW
// (adamw8bit.h), written once for the CPU scalar path, the AVX2 tails and CUDA device code, so
// all three give the same bits. Same rounding rules as elementwise.h (one IEEE fp32 operation
// each, no contraction on the host, _rn intrinsics on the device).
#pragma once

#include <cstdint>

#include "kernels/optim/elementwise.h"

namespace strata::kernels::detail {

// A code table with what the quantiser needs beside it: midpoints[k] (k = 1..255) is
// (values[k-1] + values[k]) * 0.5f rounded to fp32 — the threshold bitsandbytes compares
// against — and midpoints[0] = -inf, so the search below needs no edge case at index 0.
struct CodeTable {
  float values[256];
  float midpoints[256];
};

STRATA_HOST_DEVICE inline bool is_finite_fp32(float value) {
  return (float_to_bits(value) & 0x7F800000u) != 0x7F800000u;
}

// The fresh moments and param of one element: adamw_element on copies, or nothing when the
// scaled gradient is not finite (the element keeps its param and its dequantised moments).
STRATA_HOST_DEVICE inline void adamw8bit_element(const AdamWStepScalars& s, float grad, float& param,
                                                 float& exp_avg, float& exp_avg_sq) {
  if (!is_finite_fp32(mul_rn(grad, s.grad_scale))) return;
  adamw_element(s, grad, param, exp_avg, exp_avg_sq);
}

// bitsandbytes' nearest-code search, restated: seven halving steps from index 127 (the table's
// implicit binary tree) end on an even index `p` with values[p-1] < x <= values[p+1]; of p and
// its neighbour on x's side, the one past the fp32 midpoint wins, and a value exactly on the
// midpoint stays at p. A NaN x walks left and gives 0.
STRATA_HOST_DEVICE inline uint32_t nearest_code(const CodeTable& table, float x) {
  uint32_t pivot = 127;
  for (uint32_t half = 64; half > 0; half >>= 1) {
    pivot = x > table.values[pivot] ? pivot + half : pivot - half;
  }
  const uint32_t up = x > table.midpoints[pivot + 1] ? 1u : 0u;
  const uint32_t down = x < table.midpoints[pivot] ? 1u : 0u;
  return pivot + up - down;
}

// `value` (a fresh moment) as a code of its block with scale `absmax`. Signed (m): a value
// whose sign differs from its code's is moved one code towards its side, as bitsandbytes does
// so a small negative m never reads back as +0 (codes below kSignedZero are the negative ones).
STRATA_HOST_DEVICE inline uint8_t quantize_moment(const CodeTable& table, bool is_signed, float value,
                                                  float absmax) {
  constexpr uint32_t kSignedZero = 127;
  const float divisor = absmax == 0.0f ? 1.0f : absmax;
  uint32_t code = nearest_code(table, div_rn(value, divisor));
  if (is_signed) {
    const bool value_negative = (float_to_bits(value) >> 31) != 0;
    const bool code_negative = code < kSignedZero;
    if (value_negative != code_negative) code = value > 0.0f ? code + 1 : code - 1;
  }
  return static_cast<uint8_t>(code);
}

}  // namespace strata::kernels::detail
