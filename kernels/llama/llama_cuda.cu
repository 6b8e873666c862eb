// kernels/llama/llama_cuda.cu — the CUDA Llama: cuBLAS for the products (cuda_common.cuh's
// sgemm, shared with GPT-2's twin), the operations' small kernels (op_kernels.cuh) for RMSNorm,
// RoPE, SwiGLU and the embedding. Mirrors llama.cpp step for step and buffer for buffer.
#include "kernels/llama/llama_cuda.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/op_kernels.cuh"
#include "kernels/llama/llama_math.h"
#include "kernels/lora/lora_cuda.h"

namespace strata::kernels::llama::cuda {
namespace {

using gpt2::WorkspaceCarver;
using gpt2::kHeadChunkRows;
using gpt2::cuda::blocks_for;
using gpt2::cuda::check_launch;
using gpt2::cuda::column_sums;
using gpt2::cuda::cuda_error;
using gpt2::cuda::gemm;
using gpt2::cuda::gemm_batched;
using gpt2::cuda::kThreads;
using gpt2::cuda::kWarpsPerBlock;
using gpt2::cuda::warp_sum;

// The kernels are op_kernels.cuh's, the CUDA operations' own (cuda_ops.cu): one copy each.
using op_kernels::add_bias_kernel;
using op_kernels::embedding_backward_table_kernel;
using op_kernels::embedding_forward_kernel;
using op_kernels::rmsnorm_backward_dx_kernel;
using op_kernels::rmsnorm_backward_w_kernel;
using op_kernels::rmsnorm_forward_kernel;
using op_kernels::rope_kernel;
using op_kernels::swiglu_backward_kernel;
using op_kernels::swiglu_forward_kernel;

// Llama's RMSNorm multiplies by w itself (ops::NormForward::weight_offset 0).
constexpr float kNoWeightOffset = 0.0f;

struct BlockLayout {
  float *n1, *rstd1, *q, *k, *v, *att, *h, *n2, *rstd2, *gate, *up, *act, *dq, *dk, *dv;
  float* probs;    // [B, H, T, T]
  float* d_probs;  // [B, H, T, T]
  size_t size_bytes;
};

// `training`: with what only training's forward and backward use — the [B, H, T, T] attention
// probabilities and their gradients, and dq/dk/dv; decoding leaves them out (null), as the
// probabilities alone would cost 2·H·T² floats for a T-row prompt (4.3 GB at 32 heads and
// 4096 rows).
BlockLayout block_layout(const Config& config, const BatchShape& shape, float* base, bool training = true) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t scores = shape.batch * config.n_head * shape.seq_len * shape.seq_len;
  WorkspaceCarver carve(base);
  BlockLayout l{};
  l.n1 = carve.take(n * c);
  l.rstd1 = carve.take(n);
  l.q = carve.take(n * config.q_width());
  l.k = carve.take(n * config.kv_width());
  l.v = carve.take(n * config.kv_width());
  l.att = carve.take(n * config.q_width());
  l.h = carve.take(n * c);
  l.n2 = carve.take(n * c);
  l.rstd2 = carve.take(n);
  l.gate = carve.take(n * config.intermediate_size);
  l.up = carve.take(n * config.intermediate_size);
  l.act = carve.take(n * config.intermediate_size);
  if (training) {
    l.dq = carve.take(n * config.q_width());
    l.dk = carve.take(n * config.kv_width());
    l.dv = carve.take(n * config.kv_width());
    l.probs = carve.take(scores);
    l.d_probs = carve.take(scores);
  }
  l.size_bytes = carve.used_bytes();
  return l;
}

struct HeadLayout {
  float *normed, *rstd, *logits, *d_normed, *row_loss;
  size_t size_bytes;
};

HeadLayout head_layout(const Config& config, const BatchShape& shape, float* base) {
  const int64_t r = kHeadChunkRows;
  WorkspaceCarver carve(base);
  HeadLayout l{};
  l.normed = carve.take(r * config.n_embd);
  l.rstd = carve.take(r);
  l.logits = carve.take(r * config.vocab_size);
  l.d_normed = carve.take(r * config.n_embd);
  l.row_loss = carve.take(shape.rows());
  l.size_bytes = carve.used_bytes();
  return l;
}

void check_call(const Config& config, const BatchShape& shape, const Workspace* workspace, size_t needed_bytes) {
  assert(config.n_head > 0 && config.n_kv_head > 0 && config.n_head % config.n_kv_head == 0);
  assert(shape.batch > 0 && shape.seq_len > 0 && shape.seq_len <= config.n_ctx);
  assert(workspace == nullptr || (workspace->data != nullptr && workspace->size_bytes >= needed_bytes &&
                                  reinterpret_cast<uintptr_t>(workspace->data) % 256 == 0));
  (void)config;
  (void)shape;
  (void)workspace;
  (void)needed_bytes;
}

// y = x·Wᵀ (+ residual), W [out, in].
Status linear_forward(const Context& ctx, const float* x, const float* w, const float* residual, int64_t rows,
                      int64_t in, int64_t out, float* y) {
  if (residual != nullptr) {
    const cudaError_t code = cudaMemcpyAsync(y, residual, static_cast<size_t>(rows * out) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx.stream());
    if (code != cudaSuccess) return cuda_error("memcpy residual", code);
  }
  return gemm(ctx, false, true, rows, out, in, x, in, w, in, residual != nullptr ? 1.0f : 0.0f, y, out);
}

// A weight gradient's product, grad += op(A)·op(B); skipped when grad is null (frozen: gpt2.h,
// "Gradients").
Status grad_gemm(const Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float* grad, int64_t ldc) {
  if (grad == nullptr) return Status();
  return gemm(ctx, trans_a, trans_b, m, n, k, a, lda, b, ldb, 1.0f, grad, ldc);
}

// Each targeted linear's adapter (lora_cuda.h's block entry points; nothing for an untargeted one).
using lora::cuda::adapter_backward_input;
using lora::cuda::adapter_backward_params;
using lora::cuda::adapter_forward;

Status add_bias(const Context& ctx, float* y, const float* bias, int64_t rows, int64_t cols) {
  STRATA_CUDA_LAUNCH(add_bias_kernel, blocks_for(rows * cols), kThreads, ctx.stream(), y, bias, rows, cols);
  return Status();
}

Status rmsnorm_forward(const Context& ctx, const Config& config, const float* x, int64_t x_stride, const float* w,
                       int64_t rows, float* y, float* rstd) {
  STRATA_CUDA_LAUNCH(rmsnorm_forward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(), x, x_stride,
                     w, kNoWeightOffset, rows, config.n_embd, config.norm_eps, y, rstd);
  return Status();
}

Status rmsnorm_backward(const Context& ctx, const Config& config, const float* dy, const float* x, const float* rstd,
                        const float* w, int64_t rows, float* dx, bool accumulate, float* dw) {
  const int64_t c = config.n_embd;
  STRATA_CUDA_LAUNCH(rmsnorm_backward_dx_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(), dy, x,
                     rstd, w, kNoWeightOffset, rows, c, dx, accumulate);
  if (dw == nullptr) return Status();  // frozen
  STRATA_CUDA_LAUNCH(rmsnorm_backward_w_kernel, blocks_for(c), kThreads, ctx.stream(), dy, x, rstd, rows, c, dw);
  return Status();
}

Status rope(const Context& ctx, const Config& config, const BatchShape& shape, float* x, int64_t heads, bool inverse,
            const int32_t* positions) {
  const int64_t count = shape.rows() * heads * (config.head_dim / 2);
  STRATA_CUDA_LAUNCH(rope_kernel, blocks_for(count), kThreads, ctx.stream(), rope_spec(config), x, shape.rows(),
                     shape.seq_len, int64_t{0}, heads, inverse ? -1.0f : 1.0f, positions);
  return Status();
}

// Per batch row and k/v head: its `group` query heads in one strided-batched product each
// (the k/v operand's batch stride 0 — HF's repeat_kv without the copy).
Status attention_forward(const Context& ctx, const Config& config, const BatchShape& shape, const BlockLayout& ws,
                         const int32_t* segments) {
  const int64_t t = shape.seq_len;
  const int64_t d = config.head_dim;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  const int64_t group = config.n_head / config.n_kv_head;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t kv = 0; kv < config.n_kv_head; ++kv) {
      const int64_t h0 = kv * group;
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, d, ws.q + b * t * qw + h0 * d, qw, d,
                                          ws.k + b * t * kvw + kv * d, kvw, 0, 0.0f,
                                          ws.probs + (b * config.n_head + h0) * t * t, t, t * t, group));
    }
  }
  const int64_t rows = shape.batch * config.n_head * t;
  STRATA_CUDA_LAUNCH(gpt2::cuda::causal_softmax_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(),
                     ws.probs, t, rows, 1.0f / std::sqrt(static_cast<float>(d)), segments, config.n_head);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t kv = 0; kv < config.n_kv_head; ++kv) {
      const int64_t h0 = kv * group;
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, d, t, ws.probs + (b * config.n_head + h0) * t * t, t,
                                          t * t, ws.v + b * t * kvw + kv * d, kvw, 0, 0.0f,
                                          ws.att + b * t * qw + h0 * d, qw, d, group));
    }
  }
  return Status();
}

