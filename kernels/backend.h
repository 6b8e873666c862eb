// strata/kernels/backend.h — the compute-backend seam: every op the trainer, `strata plan`'s
// compute timing and the op-parity tests run, behind one interface with a CPU and a CUDA
// implementation. Nothing above this header calls kernels/cpu, kernels/cuda or kernels/optim directly.
//
// Contract
// - What a backend is: the ops of one device (`device::Device`) running on that device's
//   memory, in order, on one compute stream that the backend creates and owns. Chosen once from
//   the device's kind by `make_backend`; callers never ask which one they hold.
// - Memory: every pointer an op takes is memory of the backend's device — a `DeviceBuffer` of
//   the device, or a tensor the scheduler handed out (`StepBuffers::device_data`). `is_host()`
//   says whether that memory is also host memory (ggml's buffer-type `is_host`): true on the
//   CPU backend of the cpu device; false on CUDA, where only the device may dereference it, and
//   on the CPU backend of the emulated device, which stands for one (device/device.h). The caller owns every
//   buffer and keeps it alive and untouched until the stream has reached the op (ordering below).
//   Ops allocate nothing. `make_backend` takes its few fixed buffers (CUDA: tokens, targets, a
//   packed batch's positions and segments, the step's row losses, the step scalars and the
//   sum-of-squares scratch,
//   `fixed_device_bytes`) from the device once.
// - Ordering: ops are enqueued on `compute_stream()` and return without waiting; ops of one
//   backend run in the order they were called. They are ordered with the scheduler's copies by
//   events, never by a host wait: a step's tensors are on the device when `acquire` returns,
//   and the caller gives them back with `Scheduler::release_after(step, compute_stream())`, so
//   they are unpinned only once the stream has run the step's ops. The CPU backend runs each op
//   on the calling thread before returning (its stream is then trivially past it — the
//   cheapest correct order on a CPU, and the one that keeps its results bit-identical to the
//   kernels called directly) — on a discrete (emulated) device after first waiting for what
//   the caller enqueued on that stream, as a launched kernel would; the CUDA backend launches
//   kernels on its cudaStream_t.
// - The step and its scalars: `begin_step` gives the batch's tokens and targets (host memory,
//   untouched until `end_step` returns) and clears the step's loss and gradient sum — not the
//   clip coefficient, which interleaved updates (run/train_plan.h) take at the end of one
//   step and use in the next; `cross_entropy` puts the loss there (the mean over N of every
//   row so far), and every `sum_squares` adds to the step's gradient sum of squares.
//   `end_step` waits for the stream once and returns both — the one host synchronisation of a
//   step; nothing else in a step waits. `clip_coefficient` turns the sum so far into the
//   gradient scale on the stream, and `adamw` with `use_clip_scale` reads it there, so clipping
//   needs no host round trip either.
// - Scratch: the operations allocate nothing; the attention takes its scratch from the caller
//   (`attention_scratch_bytes`: CUDA's grows with T², it keeps the [B, H, T, T]
//   probabilities), and a model definition sizes one workspace for its ops from it
//   (models/model.h). Ops that share scratch are ordered by the stream. LoRA's scratch
//   (BlockAdapters::scratch) is apart from it, lora::scratch_size_bytes on every backend.
// - LoRA and frozen bases: `lora_forward` / `lora_backward_*` add an adapter's terms and
//   gradients around a block's linear (lora.h); a null gradient pointer is a frozen tensor whose
//   gradient is skipped, so a frozen base's backward computes the activation gradients and the
//   adapters' grads only. The dropout mask is lora.h's hash on every backend: the same mask,
//   bit for bit.
// - Models: no op is model-shaped; a model definition (models/) composes the operations for
//   training and decoding alike, so callers above it never name a model.
// - Numerics: the CPU backend's operations are the loops of the per-model reference kernels
//   (cpu_ops.h; tests/reference), so a definition composed of them gives those kernels' bits
//   (tests/backend/test_compose_*.cpp); its optimizer and casts are kernels/optim (adamw.h,
//   adamw8bit.h, cast.h) and its dequantisation kernels/quant (quant.h), bit-identical to
//   calling them directly (tests/backend/test_backend_cpu.cpp, tests/quant). The CUDA backend
//   is cuda_ops.h, cuda_decode_ops.h, optim_cuda.h and
//   quant_cuda.h: AdamW, the casts and the dequantisation give the CPU's bits; the operations,
//   whole blocks and heads and the sum of squares agree to fp32 rounding (test_ops.cpp and
//   test_backend_ops.cpp state each tolerance).
// - Errors: a failed launch comes back as a Status from the op that launched it; a fault while
//   running surfaces at `end_step` / `synchronize`. Bad shapes and short workspaces are
//   programmer errors and assert.
// - Threads: one host thread drives a backend at a time. A backend must be destroyed before the
//   device that made it; destroying it waits for its stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "kernels/optim/elementwise.h"
#include "kernels/quant/quant.h"
#include "device/device.h"

