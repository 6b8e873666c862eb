// kernels/cuda/cuda_ops.cu — the CUDA operations (cuda_ops.h): each op launches the kernels the
// per-model CUDA code launched for it (op_kernels.cuh, cuda_common.cuh), generalised only where
// ops.h asks (strides, a norm's weight offset and eps, RoPE's spec, GeGLU, an embedding scale).
#include "kernels/cuda/cuda_ops.h"

#include <cassert>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/op_kernels.cuh"

namespace strata::kernels::cuda_ops {
namespace {

using kernels::cuda::blocks_for;
using kernels::cuda::check_launch;
using kernels::cuda::cuda_error;
using kernels::cuda::gemm_batched;
using kernels::cuda::kThreads;
using kernels::cuda::kWarpsPerBlock;

// How attention batches its heads into strided-batched products per batch row. Multi-head
// (one query head per k/v head): one product over every head, k/v heads head_dim apart — the
// call the per-model CUDA attention made. Grouped-query: one product per k/v head over its group of
// query heads with the k/v operand's batch stride 0 (HF's repeat_kv without the copy).
struct HeadBatches {
  int64_t launches;        // products per batch row
  int64_t heads;           // query heads per product
  int64_t kv_head_stride;  // floats between the k/v heads of consecutive query heads in a product
};
HeadBatches head_batches(const ops::Attention& op) {
  const int64_t group = op.n_head / op.n_kv_head;
  if (group == 1) return {1, op.n_head, op.head_dim};
  return {op.n_kv_head, group, 0};
}

void check_attention(const ops::Attention& op) {
  assert(op.shape.batch > 0 && op.shape.seq_len > 0);
  assert(op.n_head > 0 && op.n_kv_head > 0 && op.n_head % op.n_kv_head == 0 && op.head_dim > 0);
  assert(op.scratch.data != nullptr &&
         op.scratch.size_bytes >= attention_scratch_bytes(op.shape, op.n_head, op.head_dim));
  (void)op;
}

}  // namespace

Status gemm(const Context& ctx, const ops::Gemm& op) {
  return kernels::cuda::gemm(ctx, op.trans_a, op.trans_b, op.m, op.n, op.k, op.a, op.lda, op.b, op.ldb, op.beta, op.c,
                          op.ldc);
}

Status rows_init(const Context& ctx, const ops::RowsInit& op) {
  const int64_t count = op.rows * op.cols;
  if (count == 0) return Status();
  if (op.bias == nullptr) {
    // nn.Linear's residual start: y = residual, a device-to-device copy (none when in place).
    assert(op.residual != nullptr);
    if (op.y == op.residual) return Status();
    const cudaError_t code = cudaMemcpyAsync(op.y, op.residual, static_cast<size_t>(count) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx.stream());
    if (code != cudaSuccess) return cuda_error("memcpy residual rows", code);
    return Status();
  }
  STRATA_CUDA_LAUNCH(op_kernels::fill_rows_kernel, blocks_for(count), kThreads, ctx.stream(), op.y, op.bias,
                     op.residual, op.rows, op.cols);
  return Status();
}

Status add_bias(const Context& ctx, const ops::AddBias& op) {
  const int64_t count = op.rows * op.cols;
  if (count == 0) return Status();
  STRATA_CUDA_LAUNCH(op_kernels::add_bias_kernel, blocks_for(count), kThreads, ctx.stream(), op.y, op.bias, op.rows,
                     op.cols);
  return Status();
}

Status column_sums(const Context& ctx, const ops::ColumnSums& op) {
  if (op.cols == 0) return Status();
  // One thread per column over the rows in order, summed in double (the bias gradients' kernel).
  return kernels::cuda::column_sums(ctx, op.in, op.rows, op.cols, op.out);
}

Status norm_forward(const Context& ctx, const ops::NormForward& op) {
  assert(op.width > 0 && op.x_stride >= op.width);
  if (op.rows == 0) return Status();
  if (op.kind == ops::NormKind::layer) {
    assert(op.bias != nullptr && op.mean != nullptr);
    STRATA_CUDA_LAUNCH(op_kernels::layernorm_forward_kernel, blocks_for(op.rows, kWarpsPerBlock), kThreads,
                       ctx.stream(), op.x, op.x_stride, op.weight, op.weight_offset, op.bias, op.rows, op.width, op.eps,
                       op.y, op.mean, op.rstd);
    return Status();
  }
  STRATA_CUDA_LAUNCH(op_kernels::rmsnorm_forward_kernel, blocks_for(op.rows, kWarpsPerBlock), kThreads, ctx.stream(),
                     op.x, op.x_stride, op.weight, op.weight_offset, op.rows, op.width, op.eps, op.y, op.rstd);
  return Status();
}

Status norm_backward(const Context& ctx, const ops::NormBackward& op) {
  assert(op.width > 0);
  if (op.rows == 0) return Status();
  if (op.kind == ops::NormKind::layer) {
    STRATA_CUDA_LAUNCH(op_kernels::layernorm_backward_dx_kernel, blocks_for(op.rows, kWarpsPerBlock), kThreads,
                       ctx.stream(), op.dy, op.x, op.mean, op.rstd, op.weight, op.weight_offset, op.rows, op.width,
                       op.dx, op.accumulate);
    assert((op.d_weight == nullptr) == (op.d_bias == nullptr));
    if (op.d_weight == nullptr) return Status();  // frozen
    STRATA_CUDA_LAUNCH(op_kernels::layernorm_backward_params_kernel, blocks_for(op.width), kThreads, ctx.stream(),
                       op.dy, op.x, op.mean, op.rstd, op.rows, op.width, op.d_weight, op.d_bias);
    return Status();
  }
  STRATA_CUDA_LAUNCH(op_kernels::rmsnorm_backward_dx_kernel, blocks_for(op.rows, kWarpsPerBlock), kThreads,
                     ctx.stream(), op.dy, op.x, op.rstd, op.weight, op.weight_offset, op.rows, op.width, op.dx,
                     op.accumulate);
  if (op.d_weight == nullptr) return Status();  // frozen
  STRATA_CUDA_LAUNCH(op_kernels::rmsnorm_backward_w_kernel, blocks_for(op.width), kThreads, ctx.stream(), op.dy, op.x,
                     op.rstd, op.rows, op.width, op.d_weight);
  return Status();
}

Status rope(const Context& ctx, const ops::Rope& op, const int32_t* positions) {
  assert(op.spec.head_dim > 0 && op.spec.head_dim % 2 == 0 && op.shape.seq_len > 0);
  const int64_t count = op.shape.rows() * op.heads * (op.spec.head_dim / 2);
  if (count == 0) return Status();
  STRATA_CUDA_LAUNCH(op_kernels::rope_kernel, blocks_for(count), kThreads, ctx.stream(), op.spec, op.x,
                     op.shape.rows(), op.shape.seq_len, op.first_position, op.heads, op.inverse ? -1.0f : 1.0f,
                     op.use_step_positions ? positions : nullptr);
  return Status();
}

// One authority for the size: cuda_attention_scratch_bytes (backend.h's free function on a CUDA
// kind) and the backend's attention_scratch_bytes both answer with this.
size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t /*head_dim*/) {
  return 2 * static_cast<size_t>(shape.batch * n_head * shape.seq_len * shape.seq_len) * sizeof(float);
}