Status attention_backward(const Context& ctx, const Config& config, const BatchShape& shape, const BlockLayout& ws,
                          const float* d_att, const int32_t* segments) {
  const int64_t t = shape.seq_len;
  const int64_t d = config.head_dim;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  const int64_t group = config.n_head / config.n_kv_head;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t kv = 0; kv < config.n_kv_head; ++kv) {
      const int64_t h0 = kv * group;
      // dP = dAtt·Vᵀ
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, d, d_att + b * t * qw + h0 * d, qw, d,
                                          ws.v + b * t * kvw + kv * d, kvw, 0, 0.0f,
                                          ws.d_probs + (b * config.n_head + h0) * t * t, t, t * t, group));
    }
  }
  const int64_t rows = shape.batch * config.n_head * t;
  STRATA_CUDA_LAUNCH(gpt2::cuda::softmax_backward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads, ctx.stream(),
                     ws.probs, ws.d_probs, t, rows, 1.0f / std::sqrt(static_cast<float>(d)), segments, config.n_head);
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t kv = 0; kv < config.n_kv_head; ++kv) {
      const int64_t h0 = kv * group;
      const float* ds = ws.d_probs + (b * config.n_head + h0) * t * t;
      const float* p = ws.probs + (b * config.n_head + h0) * t * t;
      // dQ = dS·K for the group's heads at once.
      STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, d, t, ds, t, t * t, ws.k + b * t * kvw + kv * d, kvw,
                                          0, 0.0f, ws.dq + b * t * qw + h0 * d, qw, d, group));
      // dK = Σ_h dS_hᵀ·Q_h, dV = Σ_h P_hᵀ·dAtt_h, heads added in order.
      for (int64_t g = 0; g < group; ++g) {
        const float beta = g == 0 ? 0.0f : 1.0f;
        const int64_t h = h0 + g;
        STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, t, d, t, ds + g * t * t, t, ws.q + b * t * qw + h * d, qw, beta,
                                    ws.dk + b * t * kvw + kv * d, kvw));
        STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, t, d, t, p + g * t * t, t, d_att + b * t * qw + h * d, qw, beta,
                                    ws.dv + b * t * kvw + kv * d, kvw));
      }
    }
  }
  return Status();
}

