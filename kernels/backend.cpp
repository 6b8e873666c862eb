// make_backend and the sizes: the one place that picks a backend from a device kind.
#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"

namespace strata::kernels {

Result<std::unique_ptr<ComputeBackend>> make_backend(device::Device& device, const gpt2::BatchShape& max_shape) {
  switch (device.kind()) {
    case device::Kind::cpu:
      return make_cpu_backend(device);
    case device::Kind::cuda:
#if STRATA_HAVE_CUDA
      return make_cuda_backend(device, max_shape);
#else
      break;
#endif
  }
  (void)max_shape;
  return make_error(ErrorKind::unsupported, "this build has no compute backend for a CUDA device (nvcc was not found)");
}

size_t workspace_size_bytes(device::Kind kind, const gpt2::Config& config, const gpt2::BatchShape& max_shape) {
#if STRATA_HAVE_CUDA
  if (kind == device::Kind::cuda) return cuda_workspace_size_bytes(config, max_shape);
#endif
  (void)kind;
  return gpt2::workspace_size_bytes(config, max_shape);
}

size_t workspace_size_bytes(device::Kind kind, const llama::Config& config, const gpt2::BatchShape& max_shape) {
#if STRATA_HAVE_CUDA
  if (kind == device::Kind::cuda) return cuda_llama_workspace_size_bytes(config, max_shape);
#endif
  (void)kind;
  return llama::workspace_size_bytes(config, max_shape);
}

uint64_t fixed_device_bytes(device::Kind kind, const gpt2::BatchShape& max_shape) {
#if STRATA_HAVE_CUDA
  if (kind == device::Kind::cuda) return cuda_fixed_device_bytes(max_shape);
#endif
  (void)kind;
  (void)max_shape;
  return 0;
}

}  // namespace strata::kernels
