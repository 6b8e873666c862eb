// strata/kernels/cuda/cuda_ops.h — the CUDA backend's operations (kernels/ops.h), as free
// functions on a cublas_context.h Context (its stream and its cuBLAS handle in pedantic fp32): the
// twin of cpu_ops.h. Internal to kernels/ (cuda_backend.cpp calls them with the step's device
// arrays; the op-parity tests reach them through the backend).
//
// Contract: ops.h's, plus
// - Every pointer is device memory, the step's arrays (`tokens`, `targets`, `positions`,
//   `segments`) included: the backend's copies made at begin_step, or null where ops.h allows
//   none (the op's use_step_* flag is then ignored). Calls enqueue on ctx's stream and return
//   without waiting; buffers live until the stream reaches the work.
// - Kernels: op_kernels.cuh's and cuda_common.cuh's (cuda_decode_ops.cu launches the same); products through cuda_common.cuh's sgemm wrappers.
// - Errors: a failed launch or cuBLAS call is a Status (a size past cuBLAS's int an
//   invalid_argument); bad shapes and short scratch assert.
// - Determinism: as cublas_context.h — no atomics, every reduction in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/cublas_context.h"
#include "kernels/ops.h"

namespace strata::kernels::cuda_ops {

using kernels::cuda::Context;

[[nodiscard]] Status gemm(const Context& ctx, const ops::Gemm& op);
[[nodiscard]] Status rows_init(const Context& ctx, const ops::RowsInit& op);
[[nodiscard]] Status add_bias(const Context& ctx, const ops::AddBias& op);
[[nodiscard]] Status column_sums(const Context& ctx, const ops::ColumnSums& op);
[[nodiscard]] Status norm_forward(const Context& ctx, const ops::NormForward& op);
[[nodiscard]] Status norm_backward(const Context& ctx, const ops::NormBackward& op);
// The angle of each pair is computed in the kernel (op.cos / op.sin unused, rope_tables has
// nothing to do on CUDA). `positions`: the step's (null: row order); read only when
// op.use_step_positions.
[[nodiscard]] Status rope(const Context& ctx, const ops::Rope& op, const int32_t* positions);
// The [B, H, T, T] probabilities (kept from the forward for its backward) and their gradient.
size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim);
// `segments`: the step's (null: one example per row); read only when op.use_step_segments.
[[nodiscard]] Status attention_forward(const Context& ctx, const ops::Attention& op, const int32_t* segments);
[[nodiscard]] Status attention_backward(const Context& ctx, const ops::AttentionBackward& op,
                                        const int32_t* segments);
[[nodiscard]] Status gelu_forward(const Context& ctx, const ops::Gelu& op);
[[nodiscard]] Status gelu_backward(const Context& ctx, const ops::GeluBackward& op);
[[nodiscard]] Status gated_forward(const Context& ctx, const ops::Gated& op);
[[nodiscard]] Status gated_backward(const Context& ctx, const ops::GatedBackward& op);
// `tokens` the step's; `positions` the step's (null: row order), read only when
// op.use_step_positions.
[[nodiscard]] Status embedding(const Context& ctx, const ops::Embedding& op, const int32_t* tokens,
                               const int32_t* positions);
[[nodiscard]] Status embedding_backward(const Context& ctx, const ops::EmbeddingBackward& op, const int32_t* tokens,
                                        const int32_t* positions);
// The step's loss on the device, as the per-model heads left it: each row's loss goes to
// step_row_loss[op.first_row + r] (masked rows 0; op.row_loss unused), then *loss = the sum of
// step_row_loss[0, op.first_row + op.rows) in one fixed tree over `normalizer` (0: loss 0).
// After the step's last chunk that is the heads' single mean over every row. With op.gradient
// the logits become their gradient times `grad_scale` (1/N, 0 when nothing is trained).
// `targets` is the step's whole array (row first_row is op.first_row's).
[[nodiscard]] Status cross_entropy(const Context& ctx, const ops::CrossEntropy& op, const int32_t* targets,
                                   float grad_scale, int64_t normalizer, float* step_row_loss, float* loss);

}  // namespace strata::kernels::cuda_ops