Status block_forward_into(const Context& ctx, const Config& config, const BatchShape& shape, const BlockWeights& w,
                          const float* x_in, float* x_out, const BlockLayout& ws, const PackedRows& packed,
                          const lora::BlockAdapters* adapters) {
  namespace target = lora::llama_target;
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, x_in, c, w.input_layernorm, n, ws.n1, ws.rstd1));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.q_proj, nullptr, n, c, config.q_width(), ws.q));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.q, w.q_proj_bias, n, config.q_width()));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::q_proj, ws.n1, n, c, config.q_width(), ws.q));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.k_proj, nullptr, n, c, config.kv_width(), ws.k));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.k, w.k_proj_bias, n, config.kv_width()));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::k_proj, ws.n1, n, c, config.kv_width(), ws.k));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.v_proj, nullptr, n, c, config.kv_width(), ws.v));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.v, w.v_proj_bias, n, config.kv_width()));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::v_proj, ws.n1, n, c, config.kv_width(), ws.v));
  STRATA_RETURN_IF_ERROR(rope(ctx, config, shape, ws.q, config.n_head, false, packed.positions));
  STRATA_RETURN_IF_ERROR(rope(ctx, config, shape, ws.k, config.n_kv_head, false, packed.positions));
  STRATA_RETURN_IF_ERROR(attention_forward(ctx, config, shape, ws, packed.segments));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.att, w.o_proj, x_in, n, config.q_width(), c, ws.h));
  if (config.o_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.h, w.o_proj_bias, n, c));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::o_proj, ws.att, n, config.q_width(), c, ws.h));
  STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, ws.h, c, w.post_attention_layernorm, n, ws.n2, ws.rstd2));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n2, w.gate_proj, nullptr, n, c, inter, ws.gate));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::gate_proj, ws.n2, n, c, inter, ws.gate));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n2, w.up_proj, nullptr, n, c, inter, ws.up));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::up_proj, ws.n2, n, c, inter, ws.up));
  STRATA_CUDA_LAUNCH(swiglu_forward_kernel, blocks_for(n * inter), kThreads, ctx.stream(), ws.gate, ws.up, ws.act,
                     n * inter);
  if (x_out != nullptr) {
    STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.act, w.down_proj, ws.h, n, inter, c, x_out));
    STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::down_proj, ws.act, n, inter, c, x_out));
  }
  return Status();
}

}  // namespace

