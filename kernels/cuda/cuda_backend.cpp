// The CUDA backend (backend.h): the operations (cuda_ops.h, cuda_decode_ops.h) and
// optim_cuda.h launched on the backend's own compute stream of a CUDA device. Nothing here
// waits for the device except end_step and synchronize; the loss, the gradient sum of squares
// and the clip coefficient stay in one small device block until end_step brings the first two
// back.
#include <algorithm>
#include <cassert>
#include <cstddef>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "common/size.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_decode_ops.h"
#include "kernels/cuda/cublas_context.h"
#include "kernels/lora/lora_cuda.h"
#include "kernels/optim/optim_cuda.h"
#include "kernels/quant/quant_cuda.h"

namespace strata::kernels {
namespace {


// The fixed device block make_backend takes, laid out once:
//   [0, 256)       StepSlots (the scalars of the step)
//   [256, +4 KiB)  the sum-of-squares scratch (one double per block of the fixed grid)
//   then           tokens, targets, positions, segments (int32, max_shape.rows() each,
//                  256-byte aligned; the last two hold a packed batch's StepBatch arrays)
//   then           the step's row losses (float, max_shape.rows(), 256-byte aligned): the
//                  cross_entropy op's, so its chunks add up to one mean over the step
struct StepSlots {
  double grad_sum_squares;
  float loss;
  float clip_scale;
};
constexpr uint64_t kSlotsBytes = 256;
static_assert(sizeof(StepSlots) <= kSlotsBytes);
constexpr uint64_t kSumSquaresOffset = kSlotsBytes;
constexpr uint64_t kTokensOffset = kSumSquaresOffset + align_up(cuda::kCudaSumSquaresWorkspaceBytes, 256);

uint64_t token_bytes(const BatchShape& shape) {
  return align_up(static_cast<uint64_t>(shape.rows()) * sizeof(int32_t), 256);
}
uint64_t row_loss_bytes(const BatchShape& shape) {
  return align_up(static_cast<uint64_t>(shape.rows()) * sizeof(float), 256);
}
constexpr int kStepIntArrays = 4;  // tokens, targets, positions, segments

Status cuda_status(cudaError_t code, const char* op) {
  if (code == cudaSuccess) return Status();
  return make_error(ErrorKind::internal, fmt::format("{} failed: {}", op, cudaGetErrorString(code)));
}

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend(device::Device& device, device::Stream stream, cuda::Context context, device::DeviceBuffer fixed,
              BatchShape max_shape)
      : device_(device), stream_(std::move(stream)), context_(std::move(context)), fixed_(std::move(fixed)),
        max_shape_(max_shape) {
    auto* base = static_cast<char*>(fixed_.data());
    slots_ = reinterpret_cast<StepSlots*>(base);
    sum_squares_scratch_ = reinterpret_cast<double*>(base + kSumSquaresOffset);
    tokens_ = reinterpret_cast<int32_t*>(base + kTokensOffset);
    targets_ = reinterpret_cast<int32_t*>(base + kTokensOffset + token_bytes(max_shape));
    positions_ = reinterpret_cast<int32_t*>(base + kTokensOffset + 2 * token_bytes(max_shape));
    segments_ = reinterpret_cast<int32_t*>(base + kTokensOffset + 3 * token_bytes(max_shape));
    row_loss_ = reinterpret_cast<float*>(base + kTokensOffset + kStepIntArrays * token_bytes(max_shape));
  }
  ~CudaBackend() override { (void)device_.synchronize(stream_); }

  const char* name() const override { return "cuda"; }
  bool is_host() const override { return false; }
  device::Stream& compute_stream() override { return stream_; }