namespace strata::kernels {

// One step's batch for the embedding, attention, RoPE and cross-entropy ops: host memory, untouched until
// `end_step` returns. `rows` is the number of tokens (the shape's B·T).
// - Loss masks live in `targets`: a negative target is a token the loss does not see (zero loss,
//   exactly zero gradient; ops.h, "Loss masks").
// - `loss_normalizer_tokens` is N, what the head divides the loss sum and the gradient by; 0
//   means this batch's own count of trained targets. Gradient accumulation passes the whole
//   update's count to each of its micro-batches, so their gradients add up to the full batch's
//   and their `StepScalars::loss` values add up to the mean over every trained token.
// Packed rows (several examples in one seq_len row; docs/backend.md "Packed rows"), each
// [rows] int32 or null — ops.h PackedRows' semantics:
// - `positions`: each token's position within its example, in [0, seq_len). The embedding op
//   with use_step_positions looks learned positions (a wpe table) up at it; `rope` with
//   use_step_positions rotates q and k by it. Null: t, the index in the row.
// - `segments`: each token's example id, non-decreasing along a row (an example is one
//   contiguous run; equal ids = same example). Every attention op with use_step_segments (forward
//   and backward) lets token t see token u only when u ≤ t and both share the id. Null: one
//   example per row.
// Both null is today's unpacked batch, bit for bit. The ops that read them refuse values
// outside those rules with `invalid_argument` (check_packing) before any kernel indexes by them.
// The head and the loss are per token and need neither. Decoding ignores them.
struct StepBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
  int64_t loss_normalizer_tokens = 0;
};

// What `end_step` brings back to the host: the loss — the head's loss sum over trained tokens
// divided by the batch's N (above): the mean over trained tokens when N is the batch's own
// count, 0 when no token is trained — and the sum of squares of every gradient `sum_squares`
// saw since `begin_step`.
struct StepScalars {
  double loss = 0.0;
  double grad_sum_squares = 0.0;
};

// One AdamW update of a contiguous chunk of parameters (adamw.h's semantics). `copy_dtype`
// bf16 or f16 also writes the updated params, rounded, to `copy` (the fused low-precision
// copy); f32 writes none. With `use_clip_scale` the gradient scale is the one the last
// `clip_coefficient` left on the stream, not `scalars.grad_scale`.
// With `block_elements` > 0 the moments are 8-bit block-wise (adamw8bit.h's semantics and
// layout: codes count bytes each, absmax ceil(count / block_elements) floats each, blocks
// counted from `params[0]`) and exp_avg / exp_avg_sq are unused; the optimizer seam
// (optim/state.h) decides which pieces take it.
struct AdamWChunk {
  detail::AdamWStepScalars scalars{};
  bool use_clip_scale = false;
  float* params = nullptr;  // fp32 master
  const float* grads = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  uint64_t count = 0;
  DType copy_dtype = DType::f32;
  uint16_t* copy = nullptr;
  uint32_t block_elements = 0;  // 0: fp32 moments
  uint8_t* exp_avg_codes = nullptr;
  uint8_t* exp_avg_sq_codes = nullptr;
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  ComputeBackend(const ComputeBackend&) = delete;
  ComputeBackend& operator=(const ComputeBackend&) = delete;

  virtual const char* name() const = 0;  // "cpu" (also on emulated), "cuda"
  // Whether the memory the ops take is host memory (see the contract).
  virtual bool is_host() const = 0;
  // The stream the ops run on: hand it to Scheduler::release_after.
  virtual device::Stream& compute_stream() = 0;