size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  return std::max(block_layout(config, max_shape, nullptr).size_bytes,
                  head_layout(config, max_shape, nullptr).size_bytes);
}

Status embedding_forward(const Context& ctx, const Config& config, const BatchShape& shape, const int32_t* tokens,
                         const float* embed, float* x0) {
  check_call(config, shape, nullptr, 0);
  // No learned positions, scale 1: x0 is the token's row.
  STRATA_CUDA_LAUNCH(embedding_forward_kernel, blocks_for(shape.rows() * config.n_embd), kThreads, ctx.stream(),
                     tokens, nullptr, embed, nullptr, 1.0f, shape.rows(), shape.seq_len, config.n_embd, x0);
  return Status();
}

Status embedding_backward(const Context& ctx, const Config& config, const BatchShape& shape, const int32_t* tokens,
                          const float* d_x0, float* d_embed) {
  check_call(config, shape, nullptr, 0);
  STRATA_CUDA_LAUNCH(embedding_backward_table_kernel, blocks_for(config.n_embd), kThreads, ctx.stream(), tokens, d_x0,
                     shape.rows(), config.n_embd, 1.0f, d_embed);
  return Status();
}

Status block_forward(const Context& ctx, const Config& config, const BatchShape& shape, const BlockWeights& weights,
                     const float* x_in, float* x_out, const Workspace& workspace, const PackedRows& packed,
                     const lora::BlockAdapters* adapters) {
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  assert(x_out != nullptr && x_out != x_in);
  return block_forward_into(ctx, config, shape, weights, x_in, x_out, ws, packed, adapters);
}

