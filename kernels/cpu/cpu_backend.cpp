// The CPU backend (backend.h): kernels/cpu's ops and kernels/optim called on the calling thread, in
// the order the trainer called them before the seam, so the results are the same bits. Each op
// has run when it returns; on the CPU device the compute stream exists only so that callers can
// order the scheduler's releases after "the ops so far" the same way on every backend. On a
// discrete device (emulated) the callers also enqueue copies and stream waits on the compute
// stream, as they do on CUDA, and expect the next op to run after them: so there each op first
// waits for the work already on the stream (`in_stream_order`) — a kernel launched on a CUDA
// stream would wait for it the same way.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cast.h"
#include "kernels/quant/quant.h"

namespace strata::kernels {
namespace {


class CpuBackend final : public ComputeBackend {
 public:
  CpuBackend(device::Device& device, device::Stream stream) : device_(device), stream_(std::move(stream)) {}

  const char* name() const override { return "cpu"; }
  // The ops' memory is the device's: host memory on the cpu device; on emulated the region
  // stands for a GPU's, which callers must not read on the host (they copy, as on CUDA).
  bool is_host() const override { return device_.memory_is_host(); }
  device::Stream& compute_stream() override { return stream_; }

  Status begin_step(const StepBatch& batch) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    // host memory: the kernels read the caller's arrays in place
    tokens_ = batch.tokens;
    targets_ = batch.targets;
    loss_normalizer_tokens_ = batch.loss_normalizer_tokens > 0
                                  ? batch.loss_normalizer_tokens
                                  : count_trained_targets(batch.targets, batch.rows);
    packed_ = PackedRows{batch.positions, batch.segments};
    loss_sum_ = 0.0;
    scalars_ = StepScalars{};  // not clip_scale_: interleaved updates use the previous step's
    return Status();
  }
  // The ops have run; waiting for the stream lets the callbacks queued behind them (the
  // scheduler's release_after) finish too, so the step is over in every sense when this returns.
  Result<StepScalars> end_step() override {
    STRATA_RETURN_IF_ERROR(device_.synchronize(stream_));
    return scalars_;
  }
  Status synchronize() override { return device_.synchronize(stream_); }

 private:
  // See the top of this file. Not on the CPU device: nothing an op must wait for is ever
  // enqueued there, and a wait per op would cost each of them a round trip to the worker.
  Status in_stream_order() { return device_.memory_is_host() ? Status() : device_.synchronize(stream_); }
  // An op's loops on the calling thread, in stream order (BLAS pinned to one thread first:
  // the fixed tiles must not fan out again inside OpenBLAS).
  template <typename Body>
  Status run(const Body& body) {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    cpu_math::pin_blas_to_one_thread();
    body();
    return Status();
  }
  // The step's packing, checked against the op's shape (free when unpacked).
  Status check_packed(const BatchShape& shape) const {
    if (packed_.positions == nullptr && packed_.segments == nullptr) return Status();
    return check_packing(packed_.positions, packed_.segments, shape);
  }

 public:
  Result<double> grad_sum_squares_now() override { return scalars_.grad_sum_squares; }