  // --- the step ---
  // The batch (rows = shape.rows() of each) for the embedding and cross-entropy ops; clears the
  // scalars.
  [[nodiscard]] virtual Status begin_step(const StepBatch& batch) = 0;
  // Waits for every op enqueued so far and returns the step's scalars (the one sync).
  [[nodiscard]] virtual Result<StepScalars> end_step() = 0;
  // Waits for every op enqueued so far (timing, tests).
  [[nodiscard]] virtual Status synchronize() = 0;
  // Waits for every op enqueued so far and returns the gradient sum of squares so far: the
  // global norm for updates that run on the host (run/train_plan.h, OptimizerSite::host)
  // with clipping — a second wait in such a step, after the last backward, before any update.
  [[nodiscard]] virtual Result<double> grad_sum_squares_now() = 0;

  // --- the operations (kernels/ops.h; what a model definition composes) ---
  // Scratch one attention call needs (ops::Attention::scratch) for `shape` and `n_head` query
  // heads of `head_dim`.
  virtual size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim) const = 0;
  [[nodiscard]] virtual Status gemm(const ops::Gemm& op) = 0;
  [[nodiscard]] virtual Status rows_init(const ops::RowsInit& op) = 0;
  [[nodiscard]] virtual Status add_bias(const ops::AddBias& op) = 0;
  [[nodiscard]] virtual Status column_sums(const ops::ColumnSums& op) = 0;
  [[nodiscard]] virtual Status norm_forward(const ops::NormForward& op) = 0;
  [[nodiscard]] virtual Status norm_backward(const ops::NormBackward& op) = 0;
  [[nodiscard]] virtual Status rope_tables(const ops::RopeTables& op) = 0;
  [[nodiscard]] virtual Status rope(const ops::Rope& op) = 0;
  [[nodiscard]] virtual Status attention_forward(const ops::Attention& op) = 0;
  [[nodiscard]] virtual Status attention_backward(const ops::AttentionBackward& op) = 0;
  [[nodiscard]] virtual Status gelu_forward(const ops::Gelu& op) = 0;
  [[nodiscard]] virtual Status gelu_backward(const ops::GeluBackward& op) = 0;
  [[nodiscard]] virtual Status gated_forward(const ops::Gated& op) = 0;
  [[nodiscard]] virtual Status gated_backward(const ops::GatedBackward& op) = 0;
  [[nodiscard]] virtual Status embedding_lookup(const ops::Embedding& op) = 0;
  [[nodiscard]] virtual Status embedding_lookup_backward(const ops::EmbeddingBackward& op) = 0;
  [[nodiscard]] virtual Status cross_entropy(const ops::CrossEntropy& op) = 0;
  // Decoding (ops.h "decoding with a KV cache"); the bf16 product also serves any bf16 weight.
  virtual size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions) const = 0;
  virtual size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out) const = 0;
  [[nodiscard]] virtual Status copy_rows(const ops::CopyRows& op) = 0;
  [[nodiscard]] virtual Status attention_decode(const ops::AttentionDecode& op) = 0;
  [[nodiscard]] virtual Status matmul_bf16(const ops::MatmulBf16& op) = 0;
  // LoRA on one targeted linear of a block (lora.h's semantics; nothing when `adapters` is
  // null or does not target `target`): the forward adds its term into y; the backward in two
  // halves around the base's dx product (backward_params reads x and dy and leaves du in
  // `slot`; backward_input adds the adapter's share into dx).
  [[nodiscard]] virtual Status lora_forward(const lora::BlockAdapters* adapters, int target, const float* x,
                                            int64_t rows, int64_t in, int64_t out, float* y) = 0;
  [[nodiscard]] virtual Status lora_backward_params(const lora::BlockAdapters* adapters, int target, const float* x,
                                                    int64_t rows, int64_t in, int64_t out, const float* dy,
                                                    int slot) = 0;
  [[nodiscard]] virtual Status lora_backward_input(const lora::BlockAdapters* adapters, int target, int64_t rows,
                                                   int64_t in, float* dx, int slot) = 0;

  // --- elementwise and the optimizer ---
  [[nodiscard]] virtual Status zero(float* values, uint64_t count) = 0;
  [[nodiscard]] virtual Status copy(void* dst, const void* src, uint64_t size_bytes) = 0;
  [[nodiscard]] virtual Status cast_bf16_to_fp32(const uint16_t* src, float* dst, uint64_t count) = 0;
  [[nodiscard]] virtual Status cast_fp32_to_bf16(const float* src, uint16_t* dst, uint64_t count) = 0;
  // Adds Σ x² (in double) to the step's gradient sum of squares. Call per tensor in a fixed
  // order: the sum is deterministic for a fixed order.
  [[nodiscard]] virtual Status sum_squares(const float* values, uint64_t count) = 0;
  // torch's clip_grad_norm_ factor min(1, max_norm / (sqrt(sum) + 1e-6)) from the sum so far,
  // kept on the stream for the next `adamw` calls with use_clip_scale.
  [[nodiscard]] virtual Status clip_coefficient(double max_norm) = 0;
  [[nodiscard]] virtual Status adamw(const AdamWChunk& chunk) = 0;

  // --- the quantised frozen base (kernels/quant/quant.h) ---
  // The fp32 unit (`layout.element_count` floats at `dst`) from its quantised buffer `src`
  // (`layout.size_bytes`, 64-byte aligned, as quant::quantize_unit wrote it), both memory of
  // this backend: NF4 or int8 blocks, double-quantised absmax or not, raw tensors copied. The
  // CPU backend is quant::dequantize_unit itself; CUDA launches one kernel per tensor on the
  // stream (kernels/quant/quant_cuda.h) with the same bits. `layout` is read during the call
  // only (CUDA takes what it needs as kernel arguments).
  [[nodiscard]] virtual Status dequantize_unit(const quant::UnitLayout& layout, const void* src, float* dst) = 0;

 protected:
  ComputeBackend() = default;
};