Status block_backward(const Context& ctx, const Config& config, const BatchShape& shape, const BlockWeights& w,
                      const float* x_in, const float* d_out, float* d_in, const BlockGrads& g,
                      const Workspace& workspace, bool recompute, const PackedRows& packed,
                      const lora::BlockAdapters* adapters) {
  namespace target = lora::llama_target;
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  if (recompute) STRATA_RETURN_IF_ERROR(block_forward_into(ctx, config, shape, w, x_in, nullptr, ws, packed, adapters));
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  // The same order and buffer reuse as the CPU block_backward (llama.cpp), frozen (null) grads
  // skipped and the adapters' halves around each dx product.
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::down_proj, ws.act, n, inter, c, d_out, 0));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, c, inter, n, d_out, c, ws.act, inter, g.down_proj, inter));
  float* d_act = ws.act;
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, inter, c, d_out, c, w.down_proj, inter, 0.0f, d_act, inter));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::down_proj, n, inter, d_act, 0));
  STRATA_CUDA_LAUNCH(swiglu_backward_kernel, blocks_for(n * inter), kThreads, ctx.stream(), d_act, ws.gate, ws.up,
                     n * inter);
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::gate_proj, ws.n2, n, c, inter, ws.gate, 0));
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::up_proj, ws.n2, n, c, inter, ws.up, 1));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, inter, c, n, ws.gate, inter, ws.n2, c, g.gate_proj, c));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, inter, c, n, ws.up, inter, ws.n2, c, g.up_proj, c));
  float* d_n2 = ws.n2;
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, c, inter, ws.gate, inter, w.gate_proj, c, 0.0f, d_n2, c));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, c, inter, ws.up, inter, w.up_proj, c, 1.0f, d_n2, c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::gate_proj, n, c, d_n2, 0));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::up_proj, n, c, d_n2, 1));
  if (d_in != d_out) {
    const cudaError_t code = cudaMemcpyAsync(d_in, d_out, static_cast<size_t>(n * c) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx.stream());
    if (code != cudaSuccess) return cuda_error("memcpy d_out → d_in", code);
  }
  STRATA_RETURN_IF_ERROR(
      rmsnorm_backward(ctx, config, d_n2, ws.h, ws.rstd2, w.post_attention_layernorm, n, d_in, true,
                       g.post_attention_layernorm));
  if (config.o_bias) STRATA_RETURN_IF_ERROR(column_sums(ctx, d_in, n, c, g.o_proj_bias));
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::o_proj, ws.att, n, qw, c, d_in, 0));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, c, qw, n, d_in, c, ws.att, qw, g.o_proj, qw));
  float* d_att = ws.att;
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, qw, c, d_in, c, w.o_proj, qw, 0.0f, d_att, qw));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::o_proj, n, qw, d_att, 0));
  STRATA_RETURN_IF_ERROR(attention_backward(ctx, config, shape, ws, d_att, packed.segments));
  STRATA_RETURN_IF_ERROR(rope(ctx, config, shape, ws.dq, config.n_head, true, packed.positions));
  STRATA_RETURN_IF_ERROR(rope(ctx, config, shape, ws.dk, config.n_kv_head, true, packed.positions));
  if (config.qkv_bias) {
    STRATA_RETURN_IF_ERROR(column_sums(ctx, ws.dq, n, qw, g.q_proj_bias));
    STRATA_RETURN_IF_ERROR(column_sums(ctx, ws.dk, n, kvw, g.k_proj_bias));
    STRATA_RETURN_IF_ERROR(column_sums(ctx, ws.dv, n, kvw, g.v_proj_bias));
  }
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::q_proj, ws.n1, n, c, qw, ws.dq, 0));
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::k_proj, ws.n1, n, c, kvw, ws.dk, 1));
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::v_proj, ws.n1, n, c, kvw, ws.dv, 2));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, qw, c, n, ws.dq, qw, ws.n1, c, g.q_proj, c));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, kvw, c, n, ws.dk, kvw, ws.n1, c, g.k_proj, c));
  STRATA_RETURN_IF_ERROR(grad_gemm(ctx, true, false, kvw, c, n, ws.dv, kvw, ws.n1, c, g.v_proj, c));
  float* d_n1 = ws.n1;
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, c, qw, ws.dq, qw, w.q_proj, c, 0.0f, d_n1, c));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, c, kvw, ws.dk, kvw, w.k_proj, c, 1.0f, d_n1, c));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, n, c, kvw, ws.dv, kvw, w.v_proj, c, 1.0f, d_n1, c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::q_proj, n, c, d_n1, 0));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::k_proj, n, c, d_n1, 1));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::v_proj, n, c, d_n1, 2));
  return rmsnorm_backward(ctx, config, d_n1, x_in, ws.rstd1, w.input_layernorm, n, d_in, true, g.input_layernorm);
}

Status head_forward_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                             const HeadWeights& w, const float* x_final, const int32_t* targets, float* d_x_final,
                             const HeadGrads& grads, float* loss, const Workspace& workspace,
                             int64_t loss_normalizer_tokens) {
  assert(loss_normalizer_tokens >= 0);
  const float grad_scale = loss_normalizer_tokens > 0 ? 1.0f / static_cast<float>(loss_normalizer_tokens) : 0.0f;
  const HeadLayout ws = head_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t vocab = config.vocab_size;
  for (int64_t r0 = 0; r0 < n; r0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, n - r0);
    const float* x = x_final + r0 * c;
    STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, x, c, w.norm_weight, rows, ws.normed, ws.rstd));
    STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, rows, vocab, c, ws.normed, c, w.lm_head, c, 0.0f, ws.logits, vocab));
    // d_x_final null: the loss only (evaluation) — no gradient rows, no backward products.
    const bool backward = d_x_final != nullptr;
    STRATA_CUDA_LAUNCH(gpt2::cuda::cross_entropy_kernel, static_cast<unsigned>(rows), kThreads, ctx.stream(),
                       ws.logits, vocab, targets + r0, backward, grad_scale, ws.row_loss + r0);
    if (!backward) continue;
    STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, rows, c, vocab, ws.logits, vocab, w.lm_head, c, 0.0f, ws.d_normed, c));
    STRATA_RETURN_IF_ERROR(
        grad_gemm(ctx, true, false, vocab, c, rows, ws.logits, vocab, ws.normed, c, grads.d_lm_head, c));
    STRATA_RETURN_IF_ERROR(rmsnorm_backward(ctx, config, ws.d_normed, x, ws.rstd, w.norm_weight, rows,
                                            d_x_final + r0 * c, false, grads.d_norm_weight));
  }
  STRATA_CUDA_LAUNCH(gpt2::cuda::mean_kernel, 1, kThreads, ctx.stream(), ws.row_loss, n, loss_normalizer_tokens,
                     loss);
  return Status();
}