  Status begin_step(const StepBatch& batch) override {
    assert(batch.rows <= max_shape_.rows());
    const uint64_t bytes = static_cast<uint64_t>(batch.rows) * sizeof(int32_t);
    STRATA_RETURN_IF_ERROR(device_.copy_to_device(stream_, tokens_, batch.tokens, bytes));
    STRATA_RETURN_IF_ERROR(device_.copy_to_device(stream_, targets_, batch.targets, bytes));
    host_targets_ = batch.targets;  // untouched until end_step (backend.h): the heads check them there
    // N is resolved here, on the host copy: the kernels only ever see the device one.
    loss_normalizer_tokens_ = batch.loss_normalizer_tokens > 0
                                  ? batch.loss_normalizer_tokens
                                  : count_trained_targets(batch.targets, batch.rows);
    // Packed rows: the arrays the kernels read go to the device beside the tokens; the host
    // copies stay for check_packing, which the ops run once they know the shape.
    host_positions_ = batch.positions;
    host_segments_ = batch.segments;
    packed_ = PackedRows{batch.positions == nullptr ? nullptr : positions_,
                             batch.segments == nullptr ? nullptr : segments_};
    if (batch.positions != nullptr)
      STRATA_RETURN_IF_ERROR(device_.copy_to_device(stream_, positions_, batch.positions, bytes));
    if (batch.segments != nullptr)
      STRATA_RETURN_IF_ERROR(device_.copy_to_device(stream_, segments_, batch.segments, bytes));
    // The cross_entropy op's row losses start at 0, so no row of an earlier step is ever in the
    // step's mean (the heads' chunks cover every row; this keeps a partial one honest too).
    STRATA_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(row_loss_, 0, static_cast<size_t>(batch.rows) * sizeof(float), stream()), "cudaMemsetAsync"));
    // The loss and the sum, not the clip scale: interleaved updates (run/train_plan.h) apply
    // the previous step's in this one; none reads it before a clip_coefficient has written it
    // (a pass with no pending gradients does no update). clip_scale is the last member.
    static_assert(offsetof(StepSlots, clip_scale) + sizeof(float) == sizeof(StepSlots));
    const StepSlots cleared{0.0, 0.0f, 1.0f};
    return device_.copy_to_device(stream_, slots_, &cleared, offsetof(StepSlots, clip_scale));
  }
  Result<StepScalars> end_step() override {
    StepSlots host{};
    STRATA_RETURN_IF_ERROR(device_.copy_to_host(stream_, &host, slots_, sizeof host));
    STRATA_RETURN_IF_ERROR(device_.synchronize(stream_));
    return StepScalars{host.loss, host.grad_sum_squares};
  }
  Status synchronize() override { return device_.synchronize(stream_); }

  Result<double> grad_sum_squares_now() override {
    StepSlots host{};
    STRATA_RETURN_IF_ERROR(device_.copy_to_host(stream_, &host, slots_, sizeof host));
    STRATA_RETURN_IF_ERROR(device_.synchronize(stream_));
    return host.grad_sum_squares;
  }

  // --- the operations (cuda_ops.h, with the step's device arrays) ---
  size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim) const override {
    return cuda_ops::attention_scratch_bytes(shape, n_head, head_dim);
  }
  Status gemm(const ops::Gemm& op) override { return cuda_ops::gemm(context_, op); }
  Status rows_init(const ops::RowsInit& op) override { return cuda_ops::rows_init(context_, op); }
  Status add_bias(const ops::AddBias& op) override { return cuda_ops::add_bias(context_, op); }
  Status column_sums(const ops::ColumnSums& op) override { return cuda_ops::column_sums(context_, op); }
  Status norm_forward(const ops::NormForward& op) override { return cuda_ops::norm_forward(context_, op); }
  Status norm_backward(const ops::NormBackward& op) override { return cuda_ops::norm_backward(context_, op); }
  // CUDA computes each pair's angle in the rope kernel (op_math.h, in double): no tables.
  Status rope_tables(const ops::RopeTables&) override { return Status(); }
  Status rope(const ops::Rope& op) override {
    if (op.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    return cuda_ops::rope(context_, op, packed_.positions);
  }
  Status attention_forward(const ops::Attention& op) override {
    if (op.use_step_segments) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    return cuda_ops::attention_forward(context_, op, packed_.segments);
  }
  Status attention_backward(const ops::AttentionBackward& op) override {
    if (op.forward.use_step_segments) STRATA_RETURN_IF_ERROR(check_packed(op.forward.shape));
    return cuda_ops::attention_backward(context_, op, packed_.segments);
  }
  Status gelu_forward(const ops::Gelu& op) override { return cuda_ops::gelu_forward(context_, op); }
  Status gelu_backward(const ops::GeluBackward& op) override { return cuda_ops::gelu_backward(context_, op); }
  Status gated_forward(const ops::Gated& op) override { return cuda_ops::gated_forward(context_, op); }
  Status gated_backward(const ops::GatedBackward& op) override { return cuda_ops::gated_backward(context_, op); }
  // Decoding passes its own host tokens (ops::Embedding::tokens): they go into the step's token
  // buffer on the stream first, as the per-model decode ops did; its first position shifts the
  // learned-position rows the kernel reads (row r at first_position + r).
  Status embedding_lookup(const ops::Embedding& op) override {
    if (op.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    if (op.tokens != nullptr) {
      assert(op.shape.rows() <= max_shape_.rows());
      STRATA_RETURN_IF_ERROR(
          device_.copy_to_device(stream_, tokens_, op.tokens, static_cast<uint64_t>(op.shape.rows()) * 4));
    }
    ops::Embedding shifted = op;
    if (op.positions != nullptr) shifted.positions = op.positions + op.first_position * op.width;
    return cuda_ops::embedding(context_, shifted, tokens_, packed_.positions);
  }
  Status embedding_lookup_backward(const ops::EmbeddingBackward& op) override {
    if (op.forward.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.forward.shape));
    return cuda_ops::embedding_backward(context_, op, tokens_, packed_.positions);
  }
  // The step's loss slot holds the mean over N of every row so far after each call — after the
  // last chunk exactly what the per-model heads left there (cuda_ops.h). Targets are checked on
  // the host copy, as the heads did, before a kernel indexes a row by them.
  Status cross_entropy(const ops::CrossEntropy& op) override {
    assert(op.first_row >= 0 && op.first_row + op.rows <= max_shape_.rows());
    STRATA_RETURN_IF_ERROR(check_targets(host_targets_, op.first_row + op.rows, op.vocab));
    const int64_t n = loss_normalizer_tokens_;
    const float grad_scale = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    return cuda_ops::cross_entropy(context_, op, targets_, grad_scale, n, row_loss_, &slots_->loss);
  }
  Status lora_forward(const lora::BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in,
                      int64_t out, float* y) override {
    return lora::cuda::adapter_forward(context_, adapters, target, x, rows, in, out, y);
  }
  Status lora_backward_params(const lora::BlockAdapters* adapters, int target, const float* x, int64_t rows,
                              int64_t in, int64_t out, const float* dy, int slot) override {
    return lora::cuda::adapter_backward_params(context_, adapters, target, x, rows, in, out, dy, slot);
  }
  Status lora_backward_input(const lora::BlockAdapters* adapters, int target, int64_t rows, int64_t in, float* dx,
                             int slot) override {
    return lora::cuda::adapter_backward_input(context_, adapters, target, rows, in, dx, slot);
  }
  size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions) const override {
    return cuda_attention_decode_scratch_bytes(max_rows, n_head, max_positions);
  }
  size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out) const override {
    return cuda_matmul_bf16_scratch_bytes(max_in, max_out);
  }
  Status copy_rows(const ops::CopyRows& op) override { return cuda::copy_rows(op, stream()); }
  Status attention_decode(const ops::AttentionDecode& op) override { return cuda::attention_decode(op, stream()); }
  Status matmul_bf16(const ops::MatmulBf16& op) override { return cuda::matmul_bf16(context_, op); }

  Status zero(float* values, uint64_t count) override {
    return cuda_status(cudaMemsetAsync(values, 0, count * sizeof(float), stream()), "cudaMemsetAsync");
  }
  Status copy(void* dst, const void* src, uint64_t size_bytes) override {
    return cuda_status(cudaMemcpyAsync(dst, src, size_bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync");
  }
  Status cast_bf16_to_fp32(const uint16_t* src, float* dst, uint64_t count) override {
    return cuda::cast_bf16_to_fp32(src, dst, count, stream());
  }
  Status cast_fp32_to_bf16(const float* src, uint16_t* dst, uint64_t count) override {
    return cuda::cast_fp32_to_bf16(src, dst, count, stream());
  }
  Status sum_squares(const float* values, uint64_t count) override {
    return cuda::sum_squares(values, count, sum_squares_scratch_, &slots_->grad_sum_squares, /*accumulate=*/true,
                             stream());
  }
  Status clip_coefficient(double max_norm) override {
    return cuda::clip_coefficient(&slots_->grad_sum_squares, max_norm, &slots_->clip_scale, stream());
  }
  Status dequantize_unit(const quant::UnitLayout& layout, const void* src, float* dst) override {
    return quant::cuda::dequantize_unit(layout, src, dst, stream());
  }
  Status adamw(const AdamWChunk& c) override {
    if (c.block_elements > 0)  // 8-bit block-wise moments (adamw8bit.h, adamw8bit.cu)
      return cuda::adamw8bit_step(c.scalars, c.use_clip_scale ? &slots_->clip_scale : nullptr, c.params, c.grads,
                                  c.exp_avg_codes, c.exp_avg_sq_codes, c.exp_avg_absmax, c.exp_avg_sq_absmax, c.count,
                                  c.block_elements, c.copy_dtype, c.copy, stream());
    if (c.use_clip_scale)
      return cuda::adamw_step_device_scale(c.scalars, &slots_->clip_scale, c.params, c.grads, c.exp_avg, c.exp_avg_sq,
                                           c.count, c.copy_dtype, c.copy, stream());
    return cuda::adamw_step(c.scalars, c.params, c.grads, c.exp_avg, c.exp_avg_sq, c.count, c.copy_dtype, c.copy,
                            stream());
  }

 private:
  cudaStream_t stream() const { return context_.stream(); }
  // begin_step's packing, checked on the host against the op's shape (free when unpacked).
  Status check_packed(const BatchShape& shape) const {
    if (host_positions_ == nullptr && host_segments_ == nullptr) return Status();
    return check_packing(host_positions_, host_segments_, shape);
  }

  device::Device& device_;
  device::Stream stream_;
  cuda::Context context_;
  device::DeviceBuffer fixed_;
  BatchShape max_shape_;
  StepSlots* slots_ = nullptr;
  double* sum_squares_scratch_ = nullptr;
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  const int32_t* host_targets_ = nullptr;  // begin_step's, for check_targets
  int64_t loss_normalizer_tokens_ = 0;      // N, resolved at begin_step (StepBatch)
  int32_t* positions_ = nullptr;  // device copies of a packed batch's arrays
  int32_t* segments_ = nullptr;
  const int32_t* host_positions_ = nullptr;  // begin_step's, for check_packing
  const int32_t* host_segments_ = nullptr;
  PackedRows packed_{};  // device pointers, null where the batch has none
  float* row_loss_ = nullptr;  // the cross_entropy op's per-row losses of the step (device)
};

}  // namespace

