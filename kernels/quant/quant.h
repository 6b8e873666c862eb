// strata/kernels/quant/quant.h — the quantised frozen base (issue 31): NF4 and int8 block-wise
// storage of a unit's linear weights, quantised once on the CPU at `model.init` and
// dequantised to fp32 by a backend op (ComputeBackend::dequantize_unit) right before each use.
//
// Contract
// - Formats (docs/quant.md has the byte-level picture):
//   * NF4, as QLoRA (Dettmers et al. 2023) and bitsandbytes' quantize_4bit(quant_type="nf4")
//     define it: blocks of kBlockElements (64) consecutive elements of a tensor, counted from
//     its first element (the last block may be short); per block absmax = max |x| (fp32);
//     each x becomes the index of the nearest of the 16 kNf4Levels to x · (1/absmax) — the
//     reciprocal rounded to fp32 once per block, as bitsandbytes multiplies by it (where that
//     reciprocal overflows, absmax < 2^-128, x / absmax instead: see quant_element.h); a value
//     exactly on the fp32 midpoint of two levels takes the lower one (bitsandbytes' `x > t`
//     tree). Two codes per byte, the FIRST element in the HIGH nibble (bitsandbytes' order);
//     an odd tensor's last low nibble is 0. Dequantised: kNf4Levels[code] · absmax (fp32).
//   * int8, symmetric block-wise absmax (our own, simple format — NOT LLM.int8()'s
//     vector-wise scaling with fp16 outlier columns): blocks of 64, absmax per block,
//     scale = absmax / 127 (fp32), code = round-half-even(x / scale) clamped to [-127, 127]
//     (torch.round's rule). Dequantised: code · scale.
//   * A block of zeros (absmax 0) takes the zero code — NF4 code 7, int8 0 — and dequantises
//     to exactly 0. (bitsandbytes multiplies by 1/0 = inf there and stores code 0; the value it
//     reads back is also 0, as -0.)
//   * Double quantisation (QLoRA §"Double Quantization", bitsandbytes compress_statistics),
//     for either kind: per tensor, mean = (Σ absmax in double, first block first) / count,
//     rounded to fp32; the centred absmax[i] - mean (fp32) are quantised block-wise, blocks of
//     kAbsmaxBlockElements (256), to 8-bit indices into bitsandbytes' signed dynamic map
//     (kernels/optim/adamw8bit.h's dynamic_code(true) — the one table strata has) with that
//     block's fp32 absmax2 and the same nearest-code search as bitsandbytes'
//     quantize_blockwise (scale 1/absmax2 rounded to fp32; 1 for a block of zeros). The codes
//     of the tensor are computed against the EXACT absmax, as bitsandbytes does; dequantisation
//     reads absmax[i] = code[q[i]] · absmax2[i / 256] + mean (two fp32 roundings, no FMA).
// - Layout of a unit (`UnitLayout`): the unit is a list of tensors packed back to back in fp32
//   (models/model.h's Unit); the quantised unit is one buffer holding, per tensor in order,
//   either its raw fp32 copy or its pieces (codes, absmax or the double-quant trio), each piece
//   starting on a kPieceAlignmentBytes (64) boundary of the buffer, padding zero-filled. What
//   is quantised is the caller's choice per tensor (`TensorPlan::quantize`: QLoRA quantises
//   the 2-D linear weights, keeps norms, biases and embeddings as they are).
// - Memory and alignment: `out`/`in` are `size_bytes` long and 64-byte aligned (asserted);
//   `unit_fp32` holds the unit's `element_count` floats (4-byte aligned). The caller owns all.
//   dequantize_unit allocates nothing (its work split is fixed by make_unit_layout);
//   quantize_unit, init-time work, keeps one float per block while double-quantising.
// - Errors: shapes are programmer errors and assert. A corrupt or short buffer is the caller's
//   (the store verifies every extent's checksum before it reaches here); no code value can
//   index outside a table, so a corrupt buffer gives wrong numbers, never a crash. Non-finite
//   inputs to quantize_unit are the caller's to refuse (the checkpoint loader): their codes are
//   unspecified but the call is safe.
// - Threads: both functions split the unit into `UnitLayout::chunks` across the calling
//   thread's TBB arena; the bits do not depend on the thread count. Any thread may call.
// - Bits: the CPU kernel (here) and the CUDA one (quant_cuda.h) give identical fp32 values
//   (one rounding per operation, no contraction; kernels/quant/quant_element.h holds the
//   per-element math both compile). tests/quant checks them against an independent numpy/torch
//   implementation, bit for bit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/optim/cast.h"