// ---------------------------------------------------------------------------------------------
// Decoding with a KV cache (generation): llama.cpp's block_decode step for step
// ---------------------------------------------------------------------------------------------

namespace {

// One block per (new row r, query head h) of the rows first_row…: p_j = softmax_j(scale·q·k_j)
// over cached positions 0..past+r, then out = Σ_j p_j v_j in position order. `scores`
// [launched rows, H, max_positions]. A block's result depends on its row alone, so launching
// the rows in groups (block_decode) changes no bit.
__global__ void decode_attention_kernel(Config config, const float* q, const float* keys, const float* values,
                                        int64_t past, int64_t first_row, int64_t max_positions, float scale,
                                        float* scores, float* att) {
  __shared__ double sum_shared[kThreads];
  __shared__ float max_shared[kThreads];
  const int64_t local_row = blockIdx.x / config.n_head;
  const int64_t r = first_row + local_row;
  const int64_t h = blockIdx.x % config.n_head;
  const int64_t d = config.head_dim;
  const int64_t qw = config.n_head * d;  // Config's q_width / kv_width are host-only
  const int64_t kvw = config.n_kv_head * d;
  const int64_t kv = kv_head_of(config, h);
  const int64_t count = past + r + 1;
  const float* q_row = q + r * qw + h * d;
  float* p = scores + (local_row * config.n_head + h) * max_positions;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const float* k = keys + j * kvw + kv * d;
    float dot = 0.0f;
    for (int64_t e = 0; e < d; ++e) dot += q_row[e] * k[e];
    p[j] = dot * scale;
    local_max = fmaxf(local_max, p[j]);
  }
  const float max_value = gpt2::cuda::block_max(local_max, max_shared);
  double local_sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    p[j] = expf(p[j] - max_value);
    local_sum += p[j];
  }
  const auto inv_sum = static_cast<float>(1.0 / gpt2::cuda::block_sum(local_sum, sum_shared));
  __syncthreads();  // every p_j written before any thread reads them all
  for (int64_t e = threadIdx.x; e < d; e += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += (p[j] * inv_sum) * values[j * kvw + kv * d + e];
    att[r * qw + h * d + e] = acc;
  }
}

// The decode workspace: the block's per-row buffers (no training scratch) and the scores of at
// most kDecodeScoreRows rows at a time (a long prompt's attention runs in groups of rows), so it
// grows linearly with the prompt, never with its square.
auto decode_layout(const Config& config, int64_t rows, int64_t max_positions, float* base) {
  const int64_t score_rows = std::min(rows, gpt2::cuda::kDecodeScoreRows);
  return gpt2::decode_layout_after(block_layout(config, BatchShape{1, rows}, base, /*training=*/false),
                                   score_rows * config.n_head * max_positions, base);
}

size_t head_decode_size_bytes(const Config& config) { return gpt2::head_decode_scratch_bytes(config.n_embd, 1); }

}  // namespace

size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions) {
  return std::max(decode_layout(config, max_rows, max_positions, nullptr).size_bytes, head_decode_size_bytes(config));
}

Status embedding_decode(const Context& ctx, const Config& config, int64_t rows, const int32_t* tokens,
                        const float* embed, float* x0) {
  STRATA_CUDA_LAUNCH(embedding_forward_kernel, blocks_for(rows * config.n_embd), kThreads, ctx.stream(), tokens,
                     nullptr, embed, nullptr, 1.0f, rows, rows, config.n_embd, x0);
  return Status();
}