// S = Q·Kᵀ per head, the causal (segment-bounded) softmax in place, out = P·V — the probabilities
// stay in the scratch's first half for the backward.
Status attention_forward(const Context& ctx, const ops::Attention& op, const int32_t* segments) {
  check_attention(op);
  const int64_t t = op.shape.seq_len;
  const int64_t d = op.head_dim;
  const int64_t tt = t * t;
  const HeadBatches hb = head_batches(op);
  float* probs = op.scratch.data;
  for (int64_t b = 0; b < op.shape.batch; ++b) {
    for (int64_t l = 0; l < hb.launches; ++l) {
      const int64_t h0 = l * hb.heads;
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, d, op.q + b * t * op.q_stride + h0 * d, op.q_stride,
                                          d, op.k + b * t * op.kv_stride + l * d, op.kv_stride, hb.kv_head_stride,
                                          0.0f, probs + (b * op.n_head + h0) * tt, t, tt, hb.heads));
    }
  }
  const int64_t rows = op.shape.batch * op.n_head * t;
  STRATA_CUDA_LAUNCH(kernels::cuda::causal_softmax_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(),
                     probs, t, rows, op.scale, op.use_step_segments ? segments : nullptr, op.n_head);
  for (int64_t b = 0; b < op.shape.batch; ++b) {
    for (int64_t l = 0; l < hb.launches; ++l) {
      const int64_t h0 = l * hb.heads;
      // out = P·V, head by head into the merged rows.
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, d, t, probs + (b * op.n_head + h0) * tt, t, tt,
                                          op.v + b * t * op.kv_stride + l * d, op.kv_stride, hb.kv_head_stride, 0.0f,
                                          op.out + b * t * op.out_stride + h0 * d, op.out_stride, d, hb.heads));
    }
  }
  return Status();
}

