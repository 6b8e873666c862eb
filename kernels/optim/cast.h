// strata/kernels/optim/cast.h — fp32 ↔ bf16 and fp32 ↔ fp16 conversions on CPU, bit-exact
// against PyTorch 1.13's tensor `.to(dtype)`.
//
// Contract:
//   * Element types: fp32 as float; bf16 and fp16 as their raw 16-bit patterns (uint16_t), so a
//     tier's bytes can be passed as they are. Spans must have equal length; they may not overlap
//     (asserted). No alignment is required (unaligned vector loads), though 32-byte aligned
//     buffers are faster.
//   * Rounding: fp32 → bf16 and fp32 → fp16 round to nearest even; fp16 keeps subnormals and
//     overflows to ±inf. NaN: fp32 → bf16 gives 0xFFFF for every NaN and fp32 → fp16 gives
//     0x7E00 with the sign kept (both what torch does to a tensor); bf16 → fp32 is exact bits;
//     fp16 → fp32 keeps sign and payload and sets the quiet bit. See elementwise.h.
//   * ISA: `CpuIsa::best` picks AVX2+F16C+FMA at run time where the CPU has them, else the
//     scalar code. `scalar` forces the portable path (tests prove both give identical bits);
//     asking for `avx2` on a CPU without it asserts. `avx512` runs the AVX2 loops here (only
//     the 8-bit AdamW has AVX-512 loops, adamw8bit.h); asking for it without AVX-512 asserts.
//   * Threads: spans of at least kCastParallelMinElements are split across the calling thread's
//     TBB arena (run inside a tbb::task_arena to bound the threads); smaller ones run on the
//     caller. Any thread may call; calls on disjoint buffers may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/optim/elementwise.h"

namespace strata::kernels {

enum class CpuIsa : uint8_t {
  best,    // resolve at run time: avx2 where supported, else scalar
  scalar,  // portable C++; the reference every other path must match bit for bit
  avx2,    // AVX2 + FMA + F16C intrinsics
  avx512,  // AVX-512 F/BW/DQ/VL/VBMI on top of avx2: the 8-bit AdamW's loops; avx2 everywhere else
};
const char* cpu_isa_name(CpuIsa isa);
// What `best` resolves to on this CPU for every kernel but the 8-bit AdamW: avx2 or scalar
// (uses __builtin_cpu_supports once).
CpuIsa detect_cpu_isa();
// Whether this CPU (and the OS's saved register state) has AVX-512 F, BW, DQ, VL and VBMI besides
// what avx2 needs; what `best` resolves to in adamw8bit.h.
bool cpu_has_avx512();
// `best` → detect_cpu_isa(); `avx512` → avx2 (asserted supported); an explicit scalar or avx2
// is returned as is (asserted supported).
CpuIsa resolve_cpu_isa(CpuIsa isa);

// Spans shorter than this are converted on the calling thread: below it TBB's task overhead
// costs more than the second core saves.
inline constexpr size_t kCastParallelMinElements = size_t{1} << 18;

void cast_fp32_to_bf16(std::span<const float> src, std::span<uint16_t> dst,
                       CpuIsa isa = CpuIsa::best);
void cast_bf16_to_fp32(std::span<const uint16_t> src, std::span<float> dst,
                       CpuIsa isa = CpuIsa::best);
void cast_fp32_to_fp16(std::span<const float> src, std::span<uint16_t> dst,
                       CpuIsa isa = CpuIsa::best);
void cast_fp16_to_fp32(std::span<const uint16_t> src, std::span<float> dst,
                       CpuIsa isa = CpuIsa::best);

// One value at a time (the same functions the vector tails and the CUDA kernels use).
inline uint16_t fp32_to_bf16_bits(float value) { return detail::fp32_to_bf16_bits(value); }
inline float bf16_bits_to_fp32(uint16_t bits) { return detail::bf16_bits_to_fp32(bits); }
inline uint16_t fp32_to_fp16_bits(float value) { return detail::fp32_to_fp16_bits(value); }
inline float fp16_bits_to_fp32(uint16_t bits) { return detail::fp16_bits_to_fp32(bits); }

}  // namespace strata::kernels