  // --- the operations (cpu_ops.h, after the stream-order wait) ---
  size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim) const override {
    return cpu_ops::attention_scratch_bytes(shape, n_head, head_dim);
  }
  Status gemm(const ops::Gemm& op) override { return run([&] { cpu_ops::gemm(op); }); }
  Status rows_init(const ops::RowsInit& op) override { return run([&] { cpu_ops::rows_init(op); }); }
  Status add_bias(const ops::AddBias& op) override { return run([&] { cpu_ops::add_bias(op); }); }
  Status column_sums(const ops::ColumnSums& op) override { return run([&] { cpu_ops::column_sums(op); }); }
  Status norm_forward(const ops::NormForward& op) override { return run([&] { cpu_ops::norm_forward(op); }); }
  Status norm_backward(const ops::NormBackward& op) override { return run([&] { cpu_ops::norm_backward(op); }); }
  Status rope_tables(const ops::RopeTables& op) override { return run([&] { cpu_ops::rope_tables(op); }); }
  Status rope(const ops::Rope& op) override {
    if (op.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    return run([&] { cpu_ops::rope(op, packed_.positions); });
  }
  Status attention_forward(const ops::Attention& op) override {
    if (op.use_step_segments) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    return run([&] { cpu_ops::attention_forward(op, packed_.segments); });
  }
  Status attention_backward(const ops::AttentionBackward& op) override {
    if (op.forward.use_step_segments) STRATA_RETURN_IF_ERROR(check_packed(op.forward.shape));
    return run([&] { cpu_ops::attention_backward(op, packed_.segments); });
  }
  Status gelu_forward(const ops::Gelu& op) override { return run([&] { cpu_ops::gelu_forward(op); }); }
  Status gelu_backward(const ops::GeluBackward& op) override { return run([&] { cpu_ops::gelu_backward(op); }); }
  Status gated_forward(const ops::Gated& op) override { return run([&] { cpu_ops::gated_forward(op); }); }
  Status gated_backward(const ops::GatedBackward& op) override { return run([&] { cpu_ops::gated_backward(op); }); }
  Status embedding_lookup(const ops::Embedding& op) override {
    if (op.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.shape));
    return run([&] { cpu_ops::embedding(op, tokens_, packed_.positions); });
  }
  Status embedding_lookup_backward(const ops::EmbeddingBackward& op) override {
    if (op.forward.use_step_positions) STRATA_RETURN_IF_ERROR(check_packed(op.forward.shape));
    return run([&] { cpu_ops::embedding_backward(op, tokens_, packed_.positions); });
  }
  // The step's loss is kept current after every call: the running sum over N, as the head's
  // one loop over its chunks always returned it.
  Status cross_entropy(const ops::CrossEntropy& op) override {
    STRATA_RETURN_IF_ERROR(check_targets(targets_, op.first_row + op.rows, op.vocab));
    const int64_t n = loss_normalizer_tokens_;
    const float inv_normalizer = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    STRATA_RETURN_IF_ERROR(run([&] { cpu_ops::cross_entropy(op, targets_, inv_normalizer, &loss_sum_); }));
    scalars_.loss = n > 0 ? static_cast<float>(loss_sum_ / static_cast<double>(n)) : 0.0f;
    return Status();
  }
  size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions) const override {
    return cpu_ops::attention_decode_scratch_bytes(max_rows, n_head, max_positions);
  }
  size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out) const override {
    return cpu_ops::matmul_bf16_scratch_bytes(max_in, max_out);
  }
  Status copy_rows(const ops::CopyRows& op) override { return run([&] { cpu_ops::copy_rows(op); }); }
  Status attention_decode(const ops::AttentionDecode& op) override {
    return run([&] { cpu_ops::attention_decode(op); });
  }
  Status matmul_bf16(const ops::MatmulBf16& op) override { return run([&] { cpu_ops::matmul_bf16(op); }); }
  Status lora_forward(const lora::BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in,
                      int64_t out, float* y) override {
    return run([&] { lora::adapter_forward(adapters, target, x, rows, in, out, y); });
  }
  Status lora_backward_params(const lora::BlockAdapters* adapters, int target, const float* x, int64_t rows,
                              int64_t in, int64_t out, const float* dy, int slot) override {
    return run([&] { lora::adapter_backward_params(adapters, target, x, rows, in, out, dy, slot); });
  }
  Status lora_backward_input(const lora::BlockAdapters* adapters, int target, int64_t rows, int64_t in, float* dx,
                             int slot) override {
    return run([&] { lora::adapter_backward_input(adapters, target, rows, in, dx, slot); });
  }

  Status zero(float* values, uint64_t count) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    std::fill(values, values + count, 0.0f);
    return Status();
  }
  Status copy(void* dst, const void* src, uint64_t size_bytes) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    std::memcpy(dst, src, size_bytes);
    return Status();
  }
  Status cast_bf16_to_fp32(const uint16_t* src, float* dst, uint64_t count) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    kernels::cast_bf16_to_fp32(std::span<const uint16_t>(src, count), std::span<float>(dst, count));
    return Status();
  }
  Status cast_fp32_to_bf16(const float* src, uint16_t* dst, uint64_t count) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    kernels::cast_fp32_to_bf16(std::span<const float>(src, count), std::span<uint16_t>(dst, count));
    return Status();
  }
  Status sum_squares(const float* values, uint64_t count) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    scalars_.grad_sum_squares += kernels::sum_squares(std::span<const float>(values, count));
    return Status();
  }
  Status clip_coefficient(double max_norm) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    clip_scale_ = kernels::clip_coefficient(std::sqrt(scalars_.grad_sum_squares), max_norm);
    return Status();
  }
  Status dequantize_unit(const quant::UnitLayout& layout, const void* src, float* dst) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    quant::dequantize_unit(layout, static_cast<const std::byte*>(src), dst);
    return Status();
  }
  Status adamw(const AdamWChunk& chunk) override {
    STRATA_RETURN_IF_ERROR(in_stream_order());
    detail::AdamWStepScalars scalars = chunk.scalars;
    if (chunk.use_clip_scale) scalars.grad_scale = clip_scale_;
    ComputeCopy copy;
    if (chunk.copy_dtype != DType::f32) copy = {chunk.copy_dtype, std::span<uint16_t>(chunk.copy, chunk.count)};
    if (chunk.block_elements > 0) {  // 8-bit block-wise moments (adamw8bit.h)
      const size_t blocks = kernels::adamw8bit_block_count(chunk.count, chunk.block_elements);
      const AdamW8bitState state{std::span<float>(chunk.params, chunk.count),
                                 std::span<uint8_t>(chunk.exp_avg_codes, chunk.count),
                                 std::span<uint8_t>(chunk.exp_avg_sq_codes, chunk.count),
                                 std::span<float>(chunk.exp_avg_absmax, blocks),
                                 std::span<float>(chunk.exp_avg_sq_absmax, blocks), chunk.block_elements};
      kernels::adamw8bit_step(scalars, state, std::span<const float>(chunk.grads, chunk.count), copy);
      return Status();
    }
    kernels::adamw_step(scalars, std::span<float>(chunk.params, chunk.count),
                        std::span<const float>(chunk.grads, chunk.count), std::span<float>(chunk.exp_avg, chunk.count),
                        std::span<float>(chunk.exp_avg_sq, chunk.count), copy);
    return Status();
  }

 private:
  device::Device& device_;
  device::Stream stream_;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  int64_t loss_normalizer_tokens_ = 0;  // N, resolved at begin_step (StepBatch)
  PackedRows packed_{};  // begin_step's positions and segments (host memory)
  StepScalars scalars_;
  double loss_sum_ = 0.0;  // the cross_entropy ops' running sum this step, in row order
  float clip_scale_ = 1.0f;
};

}  // namespace

Result<std::unique_ptr<ComputeBackend>> make_cpu_backend(device::Device& device) {
  STRATA_ASSIGN_OR_RETURN(device::Stream stream, device.create_stream("compute"));
  return std::unique_ptr<ComputeBackend>(std::make_unique<CpuBackend>(device, std::move(stream)));
}

}  // namespace strata::kernels
