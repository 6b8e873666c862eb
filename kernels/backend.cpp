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

// Generation's defaults: a backend that has not written its decode ops says so.
static Error no_decode(const ComputeBackend& backend) {
  return make_error(ErrorKind::unsupported,
                    std::string("generation with a KV cache is not implemented on the ") + backend.name() +
                        " backend yet; use device.kind: cpu");
}
size_t ComputeBackend::decode_workspace_size_bytes(const gpt2::Config& config, int64_t max_rows,
                                                   int64_t max_positions) const {
  return gpt2::decode_workspace_size_bytes(config, max_rows, max_positions);
}
Status ComputeBackend::embedding_decode(const gpt2::Config&, int64_t, int64_t, const int32_t*, const float*,
                                        const float*, float*) {
  return no_decode(*this);
}
Status ComputeBackend::block_decode(const gpt2::Config&, int64_t, int64_t, const gpt2::BlockWeights&, const float*,
                                    float*, const gpt2::KvCacheBlock&, const gpt2::Workspace&) {
  return no_decode(*this);
}
Status ComputeBackend::head_logits(const gpt2::Config&, int64_t, const gpt2::HeadWeights&, const float*, float*,
                                   const gpt2::Workspace&) {
  return no_decode(*this);
}

size_t ComputeBackend::llama_decode_workspace_size_bytes(const llama::Config& config, int64_t max_rows,
                                                         int64_t max_positions) const {
  return llama::decode_workspace_size_bytes(config, max_rows, max_positions);
}
Status ComputeBackend::llama_embedding_decode(const llama::Config&, int64_t, const int32_t*, const float*, float*) {
  return no_decode(*this);
}
Status ComputeBackend::llama_block_decode(const llama::Config&, int64_t, int64_t, const llama::BlockWeights&,
                                          const float*, float*, const gpt2::KvCacheBlock&, const gpt2::Workspace&) {
  return no_decode(*this);
}
Status ComputeBackend::llama_head_logits(const llama::Config&, int64_t, const llama::HeadWeights&, const float*,
                                         float*, const gpt2::Workspace&) {
  return no_decode(*this);
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