namespace strata::kernels::quant {

enum class Kind : uint8_t { nf4, int8 };
const char* kind_name(Kind kind);  // "nf4", "int8"

// QLoRA's and bitsandbytes' block size for the weights.
inline constexpr uint64_t kBlockElements = 64;
// bitsandbytes' block size for the double-quantised absmax (quantize_blockwise(blocksize=256)).
inline constexpr uint64_t kAbsmaxBlockElements = 256;
// Every piece of a quantised unit starts on this boundary (cache line; AVX-512 and CUDA
// vector loads; the store's direct-I/O alignment is a multiple of it).
inline constexpr uint64_t kPieceAlignmentBytes = 64;
// NF4's zero code (kNf4Levels[7] == 0).
inline constexpr uint8_t kNf4ZeroCode = 7;

// The 16 NF4 levels, ascending, exactly bitsandbytes' table (functional.py, get_4bit_type
// "nf4"; the same literals as dDequantizeNF4 in csrc/kernels.cu). Where they come from:
// create_normal_map(offset=0.9677083, use_extra_value=True) — the standard normal's quantiles
// at 8 evenly spaced probabilities from 0.9677083 to 0.5 for the positive side (0.5, i.e. 0,
// dropped), 7 from 0.9677083 to 0.5 for the negative side, plus an exact 0, all divided by
// the largest: asymmetric so that 0 is represented exactly (QLoRA §3, "4-bit NormalFloat").
// tests/quant recomputes them from the normal quantile function.
inline constexpr std::array<float, 16> kNf4Levels = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// One tensor of a unit, as the caller plans it.
struct TensorPlan {
  uint64_t element_count = 0;
  bool quantize = false;  // 2-D linear weights: true; norms, biases, embeddings: false
};

// Where one tensor lives in the unit's fp32 array and in the quantised buffer. Offsets are
// bytes from the buffer's start; a piece the tensor does not have is kNoPiece.
inline constexpr uint64_t kNoPiece = ~uint64_t{0};
struct TensorLayout {
  uint64_t element_count = 0;
  uint64_t element_offset = 0;  // first element in the unit's fp32 array
  bool quantized = false;
  uint64_t raw_offset_bytes = kNoPiece;     // fp32[element_count]       (not quantised)
  uint64_t codes_offset_bytes = kNoPiece;   // nf4: u8[ceil(n/2)], int8: i8[n]
  uint64_t absmax_offset_bytes = kNoPiece;  // fp32[blocks]; double quant: u8[blocks]
  uint64_t absmax2_offset_bytes = kNoPiece; // double quant: fp32[ceil(blocks/256)]
  uint64_t absmax_mean_offset_bytes = kNoPiece;  // double quant: one fp32
  uint64_t block_count = 0;    // ceil(n / 64) when quantised
  uint64_t absmax_block_count = 0;  // ceil(block_count / 256) with double quant
};

// A run of whole 64-element blocks (or, for a raw tensor, elements) of one tensor: the unit
// of parallel work, fixed at layout time so that the kernels allocate nothing.
struct Chunk {
  uint32_t tensor_index = 0;
  uint64_t begin_element = 0;  // within the tensor; a multiple of kBlockElements
  uint64_t element_count = 0;
};

struct UnitLayout {
  Kind kind = Kind::nf4;
  bool double_quant = false;
  std::vector<TensorLayout> tensors;
  std::vector<Chunk> chunks;
  uint64_t element_count = 0;  // floats of the unit's fp32 array
  uint64_t size_bytes = 0;     // bytes of the quantised buffer (a multiple of 64)
};

// Elements per Chunk: 256 blocks, 16 KiB of codes-or-less in, 64 KiB of fp32 out — big enough
// that TBB's per-task cost vanishes, small enough that a 4096² weight splits into 1024 tasks.
inline constexpr uint64_t kChunkElements = 256 * kBlockElements;

// The layout of a unit with these tensors (in the unit's order).
UnitLayout make_unit_layout(Kind kind, const std::vector<TensorPlan>& tensors, bool double_quant);

// Bytes of one quantised tensor of `element_count` elements inside a unit, with its padding
// (what make_unit_layout adds for it), for planning without building a layout.
uint64_t quantized_tensor_bytes(Kind kind, uint64_t element_count, bool double_quant);

// Quantise the unit's fp32 array (`element_count` floats) into `out` (`size_bytes`, 64-byte
// aligned). Every byte of `out` is written (padding zero), so equal inputs give equal buffers.
void quantize_unit(const UnitLayout& layout, const float* unit_fp32, std::byte* out);

// Dequantise `in` (a buffer quantize_unit wrote) into the unit's fp32 array; raw tensors are
// copied as they are. `isa` as cast.h's: `best` is the AVX2 loop where the CPU has it (a
// 16-entry table lookup by vpermps), `scalar` the reference; both give the same bits.
void dequantize_unit(const UnitLayout& layout, const std::byte* in, float* unit_fp32, CpuIsa isa = CpuIsa::best);

}  // namespace strata::kernels::quant
