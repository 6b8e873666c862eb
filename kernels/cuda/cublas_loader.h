// strata/kernels/cuda/cublas_loader.h — which cuBLAS the CUDA kernels use (kernels/cuda/
// cublas_loader.cpp resolves its entry points from it on first use).
//
// Contract: the first call opens the library (common/runtime_library.h's search) and every call
// after returns the same result; thread-safe. `handle == nullptr` means no cuBLAS of the
// headers' major version was found, and `tried` says where it was looked for.
#pragma once

#include "common/runtime_library.h"

namespace strata::kernels {

const RuntimeLibrary& cublas_runtime_library();

}  // namespace strata::kernels