// dP = dOut·Vᵀ into the scratch's second half, dS = the softmax's backward in place, then
// dQ = dS·K, dK = Σ_h dS_hᵀ·Q_h, dV = Σ_h P_hᵀ·dOut_h — every one overwritten (beta 0 first).
Status attention_backward(const Context& ctx, const ops::AttentionBackward& grad, const int32_t* segments) {
  const ops::Attention& op = grad.forward;
  check_attention(op);
  const int64_t t = op.shape.seq_len;
  const int64_t d = op.head_dim;
  const int64_t tt = t * t;
  const int64_t group = op.n_head / op.n_kv_head;
  const HeadBatches hb = head_batches(op);
  const float* probs = op.scratch.data;
  float* d_probs = op.scratch.data + op.shape.batch * op.n_head * tt;
  for (int64_t b = 0; b < op.shape.batch; ++b) {
    for (int64_t l = 0; l < hb.launches; ++l) {
      const int64_t h0 = l * hb.heads;
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, d, grad.d_out + b * t * op.out_stride + h0 * d,
                                          op.out_stride, d, op.v + b * t * op.kv_stride + l * d, op.kv_stride,
                                          hb.kv_head_stride, 0.0f, d_probs + (b * op.n_head + h0) * tt, t, tt,
                                          hb.heads));
    }
  }
  const int64_t rows = op.shape.batch * op.n_head * t;
  STRATA_CUDA_LAUNCH(kernels::cuda::softmax_backward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(),
                     probs, d_probs, t, rows, op.scale, op.use_step_segments ? segments : nullptr, op.n_head);
  for (int64_t b = 0; b < op.shape.batch; ++b) {
    const float* q = op.q + b * t * op.q_stride;
    const float* k = op.k + b * t * op.kv_stride;
    const float* d_out = grad.d_out + b * t * op.out_stride;
    float* dq = grad.dq + b * t * op.q_stride;
    float* dk = grad.dk + b * t * op.kv_stride;
    float* dv = grad.dv + b * t * op.kv_stride;
    for (int64_t l = 0; l < hb.launches; ++l) {
      const int64_t h0 = l * hb.heads;
      const float* ds = d_probs + (b * op.n_head + h0) * tt;
      const float* p = probs + (b * op.n_head + h0) * tt;
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, d, t, ds, t, tt, k + l * d, op.kv_stride,
                                          hb.kv_head_stride, 0.0f, dq + h0 * d, op.q_stride, d, hb.heads));
      if (group == 1) {
        // Each k/v head has one query head: its dK and dV in one product over every head.
        STRATA_RETURN_IF_ERROR(gemm_batched(ctx, true, false, t, d, t, ds, t, tt, q, op.q_stride, d, 0.0f, dk,
                                            op.kv_stride, d, op.n_head));
        STRATA_RETURN_IF_ERROR(gemm_batched(ctx, true, false, t, d, t, p, t, tt, d_out, op.out_stride, d, 0.0f, dv,
                                            op.kv_stride, d, op.n_head));
        continue;
      }
      // A group's query heads add into its k/v head's gradients in head order.
      for (int64_t g = 0; g < group; ++g) {
        const float beta = g == 0 ? 0.0f : 1.0f;
        const int64_t h = h0 + g;
        STRATA_RETURN_IF_ERROR(kernels::cuda::gemm(ctx, true, false, t, d, t, ds + g * tt, t, q + h * d, op.q_stride,
                                                beta, dk + l * d, op.kv_stride));
        STRATA_RETURN_IF_ERROR(kernels::cuda::gemm(ctx, true, false, t, d, t, p + g * tt, t, d_out + h * d,
                                                op.out_stride, beta, dv + l * d, op.kv_stride));
      }
    }
  }
  return Status();
}

