// strata/kernels/quant/quant_cuda.h — the CUDA twin of quant.h's dequantize_unit (only built
// where nvcc is found: STRATA_HAVE_CUDA).
//
// Contract:
//   * Same math, same bits as the CPU kernel: quant_element.h's per-element functions with
//     _rn intrinsics (no FMA contraction), so the fp32 unit equals quant::dequantize_unit's.
//   * Memory: `src` (the quantised unit, 64-byte aligned) and `dst` (the unit's fp32 array) are
//     device memory the caller owns and keeps alive until the stream has run the work; nothing
//     is allocated (the signed dynamic map travels as a kernel argument).
//   * Streams: one launch per quantised tensor (its code tables in shared memory), one
//     cudaMemcpyAsync per raw one, all enqueued on `stream`; the call returns without waiting.
//     The Status reports a failed launch; faults while running surface at the next
//     synchronisation. Any host thread may call.
#pragma once

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/quant/quant.h"

namespace strata::kernels::quant::cuda {

[[nodiscard]] Status dequantize_unit(const UnitLayout& layout, const void* src, float* dst, cudaStream_t stream);

}  // namespace strata::kernels::quant::cuda
