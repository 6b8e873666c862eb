// strata/kernels/optim/adamw8bit.h — AdamW with 8-bit block-wise moments (Dettmers et al.,
// "8-bit Optimizers via Block-wise Quantization"; bitsandbytes' AdamW8bit), fused with the
// bf16/fp16 compute copy. The update only: the optimizer seam owns the state and decides which
// tensors take it (adamw8bit_applies).
//
// Contract:
//   * State of one chunk of N elements (AdamW8bitState; the caller owns every buffer):
//       params            f32[N]            fp32 master params, updated in place
//       exp_avg_codes     u8[N]             m as indices into dynamic_code(signed = true)
//       exp_avg_sq_codes  u8[N]             v as indices into dynamic_code(signed = false)
//       exp_avg_absmax    f32[ceil(N/bs)]   one scale per block of bs elements for m
//       exp_avg_sq_absmax f32[ceil(N/bs)]   the same for v
//     Element i belongs to block i / bs, counted from the chunk's first element, so a tensor
//     split into chunks must split at multiples of bs (only the last chunk has a short tail
//     block). The value a code stands for is code_table[code] * absmax[block], in fp32.
//     adamw8bit_init writes the zero state (every code the table's 0.0, every absmax 0).
//   * Step t (1-based), per element, with the fp32 AdamW of adamw.h's operation order:
//       m0, v0 = dequantised state; g = grad * grad_scale
//       if g is NaN or ±inf: params and (m, v) = (m0, v0) stay as they are (the element is
//         skipped; the rest of its block updates normally);
//       else: p *= 1 - lr*wd; m = b1*m0 + (1-b1)*g; v = b2*v0 + (1-b2)*g*g;
//             p += (-lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//     The weight update reads the fresh fp32 m and v, never their requantised values. Then per
//     block: absmax = max |m| (resp. v) over the block's elements; each m times 1/absmax (the
//     reciprocal rounded to fp32 once per block; 1 for a block of zeros) is stored as the
//     NEAREST code: bitsandbytes' search (7 halving steps from index 127, then the midpoint
//     (a + b) * 0.5f in fp32 of the two neighbours decides; an exact tie keeps the even index,
//     where that search ends). For m, as bitsandbytes does, a negative value never becomes the
//     +0 code: it takes the smallest-magnitude negative code instead. (bitsandbytes divides by
//     absmax with the approximate __fdividef; it applies weight decay after the update and
//     zeroes the moments of a NaN/inf-gradient element: docs/optim.md.)
//   * The compute copy (copy.dtype bf16/f16) receives the updated params rounded like cast.h;
//     grads may be fp32 or bf16 (widened exactly), scaled by `grad_scale` as in adamw.h.
//   * Bits: the scalar, AVX2, AVX-512 and CUDA paths give identical params, codes and absmax for
//     every input, at any thread count (blocks are independent; max is exact and order-free).
//   * ISA: `CpuIsa::best` is the AVX-512 loop where cpu_has_avx512() (cast.h), else AVX2 where
//     the CPU has it, else scalar; an explicit `scalar`, `avx2` or `avx512` must be supported
//     (asserted).
//   * Threads: tiles of whole blocks across the calling thread's TBB arena, as adamw_step.
//     Allocation: none; a block's fresh moments and scratch live on the stack (64 KiB at most).
//   * Shapes: asserted — codes N, absmax ceil(N/bs), copy N when asked; 1 <= bs <= max.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/optim/adamw.h"

namespace strata::kernels {

// bitsandbytes' block size for its 8-bit optimizers.
inline constexpr size_t kAdamW8bitBlockElements = 256;
// The largest block the CPU kernels take: two fp32 scratch arrays of it sit on the stack (32 KiB).
inline constexpr size_t kAdamW8bitMaxBlockElements = 4096;
// bitsandbytes' min_8bit_size: smaller tensors keep fp32 moments (the fp32 adamw_step).
inline constexpr uint64_t kAdamW8bitMinElements = 4096;

// Whether a tensor of `element_count` elements takes 8-bit moments (bitsandbytes: fp32 state
// when numel < min_8bit_size).
constexpr bool adamw8bit_applies(uint64_t element_count,
                                 uint64_t min_8bit_size = kAdamW8bitMinElements) {
  return element_count >= min_8bit_size;
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 256 fp32 values,
// sorted ascending, 1.0 last; signed: 127 negatives, +0 at index 127, 128 positives; unsigned:
// 0 first. Built at first use by the same construction (torch's CPU linspace, fp32 means and
// scales), so the values are the bits bitsandbytes computes (tests check them against torch).
const std::array<float, 256>& dynamic_code(bool is_signed);
// Index of the +0 code in the signed table (what adamw8bit_init writes for m); 0 for v.
inline constexpr uint8_t kDynamicCodeSignedZero = 127;

// Number of absmax entries of a chunk of `count` elements.
constexpr size_t adamw8bit_block_count(size_t count, size_t block_elements = kAdamW8bitBlockElements) {
  return (count + block_elements - 1) / block_elements;
}
// State bytes of a chunk besides the fp32 params: two codes per element, two absmax per block.
constexpr uint64_t adamw8bit_state_bytes(uint64_t count, size_t block_elements = kAdamW8bitBlockElements) {
  return 2 * count + 2 * sizeof(float) * adamw8bit_block_count(count, block_elements);
}

// Non-owning views of one chunk's state (see the contract for sizes).
struct AdamW8bitState {
  std::span<float> params;
  std::span<uint8_t> exp_avg_codes;
  std::span<uint8_t> exp_avg_sq_codes;
  std::span<float> exp_avg_absmax;
  std::span<float> exp_avg_sq_absmax;
  size_t block_elements = kAdamW8bitBlockElements;
};

// The zero state (moments 0), as torch and bitsandbytes start.
void adamw8bit_init(const AdamW8bitState& state);

// One step over one chunk (fp32 or bf16 gradients, `count` = params.size()).
void adamw8bit_step(const AdamWStepScalars& scalars, const AdamW8bitState& state,
                    std::span<const float> grads, ComputeCopy copy = {}, CpuIsa isa = CpuIsa::best);
void adamw8bit_step_bf16_grads(const AdamWStepScalars& scalars, const AdamW8bitState& state,
                               std::span<const uint16_t> grads_bf16, ComputeCopy copy = {},
                               CpuIsa isa = CpuIsa::best);

// The moments a state stands for, in fp32: code_table[code] * absmax[block] (what the step reads
// back before it updates), `count` floats each. For a caller that shows the state (the C API's
// get_state, a torch state_dict). Single-threaded; no allocation.
void adamw8bit_dequantize(const AdamW8bitState& state, std::span<float> exp_avg, std::span<float> exp_avg_sq);
// The reverse, as the step itself quantises its fresh moments: per block absmax = max |x|, then
// each x as its nearest code (the signed rule for m included). Values must be finite (asserted:
// the caller refuses others). A dequantise → quantise round trip gives back the same codes and
// absmax except where a block's largest |m| is negative: the signed map's most negative code is
// -0.9922 (bitsandbytes' map has no -1), so that block's absmax shrinks to 0.9922 of itself and
// its codes are re-derived against it. Single-threaded; no allocation.
void adamw8bit_quantize(const AdamW8bitState& state, std::span<const float> exp_avg,
                        std::span<const float> exp_avg_sq);

}  // namespace strata::kernels