Status block_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows, const BlockWeights& w,
                    const float* x_in, float* x_out, const KvCacheBlock& cache, const Workspace& workspace) {
  assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
  const auto layout = decode_layout(config, rows, cache.max_positions, workspace.data);
  check_call(config, BatchShape{1, 1}, &workspace, layout.size_bytes);
  const BlockLayout& ws = layout.block;
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, x_in, c, w.input_layernorm, rows, ws.n1, ws.rstd1));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.q_proj, nullptr, rows, c, qw, ws.q));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.q, w.q_proj_bias, rows, qw));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.k_proj, nullptr, rows, c, kvw, ws.k));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.k, w.k_proj_bias, rows, kvw));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n1, w.v_proj, nullptr, rows, c, kvw, ws.v));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.v, w.v_proj_bias, rows, kvw));
  // RoPE at the absolute positions past…past+rows−1 (row r of t_len = rows is position past + r).
  const int64_t half = config.head_dim / 2;
  STRATA_CUDA_LAUNCH(rope_kernel, blocks_for(rows * config.n_head * half), kThreads, ctx.stream(), rope_spec(config),
                     ws.q, rows, rows, past, config.n_head, 1.0f, nullptr);
  STRATA_CUDA_LAUNCH(rope_kernel, blocks_for(rows * config.n_kv_head * half), kThreads, ctx.stream(),
                     rope_spec(config), ws.k, rows, rows, past, config.n_kv_head, 1.0f, nullptr);
  const size_t kv_bytes = static_cast<size_t>(rows * kvw) * sizeof(float);
  cudaError_t code = cudaMemcpyAsync(cache.keys + past * kvw, ws.k, kv_bytes, cudaMemcpyDeviceToDevice, ctx.stream());
  if (code != cudaSuccess) return cuda_error("memcpy k into the cache", code);
  code = cudaMemcpyAsync(cache.values + past * kvw, ws.v, kv_bytes, cudaMemcpyDeviceToDevice, ctx.stream());
  if (code != cudaSuccess) return cuda_error("memcpy v into the cache", code);
  for (int64_t first = 0; first < rows; first += gpt2::cuda::kDecodeScoreRows) {
    const int64_t group = std::min(gpt2::cuda::kDecodeScoreRows, rows - first);
    STRATA_CUDA_LAUNCH(decode_attention_kernel, static_cast<unsigned>(group * config.n_head), kThreads, ctx.stream(),
                       config, ws.q, cache.keys, cache.values, past, first, cache.max_positions,
                       1.0f / std::sqrt(static_cast<float>(config.head_dim)), layout.scores, ws.att);
  }
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.att, w.o_proj, x_in, rows, qw, c, ws.h));
  if (config.o_bias) STRATA_RETURN_IF_ERROR(add_bias(ctx, ws.h, w.o_proj_bias, rows, c));
  STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, ws.h, c, w.post_attention_layernorm, rows, ws.n2, ws.rstd2));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n2, w.gate_proj, nullptr, rows, c, inter, ws.gate));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.n2, w.up_proj, nullptr, rows, c, inter, ws.up));
  STRATA_CUDA_LAUNCH(swiglu_forward_kernel, blocks_for(rows * inter), kThreads, ctx.stream(), ws.gate, ws.up, ws.act,
                     rows * inter);
  return linear_forward(ctx, ws.act, w.down_proj, ws.h, rows, inter, c, x_out);
}

Status head_decode(const Context& ctx, const Config& config, int64_t rows, const HeadWeights& w, const float* x_final,
                   float* logits, const Workspace& workspace) {
  check_call(config, BatchShape{1, 1}, &workspace, head_decode_size_bytes(config));
  const int64_t c = config.n_embd;
  WorkspaceCarver carve(workspace.data);
  float* normed = carve.take(c);
  float* rstd = carve.take(1);
  STRATA_RETURN_IF_ERROR(rmsnorm_forward(ctx, config, x_final + (rows - 1) * c, c, w.norm_weight, 1, normed, rstd));
  return gemm(ctx, false, true, 1, config.vocab_size, c, normed, c, w.lm_head, c, 0.0f, logits, config.vocab_size);
}

}  // namespace strata::kernels::llama::cuda