// The backend for `device`'s kind (cpu and emulated: the CPU backend; cuda: the CUDA one),
// sized for batches up to `max_shape`. It creates its compute stream on the device and, on
// CUDA, takes `fixed_device_bytes` from the device's budget. The device must outlive it.
[[nodiscard]] Result<std::unique_ptr<ComputeBackend>> make_backend(device::Device& device,
                                                                   const BatchShape& max_shape);

// Sizes without a backend, for planning before any device exists: the bytes make_backend takes
// from the device besides the callers' buffers.
uint64_t fixed_device_bytes(device::Kind kind, const BatchShape& max_shape);
// ComputeBackend::attention_scratch_bytes, attention_decode_scratch_bytes and
// matmul_bf16_scratch_bytes on a device kind, before any backend exists.
size_t attention_scratch_bytes(device::Kind kind, const BatchShape& shape, int64_t n_head, int64_t head_dim);
size_t attention_decode_scratch_bytes(device::Kind kind, int64_t max_rows, int64_t n_head, int64_t max_positions);
size_t matmul_bf16_scratch_bytes(device::Kind kind, int64_t max_in, int64_t max_out);
// The refusal every backend's cross_entropy makes before a kernel indexes a logits row by a target:
// a target at or past vocab_size would read (and, with gradients, write) past the row. The
// first such target is an `invalid_argument` naming the token id, its row and the vocabulary
// size. Negative targets are loss masks (StepBatch) and pass. `targets` are begin_step's, host
// memory, so this costs no device round trip.
[[nodiscard]] Status check_targets(const int32_t* targets, int64_t rows, int64_t vocab_size);
// The refusal of StepBatch's packing fields the ops make before a kernel indexes by them: a
// position outside [0, shape.seq_len) (it would read past wpe's / RoPE's table) or a segment id
// smaller than the one before it in its row is an `invalid_argument` naming the value, its batch
// row and column. Null arrays pass. Host memory, so no device round trip.
[[nodiscard]] Status check_packing(const int32_t* positions, const int32_t* segments, const BatchShape& shape);
// The longest slice of a bf16 weight CUDA's matmul_bf16 widens at a time (cuda_decode_ops.h):
// its scratch is bounded by this many rows, not by the vocabulary.
inline constexpr int64_t kDecodeHeadPieceRows = 4096;

}  // namespace strata::kernels
