// strata/kernels/optim/optim_cuda.h — the CUDA twins of adamw.h and cast.h (only built where
// nvcc is found: STRATA_HAVE_CUDA).
//
// Contract:
//   * Same math, same bits: every kernel runs the element functions of elementwise.h with
//     explicit round-to-nearest intrinsics (no FMA contraction), so AdamW, its compute copy and
//     the casts give exactly the CPU's bits (tests/optim/test_optim_cuda.cpp checks it).
//   * Memory: every pointer is device (or managed) memory the caller owns and keeps alive until
//     the stream has run the work; nothing is allocated here. Spans of one call must not overlap.
//     No alignment is required beyond the element's own.
//   * Streams: each call only enqueues on `stream` and returns; the Status reports a failed
//     launch (bad configuration, no device), while faults during execution surface at the next
//     synchronisation, as CUDA reports them. Any host thread may call.
//   * Sum of squares: a fixed grid (kCudaSumSquaresBlocks blocks of kCudaSumSquaresThreads) and
//     fixed-order trees, in double: the bits depend only on the data — not on the GPU model, the
//     SM count or timing. They differ from the CPU's sum in the last bits (another order).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/optim/elementwise.h"

namespace strata::kernels::cuda {

using detail::AdamWStepScalars;  // built on the host by adamw_step_scalars() (adamw.h)

// `copy_dtype` bf16 or fp16 writes the compute copy to `copy` (count patterns); f32 writes none.
[[nodiscard]] Status adamw_step(const AdamWStepScalars& scalars, float* params, const float* grads,
                                float* exp_avg, float* exp_avg_sq, size_t count, DType copy_dtype,
                                uint16_t* copy, cudaStream_t stream);
[[nodiscard]] Status adamw_step_bf16_grads(const AdamWStepScalars& scalars, float* params,
                                           const uint16_t* grads_bf16, float* exp_avg,
                                           float* exp_avg_sq, size_t count, DType copy_dtype,
                                           uint16_t* copy, cudaStream_t stream);

// As adamw_step, but the gradient scale is read from `grad_scale` (one device float, e.g. what
// clip_coefficient left there) when the kernel runs, instead of scalars.grad_scale: clipping
// without a host round trip.
[[nodiscard]] Status adamw_step_device_scale(const AdamWStepScalars& scalars, const float* grad_scale,
                                             float* params, const float* grads, float* exp_avg,
                                             float* exp_avg_sq, size_t count, DType copy_dtype,
                                             uint16_t* copy, cudaStream_t stream);
// adamw8bit.h's step on the device (adamw8bit.cu), same bits as the CPU: one chunk of `count`
// elements in blocks of `block_elements` (1..kAdamW8bitMaxBlockElements, else invalid_argument);
// codes, absmax, params, grads and copy are device memory laid out as adamw8bit.h says.
// `device_grad_scale`, when not null, replaces scalars.grad_scale as in adamw_step_device_scale.
[[nodiscard]] Status adamw8bit_step(const AdamWStepScalars& scalars, const float* device_grad_scale, float* params,
                                    const float* grads, uint8_t* exp_avg_codes, uint8_t* exp_avg_sq_codes,
                                    float* exp_avg_absmax, float* exp_avg_sq_absmax, size_t count,
                                    size_t block_elements, DType copy_dtype, uint16_t* copy, cudaStream_t stream);
[[nodiscard]] Status adamw8bit_step_bf16_grads(const AdamWStepScalars& scalars, const float* device_grad_scale,
                                               float* params, const uint16_t* grads_bf16, uint8_t* exp_avg_codes,
                                               uint8_t* exp_avg_sq_codes, float* exp_avg_absmax,
                                               float* exp_avg_sq_absmax, size_t count, size_t block_elements,
                                               DType copy_dtype, uint16_t* copy, cudaStream_t stream);

// adamw.h's clip_coefficient(sqrt(*sum_squares), max_norm) on the device, same bits, into
// *coefficient (device memory).
[[nodiscard]] Status clip_coefficient(const double* sum_squares, double max_norm, float* coefficient,
                                      cudaStream_t stream);
[[nodiscard]] Status cast_fp32_to_bf16(const float* src, uint16_t* dst, size_t count, cudaStream_t stream);
[[nodiscard]] Status cast_bf16_to_fp32(const uint16_t* src, float* dst, size_t count, cudaStream_t stream);
[[nodiscard]] Status cast_fp32_to_fp16(const float* src, uint16_t* dst, size_t count, cudaStream_t stream);
[[nodiscard]] Status cast_fp16_to_fp32(const uint16_t* src, float* dst, size_t count, cudaStream_t stream);

inline constexpr unsigned kCudaSumSquaresBlocks = 512;
inline constexpr unsigned kCudaSumSquaresThreads = 256;
// The scratch the sum needs: one double per block, device memory, allocated once by the caller.
inline constexpr size_t kCudaSumSquaresWorkspaceBytes = kCudaSumSquaresBlocks * sizeof(double);

// Σ x² over `count` values into `*result` (device memory): stored, or added to what is there
// when `accumulate` — call once per tensor in a fixed order for a deterministic global sum.
[[nodiscard]] Status sum_squares(const float* values, size_t count, double* workspace,
                                 double* result, bool accumulate, cudaStream_t stream);
[[nodiscard]] Status sum_squares_bf16(const uint16_t* values, size_t count, double* workspace,
                                      double* result, bool accumulate, cudaStream_t stream);

}  // namespace strata::kernels::cuda