// The attention's [B, H, T, T] probabilities and their gradient (kept from forward to backward):
// cuda_ops.h's size, the one the op asserts.
size_t cuda_attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim) {
  return cuda_ops::attention_scratch_bytes(shape, n_head, head_dim);
}

// The decode ops' scratch is what their kernels use: cuda_decode_ops.h says both sizes.
size_t cuda_attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions) {
  return cuda::attention_decode_scratch_bytes(max_rows, n_head, max_positions);
}

size_t cuda_matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out) {
  return cuda::matmul_bf16_scratch_bytes(max_in, max_out);
}

uint64_t cuda_fixed_device_bytes(const BatchShape& max_shape) {
  return kTokensOffset + kStepIntArrays * token_bytes(max_shape) + row_loss_bytes(max_shape);
}

Result<std::unique_ptr<ComputeBackend>> make_cuda_backend(device::Device& device, const BatchShape& max_shape) {
  STRATA_ASSIGN_OR_RETURN(device::Stream stream, device.create_stream("compute"));
  auto native = static_cast<cudaStream_t>(stream.native_handle());
  STRATA_ASSIGN_OR_RETURN(cuda::Context context, cuda::Context::create(native));
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer fixed, device.allocate(cuda_fixed_device_bytes(max_shape)));
  return std::unique_ptr<ComputeBackend>(
      std::make_unique<CudaBackend>(device, std::move(stream), std::move(context), std::move(fixed), max_shape));
}

}  // namespace strata::kernels