Status gelu_forward(const Context& ctx, const ops::Gelu& op) {
  if (op.n == 0) return Status();
  STRATA_CUDA_LAUNCH(op_kernels::gelu_forward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.in, op.out, op.n);
  return Status();
}

Status gelu_backward(const Context& ctx, const ops::GeluBackward& op) {
  if (op.n == 0) return Status();
  STRATA_CUDA_LAUNCH(op_kernels::gelu_backward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.d, op.pre, op.n);
  return Status();
}

Status gated_forward(const Context& ctx, const ops::Gated& op) {
  if (op.n == 0) return Status();
  if (op.kind == ops::GateKind::silu) {
    STRATA_CUDA_LAUNCH(op_kernels::swiglu_forward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.gate, op.up,
                       op.act, op.n);
  } else {
    STRATA_CUDA_LAUNCH(op_kernels::geglu_forward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.gate, op.up,
                       op.act, op.n);
  }
  return Status();
}

Status gated_backward(const Context& ctx, const ops::GatedBackward& op) {
  if (op.n == 0) return Status();
  if (op.kind == ops::GateKind::silu) {
    STRATA_CUDA_LAUNCH(op_kernels::swiglu_backward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.d_act, op.gate,
                       op.up, op.n);
  } else {
    STRATA_CUDA_LAUNCH(op_kernels::geglu_backward_kernel, blocks_for(op.n), kThreads, ctx.stream(), op.d_act, op.gate,
                       op.up, op.n);
  }
  return Status();
}

Status embedding(const Context& ctx, const ops::Embedding& op, const int32_t* tokens, const int32_t* positions) {
  assert(op.positions == nullptr || op.scale == 1.0f);
  const int64_t count = op.shape.rows() * op.width;
  if (count == 0) return Status();
  STRATA_CUDA_LAUNCH(op_kernels::embedding_forward_kernel, blocks_for(count), kThreads, ctx.stream(), tokens,
                     op.use_step_positions ? positions : nullptr, op.table, op.positions, op.scale, op.shape.rows(),
                     op.shape.seq_len, op.width, op.x);
  return Status();
}

Status embedding_backward(const Context& ctx, const ops::EmbeddingBackward& grad, const int32_t* tokens,
                          const int32_t* positions) {
  const ops::Embedding& op = grad.forward;
  const int64_t c = op.width;
  if (op.shape.rows() == 0 || c == 0) return Status();
  if (grad.d_table != nullptr) {
    STRATA_CUDA_LAUNCH(op_kernels::embedding_backward_table_kernel, blocks_for(c), kThreads, ctx.stream(), tokens,
                       grad.d_x, op.shape.rows(), c, op.scale, grad.d_table);
  }
  if (grad.d_positions == nullptr) return Status();
  const int32_t* packed = op.use_step_positions ? positions : nullptr;
  if (packed != nullptr) {
    STRATA_CUDA_LAUNCH(op_kernels::embedding_backward_positions_packed_kernel, blocks_for(c), kThreads, ctx.stream(),
                       packed, grad.d_x, op.shape.rows(), c, grad.d_positions);
    return Status();
  }
  STRATA_CUDA_LAUNCH(op_kernels::embedding_backward_positions_kernel, blocks_for(op.shape.seq_len * c), kThreads,
                     ctx.stream(), grad.d_x, op.shape.batch, op.shape.seq_len, c, grad.d_positions);
  return Status();
}

Status cross_entropy(const Context& ctx, const ops::CrossEntropy& op, const int32_t* targets, float grad_scale,
                     int64_t normalizer, float* step_row_loss, float* loss) {
  assert(op.first_row >= 0 && op.rows >= 0 && op.vocab > 0 && normalizer >= 0);
  if (op.rows > 0) {
    STRATA_CUDA_LAUNCH(kernels::cuda::cross_entropy_kernel, static_cast<unsigned>(op.rows), kThreads, ctx.stream(),
                       op.logits, op.vocab, targets + op.first_row, op.gradient, grad_scale,
                       step_row_loss + op.first_row);
  }
  // The whole step so far in one fixed tree, so that after the last chunk the slot holds the
  // per-model heads' single mean over every row — not a sum of per-chunk means.
  STRATA_CUDA_LAUNCH(kernels::cuda::mean_kernel, 1, kThreads, ctx.stream(), step_row_loss, op.first_row + op.rows,
                     normalizer, loss);
  return Status();
}

}  // namespace strata::kernels::cuda_ops
