// make_backend and the sizes: the one place that picks a backend from a device kind.
#include "kernels/backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace strata::kernels {

Result<std::unique_ptr<ComputeBackend>> make_backend(device::Device& device, const gpt2::BatchShape& max_shape) {
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

Status check_packing(const int32_t* positions, const int32_t* segments, const gpt2::BatchShape& shape) {
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

// --- bf16 decoding: the default widens into the caller's scratch and runs the fp32 op ---
namespace {

size_t floats_bytes(int64_t count) { return static_cast<size_t>((count + 15) / 16 * 16) * sizeof(float); }

// A block widened whole, or the head: its norm vectors (64-byte aligned slices of C floats)
// and one piece of kDecodeHeadPieceRows vocabulary rows.
size_t widen_all_bytes(int64_t block_elements, int64_t norm_vectors, int64_t c, int64_t vocab) {
  return std::max(floats_bytes(block_elements),
                  static_cast<size_t>(norm_vectors) * floats_bytes(c) +
                      floats_bytes(std::min(vocab, kDecodeHeadPieceRows) * c));
}

size_t default_bf16_scratch_bytes(const gpt2::Config& config) {
  return widen_all_bytes(gpt2::block_param_count(config), 2, config.n_embd, config.vocab_size);
}
size_t default_bf16_scratch_bytes(const llama::Config& config) {
  return widen_all_bytes(llama::block_param_count(config), 1, config.n_embd, config.vocab_size);
}

}  // namespace

size_t ComputeBackend::decode_bf16_scratch_bytes(const gpt2::Config& config) const {
  return default_bf16_scratch_bytes(config);
}

Status ComputeBackend::block_decode_bf16(const gpt2::Config& config, int64_t past, int64_t rows,
                                         const gpt2::BlockWeightsBf16& weights, const float* x_in, float* x_out,
                                         const gpt2::KvCacheBlock& cache, const gpt2::Workspace& workspace,
                                         const gpt2::Workspace& scratch) {
  const gpt2::BlockGrads widened = gpt2::bind_block(config, scratch.data);  // fp32, packed like the unit
  const auto specs = gpt2::block_param_specs(config);
  for (int i = 0; i < gpt2::kBlockParamCount; ++i)
    STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.at(i), widened.at(i), static_cast<uint64_t>(specs[i].numel())));
  return block_decode(config, past, rows, gpt2::bind_block(config, static_cast<const float*>(scratch.data)), x_in,
                      x_out, cache, workspace);
}

Status ComputeBackend::head_logits_bf16(const gpt2::Config& config, int64_t rows, const gpt2::HeadWeightsBf16& weights,
                                        const float* x_final, float* logits, const gpt2::Workspace& workspace,
                                        const gpt2::Workspace& scratch) {
  const int64_t c = config.n_embd;
  float* gain = scratch.data;
  float* bias = gain + floats_bytes(c) / sizeof(float);
  float* piece = bias + floats_bytes(c) / sizeof(float);
  STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.ln_f_weight, gain, uint64_t(c)));
  STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.ln_f_bias, bias, uint64_t(c)));
  for (int64_t r0 = 0; r0 < config.vocab_size; r0 += kDecodeHeadPieceRows) {
    gpt2::Config piece_config = config;
    piece_config.vocab_size = std::min(kDecodeHeadPieceRows, config.vocab_size - r0);
    STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.wte + r0 * c, piece, uint64_t(piece_config.vocab_size * c)));
    STRATA_RETURN_IF_ERROR(
        head_logits(piece_config, rows, gpt2::HeadWeights{gain, bias, piece}, x_final, logits + r0, workspace));
  }
  return Status();
}

size_t ComputeBackend::llama_decode_bf16_scratch_bytes(const llama::Config& config) const {
  return default_bf16_scratch_bytes(config);
}

Status ComputeBackend::llama_block_decode_bf16(const llama::Config& config, int64_t past, int64_t rows,
                                               const llama::BlockWeightsBf16& weights, const float* x_in,
                                               float* x_out, const gpt2::KvCacheBlock& cache,
                                               const gpt2::Workspace& workspace, const gpt2::Workspace& scratch) {
  // bind_block packs a block back to back from its first tensor, so the whole block widens in
  // one cast whichever optional tensors (biases) the config has.
  STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.input_layernorm, scratch.data,
                                           static_cast<uint64_t>(llama::block_param_count(config))));
  return llama_block_decode(config, past, rows, llama::bind_block(config, static_cast<const float*>(scratch.data)),
                            x_in, x_out, cache, workspace);
}

Status ComputeBackend::llama_head_logits_bf16(const llama::Config& config, int64_t rows,
                                              const llama::HeadWeightsBf16& weights, const float* x_final,
                                              float* logits, const gpt2::Workspace& workspace,
                                              const gpt2::Workspace& scratch) {
  const int64_t c = config.n_embd;
  float* norm = scratch.data;
  float* piece = norm + floats_bytes(c) / sizeof(float);
  STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.norm_weight, norm, uint64_t(c)));
  for (int64_t r0 = 0; r0 < config.vocab_size; r0 += kDecodeHeadPieceRows) {
    llama::Config piece_config = config;
    piece_config.vocab_size = std::min(kDecodeHeadPieceRows, config.vocab_size - r0);
    STRATA_RETURN_IF_ERROR(cast_bf16_to_fp32(weights.lm_head + r0 * c, piece, uint64_t(piece_config.vocab_size * c)));
    STRATA_RETURN_IF_ERROR(
        llama_head_logits(piece_config, rows, llama::HeadWeights{norm, piece}, x_final, logits + r0, workspace));
  }
  return Status();
}

namespace {
// Sizes follow the kernels that run, not the device: emulated runs the CPU backend.
bool runs_cpu_kernels(device::Kind kind) { return kind != device::Kind::cuda; }
}  // namespace

size_t decode_bf16_scratch_bytes(device::Kind kind, const gpt2::Config& config) {
  return runs_cpu_kernels(kind) ? gpt2::decode_bf16_scratch_bytes(config) : default_bf16_scratch_bytes(config);
}
size_t decode_bf16_scratch_bytes(device::Kind kind, const llama::Config& config) {
  return runs_cpu_kernels(kind) ? llama::decode_bf16_scratch_bytes(config) : default_bf16_scratch_bytes(config);
}

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

size_t decode_workspace_size_bytes(device::Kind kind, const gpt2::Config& config, int64_t max_rows,
                                   int64_t max_positions) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_decode_workspace_size_bytes(config, max_rows, max_positions);
#endif
  (void)kind;
  return gpt2::decode_workspace_size_bytes(config, max_rows, max_positions);
}

size_t decode_workspace_size_bytes(device::Kind kind, const llama::Config& config, int64_t max_rows,
                                   int64_t max_positions) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_decode_workspace_size_bytes(config, max_rows, max_positions);
#endif
  (void)kind;
  return llama::decode_workspace_size_bytes(config, max_rows, max_positions);
}

uint64_t fixed_device_bytes(device::Kind kind, const gpt2::BatchShape& max_shape) {
#if STRATA_HAVE_CUDA
  if (!runs_cpu_kernels(kind)) return cuda_fixed_device_bytes(max_shape);
#endif
  (void)kind;
  (void)max_shape;
  return 0;
}

}  // namespace strata::kernels
