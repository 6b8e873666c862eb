// strata/kernels/cpu/cpu_backend.h — for backend.cpp only: the constructors behind make_backend.
// Users include kernels/backend.h.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "strata_build_config.h"

namespace strata::kernels {

// The CPU backend on a CPU device (a compute stream of its own; no device memory taken).
[[nodiscard]] Result<std::unique_ptr<ComputeBackend>> make_cpu_backend(device::Device& device);

#if STRATA_HAVE_CUDA
// kernels/cuda/cuda_backend.cpp: only in CUDA builds.
[[nodiscard]] Result<std::unique_ptr<ComputeBackend>> make_cuda_backend(device::Device& device,
                                                                        const BatchShape& max_shape);
uint64_t cuda_fixed_device_bytes(const BatchShape& max_shape);
size_t cuda_attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim);
size_t cuda_attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions);
size_t cuda_matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out);
#endif

}  // namespace strata::kernels
