// make_backend and the sizes: the one place that picks a backend from a device kind.
#include "kernels/backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace strata::kernels {

Result<std::unique_ptr<ComputeBackend>> make_backend(device::Device& device, const BatchShape& max_shape) {
  switch (device.kind()) {
    case device::Kind::cpu:
    case device::Kind::emulated:  // a discrete device whose kernels are the CPU's (device.h)
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

Status check_targets(const int32_t* targets, int64_t rows, int64_t vocab_size) {
  for (int64_t row = 0; row < rows; ++row)
    if (targets[row] >= vocab_size)  // negative: a loss mask (StepBatch)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("target token id {} (row {}) is outside the model's vocabulary of {} tokens "
                                    "(ids 0..{}): the data was tokenized for another vocabulary",
                                    targets[row], row, vocab_size, vocab_size - 1));
  return Status();
}

Status check_packing(const int32_t* positions, const int32_t* segments, const BatchShape& shape) {
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t t = 0; t < shape.seq_len; ++t) {
      const int64_t r = b * shape.seq_len + t;
      if (positions != nullptr && (positions[r] < 0 || positions[r] >= shape.seq_len))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("packed position {} (batch row {}, token {}) is outside 0..{}: a position "
                                      "within an example must be below the sequence length {}",
                                      positions[r], b, t, shape.seq_len - 1, shape.seq_len));
      if (segments != nullptr && t > 0 && segments[r] < segments[r - 1])
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("packed segment id {} (batch row {}, token {}) follows id {}: segment ids "
                                      "must not decrease along a row (each example one contiguous run)",
                                      segments[r], b, t, segments[r - 1]));
    }
  }
  return Status();
}

int64_t count_trained_targets(const int32_t* targets, int64_t rows) {
  int64_t count = 0;
  for (int64_t row = 0; row < rows; ++row) count += targets[row] >= 0 ? 1 : 0;
  return count;
}

namespace {
// Sizes follow the kernels that run, not the device: emulated runs the CPU backend.
bool runs_cpu_kernels(device::Kind kind) { return kind != device::Kind::cuda; }
}  // namespace

size_t attention_decode_scratch_bytes(device::Kind kind, int64_t max_rows, int64_t n_head, int64_t max_positions) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_attention_decode_scratch_bytes(max_rows, n_head, max_positions);
#endif
  (void)kind;
  return cpu_ops::attention_decode_scratch_bytes(max_rows, n_head, max_positions);
}

size_t matmul_bf16_scratch_bytes(device::Kind kind, int64_t max_in, int64_t max_out) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_matmul_bf16_scratch_bytes(max_in, max_out);
#endif
  (void)kind;
  return cpu_ops::matmul_bf16_scratch_bytes(max_in, max_out);
}

size_t attention_scratch_bytes(device::Kind kind, const BatchShape& shape, int64_t n_head, int64_t head_dim) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_attention_scratch_bytes(shape, n_head, head_dim);
#endif
  (void)kind;
  return cpu_ops::attention_scratch_bytes(shape, n_head, head_dim);
}

uint64_t fixed_device_bytes(device::Kind kind, const BatchShape& max_shape) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_fixed_device_bytes(max_shape);
#endif
  (void)kind;
  (void)max_shape;
  return 0;
}

}  // namespace strata::kernels
