// strata/kernels/cpu/cpu_ops.h — the CPU backend's operations (kernels/ops.h), as free functions
// over host memory: the loops the CPU model kernels always ran, one copy each, so a model
// composed of them gives the bits those kernels gave. Internal to kernels/ (cpu_backend.cpp
// calls them after its stream-order wait; tests call them directly).
//
// Contract: ops.h's, plus
// - The step's arrays are explicit here (`tokens`, `targets`, `positions`, `segments`: host
//   memory, or null where ops.h allows none); the backend passes begin_step's.
// - Threads: each call runs on the calling thread and fans out to TBB (cpu_math.h): matrix
//   products as fixed tiles, norms and softmax per row, attention per (batch, k/v head),
//   element-wise work in fixed chunks, column sums per 16-column block over the rows in order.
//   Results never depend on the thread count. pin_blas_to_one_thread() must have run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace strata::kernels::cpu_ops {

void gemm(const ops::Gemm& op);
void rows_init(const ops::RowsInit& op);
void add_bias(const ops::AddBias& op);
void column_sums(const ops::ColumnSums& op);
void norm_forward(const ops::NormForward& op);
void norm_backward(const ops::NormBackward& op);
void rope_tables(const ops::RopeTables& op);
// `positions`: the step's (null: row order); read only when op.use_step_positions.
void rope(const ops::Rope& op, const int32_t* positions);
// Per (batch, query head): the transposed keys and values [head_dim, seq_len] and two
// probability rows [seq_len] — nothing kept between forward and backward (the backward
// recomputes each probability row).
size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim);
void attention_forward(const ops::Attention& op, const int32_t* segments);
void attention_backward(const ops::AttentionBackward& op, const int32_t* segments);
void gelu_forward(const ops::Gelu& op);
void gelu_backward(const ops::GeluBackward& op);
void gated_forward(const ops::Gated& op);
void gated_backward(const ops::GatedBackward& op);
void embedding(const ops::Embedding& op, const int32_t* tokens, const int32_t* positions);
void embedding_backward(const ops::EmbeddingBackward& op, const int32_t* tokens, const int32_t* positions);
// Adds each row's loss to *loss_sum (double, row by row in order: the step's running sum, so
// chunks add up as one loop would); with op.gradient the logits become their gradient scaled
// by `inv_normalizer` (1/N, 0 when nothing is trained).
void cross_entropy(const ops::CrossEntropy& op, const int32_t* targets, float inv_normalizer, double* loss_sum);

// Decoding. The scratch sizes: attention_decode a score row of max_positions per head;
// matmul_bf16 cpu_math's widened pieces (kBf16PiecesFloats), whatever the matrix.
void copy_rows(const ops::CopyRows& op);
size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions);
void attention_decode(const ops::AttentionDecode& op);
size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out);
void matmul_bf16(const ops::MatmulBf16& op);

}  // namespace strata::kernels::cpu_ops
