// strata/kernels/lora/lora_cuda.h — the CUDA twin of lora.h's op: the same math, scratch layout
// and dropout mask (lora.h's hash, evaluated per element on the device), with DEVICE pointers
// on a cublas_context.h Context's stream. The CUDA backend's lora_* ops call it per targeted linear.
//
// Contract (differences from lora.h only)
// - Every pointer (x, y, dy, dx, A, B, their grads, scratch) is device memory; the calls enqueue
//   on ctx's stream and return without waiting. Spec, mask_key and the slot are host values.
// - Products are cuBLAS sgemm in pedantic fp32; `scale` rides in the GEMMs' alpha (lora.h scales
//   the [rows, rank] factor instead), so results agree with the CPU op to fp32 rounding, and the
//   mask is the CPU's bit for bit. Run-to-run determinism as cublas_context.h says (no atomics).
// - Errors: a failed launch or cuBLAS call is a Status; bad shapes and short scratch assert.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/cublas_context.h"
#include "kernels/lora/lora.h"

namespace strata::kernels::lora::cuda {

using kernels::cuda::Context;

// y += scale · drop(x)·Aᵀ·Bᵀ; nothing when adapter.a is null.
[[nodiscard]] Status forward(const Context& ctx, const Spec& spec, uint64_t mask_key, int target, const float* x,
                             int64_t rows, int64_t in, int64_t out, Adapter adapter, float* y,
                             const Workspace& scratch);
// lora.h's two halves of the backward (d_A, d_B and du into `slot`; then dx += the adapter's share).
[[nodiscard]] Status backward_params(const Context& ctx, const Spec& spec, uint64_t mask_key, int target,
                                     const float* x, int64_t rows, int64_t in, int64_t out, Adapter adapter,
                                     const float* dy, AdapterGrads grads, const Workspace& scratch, int slot);
[[nodiscard]] Status backward_input(const Context& ctx, const Spec& spec, uint64_t mask_key, int target, int64_t rows,
                                    int64_t in, Adapter adapter, float* dx, const Workspace& scratch, int slot);


// The CUDA backend's lora_* ops (cuda_backend.cpp), as lora.h's CPU ones: the op of
// `target` with the block's spec, key and scratch — nothing when `adapters` does not target it.
[[nodiscard]] Status adapter_forward(const Context& ctx, const BlockAdapters* adapters, int target, const float* x,
                                     int64_t rows, int64_t in, int64_t out, float* y);
[[nodiscard]] Status adapter_backward_params(const Context& ctx, const BlockAdapters* adapters, int target,
                                             const float* x, int64_t rows, int64_t in, int64_t out, const float* dy,
                                             int slot = 0);
[[nodiscard]] Status adapter_backward_input(const Context& ctx, const BlockAdapters* adapters, int target,
                                            int64_t rows, int64_t in, float* dx, int slot = 0);

}  // namespace strata::kernels::lora::cuda
