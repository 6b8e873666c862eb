// strata/kernels/optim/adamw8bit_element.h — internal: the per-element pieces of the 8-bit AdamW
// (adamw8bit.h), written once for the CPU scalar path, the AVX2 tails and CUDA device code, so
// all three give the same bits. Same rounding rules as elementwise.h (one IEEE fp32 operation
// each, no contraction on the host, _rn intrinsics on the device).
#pragma once

#include <cstdint>

#include "kernels/optim/elementwise.h"

namespace strata::kernels::detail {

// The bucket index of the CPU's table lookup (see nearest_code_lut): |x| in [2^-24, 1] keyed by
// its exponent and top 8 mantissa bits, per sign; smaller magnitudes share the lowest bucket.
inline constexpr uint32_t kCodeBucketMinExponent = 103;  // 2^-24: below the smallest threshold
inline constexpr uint32_t kCodeBucketsPerSign = (127 - kCodeBucketMinExponent + 1) * 256;

// A code table with what the quantiser needs beside it: midpoints[k] (k = 1..255) is
// (values[k-1] + values[k]) * 0.5f rounded to fp32 — the threshold bitsandbytes compares
// against — with midpoints[0] = -inf and midpoints[256] = +inf, so no search needs an edge
// case; bucket[key] describes the lookup bucket `key` (CPU only): bits 24-31 the code of its
// lowest x; bits 0-15 the low 15 bits of the one threshold inside it (every x of a bucket
// shares all higher bits, so comparing those low bits compares the floats), or a limit no x
// reaches (0x8000 for positive x, 0 for negative) when there is none; bit 16 set when an x
// exactly on that threshold goes up (the code above it is even: bitsandbytes' tie rule).
// value_bytes[b][code] is byte b (0 the lowest) of values[code]'s bits: the AVX-512 loop looks
// codes up 64 at a time as four byte tables (vpermi2b) instead of gathering floats.
// quantize_entry is the AVX-512 quantiser's form of `bucket`, keyed by kQuantizeKeysPerSign
// keys per sign (the buckets, then one for |x| > 1), each the whole of quantize_moment at scale 1
// — keep_sign included — for every non-NaN x of its key: bits 16-23 the code of the key's
// lowest x, bits 0-15 a limit: the code is one higher where x's rising low bits (its low 15 bits,
// complemented for negative x, so they grow with x) are >= limit (0x8000: nowhere).
inline constexpr uint32_t kQuantizeKeysPerSign = kCodeBucketsPerSign + 1;
struct CodeTable {
  float values[256];
  float midpoints[257];
  uint32_t bucket[2 * kCodeBucketsPerSign];
  alignas(64) uint8_t value_bytes[4][256];
  uint32_t quantize_entry[2 * kQuantizeKeysPerSign];
};

// The two tables the CPU kernels use, built at first use (adamw8bit_cpu.cpp): signed for m.
const CodeTable& cpu_code_table(bool is_signed);

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
// `values` and `midpoints` as in CodeTable (CUDA keeps them in shared memory).
STRATA_HOST_DEVICE inline uint32_t nearest_code(const float* values, const float* midpoints, float x) {
  uint32_t pivot = 127;
  for (uint32_t half = 64; half > 0; half >>= 1) {
    pivot = x > values[pivot] ? pivot + half : pivot - half;
  }
  const uint32_t up = x > midpoints[pivot + 1] ? 1u : 0u;
  const uint32_t down = x < midpoints[pivot] ? 1u : 0u;
  return pivot + up - down;
}

// The same function of x by table lookup, with no data-dependent branch or chain of loads (the
// seven dependent probes above cost tens of cycles per element on a CPU, as gathers or as
// branches): every bucket holds at most one threshold (checked when the table is built), so
// the code is the bucket's first code, plus one if x passes that threshold. |x| > 1 (only from
// an inf/NaN moment) gives what the search gives: 255 for x > 1, else 0.
inline uint32_t nearest_code_lut(const CodeTable& table, float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t exponent = (bits >> 23) & 0xFFu;
  const bool tiny = exponent < kCodeBucketMinExponent;
  const bool beyond_one = exponent > 127;
  const uint32_t bucket =
      (tiny || beyond_one) ? 0u : ((exponent - kCodeBucketMinExponent) << 8) | ((bits >> 15) & 0xFFu);
  const uint32_t negative = bits >> 31;
  const uint32_t entry = table.bucket[negative * kCodeBucketsPerSign + bucket];
  const uint32_t limit = entry & 0xFFFFu;
  const uint32_t low = bits & 0x7FFFu;
  // Past the threshold: above it for positive x, below it in magnitude for negative x.
  const bool past = negative != 0 ? low < limit : low > limit;
  const bool tie_up = low == limit && (entry & 0x10000u) != 0;
  const uint32_t code = (entry >> 24) + ((past || tie_up) ? 1u : 0u);
  return beyond_one ? (x > 1.0f ? 255u : 0u) : code;
}

// The quantiser's scale of a block: 1/absmax rounded to fp32 once (1 for a block of zeros), so
// each element costs a multiply, not a division (the divider is this kernel's bottleneck).
STRATA_HOST_DEVICE inline float inverse_absmax(float absmax) {
  return div_rn(1.0f, absmax == 0.0f ? 1.0f : absmax);
}

// Signed (m): a value whose sign differs from its code's is moved one code towards its side, as
// bitsandbytes does, so a small negative m never reads back as +0 (codes below 127 are the
// negative ones).
STRATA_HOST_DEVICE inline uint32_t keep_sign(uint32_t code, float value) {
  constexpr uint32_t kSignedZero = 127;
  const bool value_negative = (float_to_bits(value) >> 31) != 0;
  const bool code_negative = code < kSignedZero;
  if (value_negative != code_negative) code = value > 0.0f ? code + 1 : code - 1;
  return code;
}

// `value` (a fresh moment) as a code of its block, whose inverse_absmax is `inverse`, on the CPU.
// value * inverse may exceed 1 by an ulp at the block's largest element: that is still code 255
// (or 0 for -1 - ulp), the search's answer there too.
inline uint8_t quantize_moment(const CodeTable& table, bool is_signed, float value, float inverse) {
  const uint32_t code = nearest_code_lut(table, mul_rn(value, inverse));
  return static_cast<uint8_t>(is_signed ? keep_sign(code, value) : code);
}

}  // namespace strata::kernels::detail
