// kernels/cuda/cublas_context.cu — the cuBLAS Context (cublas_context.h): the handle created on
// the loaded cuBLAS, bound to the stream, in pedantic math.
#include "kernels/cuda/cublas_context.h"

#include <utility>

#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_common.cuh"

namespace strata::kernels::cuda {

Result<Context> Context::create(cudaStream_t stream) {
  // cuBLAS is loaded at run time (kernels/cuda/cublas_loader.h): a machine without it gets the
  // places searched, not cuBLAS's bare NOT_INITIALIZED.
  if (const RuntimeLibrary& cublas = kernels::cublas_runtime_library(); cublas.handle == nullptr)
    return make_error(ErrorKind::unsupported, "cuBLAS not found (tried " + cublas.tried + "); install the CUDA "
                      "toolkit or the nvidia-cublas wheel, or put its lib folder on LD_LIBRARY_PATH");
  cublasHandle_t handle = nullptr;
  cublasStatus_t code = cublasCreate(&handle);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("create", code);
  Context ctx(stream, handle);  // owns the handle from here on
  code = cublasSetStream(handle, stream);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("set stream", code);
  // Pedantic: plain fp32 products, never TF32, so the CUDA results match the CPU's rounding.
  code = cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("set math mode", code);
  return Result<Context>(std::move(ctx));
}

Context::Context(Context&& other) noexcept
    : stream_(other.stream_), cublas_(std::exchange(other.cublas_, nullptr)) {}

Context& Context::operator=(Context&& other) noexcept {
  std::swap(stream_, other.stream_);
  std::swap(cublas_, other.cublas_);
  return *this;
}

Context::~Context() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

}  // namespace strata::kernels::cuda
