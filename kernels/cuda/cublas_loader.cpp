// The six cuBLAS entry points the CUDA kernels use, resolved from libcublas with dlopen the first
// time one is called, instead of linking libcublas into every strata binary.
//
// Why: linking cuBLAS (and through it cuBLASLt, ~0.5 GB of library) costs every process ~160 MB
// of resident memory at start-up for the libraries' relocations, GPU or not — a CPU run of a CUDA
// build then broke its documented RSS bound (budgets + 64 MiB; tests/engine/test_train.py
// budgets). Loaded on first use, only a process that makes a cuBLAS handle pays for it.
//
// The definitions below take the exact declarations of cublas_v2.h (a signature that drifts
// from the header is a compile error), and forward to the library's own symbols. If the library
// cannot be loaded every call returns CUBLAS_STATUS_NOT_INITIALIZED, which Context::create
// reports as an error (never a crash).
//
// Where: common/runtime_library.h's search (the loader's path, the CUDA toolkit, pip wheels),
// so a strata bundle finds the cuBLAS of the machine it lands on (scripts/gpu-bundle.sh).
#include "kernels/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <cublas_v2.h>

namespace strata::kernels {

#define STRATA_STRINGIFY_INNER(x) #x
#define STRATA_STRINGIFY(x) STRATA_STRINGIFY_INNER(x)

// The library of the major version the headers describe (the ABI they were compiled against);
// no unversioned fallback, since a libcublas.so of another major would take these calls with
// another ABI.
const RuntimeLibrary& cublas_runtime_library() {
  static const RuntimeLibrary library = open_runtime_library("libcublas.so." STRATA_STRINGIFY(CUBLAS_VER_MAJOR));
  return library;
}

}  // namespace strata::kernels

namespace {

template <typename Fn>
Fn resolve(const char* name) {
  void* library = strata::kernels::cublas_runtime_library().handle;
  return library == nullptr ? nullptr : reinterpret_cast<Fn>(dlsym(library, name));
}

}  // namespace

#define STRATA_FORWARD(name, params, args)                                                     \
  extern "C" cublasStatus_t CUBLASWINAPI name params {                                          \
    static const auto fn = resolve<decltype(&name)>(#name);                                     \
    return fn == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : fn args;                             \
  }

STRATA_FORWARD(cublasCreate_v2, (cublasHandle_t* handle), (handle))
STRATA_FORWARD(cublasDestroy_v2, (cublasHandle_t handle), (handle))
STRATA_FORWARD(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
STRATA_FORWARD(cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
STRATA_FORWARD(cublasSgemm_v2,
               (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta, float* C,
                int ldc),
               (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
STRATA_FORWARD(cublasSgemmStridedBatched,
               (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
                long long int strideB, const float* beta, float* C, int ldc, long long int strideC, int batchCount),
               (handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                batchCount))
