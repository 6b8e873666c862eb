// kernels/gpt2/gpt2_cuda.cu — the CUDA GPT-2: cuBLAS for the products, the operations' small
// kernels (op_kernels.cuh) for the rest. Mirrors gpt2.cpp step for step; reductions are
// fixed-order (see gpt2_cuda.h).
#include "kernels/gpt2/gpt2_cuda.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "common/narrow.h"
#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/op_kernels.cuh"
#include "kernels/gpt2/gpt2_math.h"
#include "kernels/lora/lora_cuda.h"

namespace strata::kernels::gpt2::cuda {

namespace {

// The kernels are op_kernels.cuh's, the CUDA operations' own (cuda_ops.cu): one copy each.
using op_kernels::embedding_backward_positions_kernel;
using op_kernels::embedding_backward_positions_packed_kernel;
using op_kernels::embedding_backward_table_kernel;
using op_kernels::embedding_forward_kernel;
using op_kernels::fill_rows_kernel;
using op_kernels::gelu_backward_kernel;
using op_kernels::gelu_forward_kernel;
using op_kernels::layernorm_backward_dx_kernel;
using op_kernels::layernorm_backward_params_kernel;
using op_kernels::layernorm_forward_kernel;

// GPT-2's LayerNorm has no weight offset (ops::NormForward::weight_offset 0: w itself).
constexpr float kNoWeightOffset = 0.0f;

Status linear_forward(const Context& ctx, const float* x, const float* w, const float* bias,
                      const float* residual, int64_t rows, int64_t in, int64_t out, float* y) {
  STRATA_CUDA_LAUNCH(fill_rows_kernel, blocks_for(rows * out), kThreads, ctx.stream(), y, bias,
                     residual, rows, out);
  return gemm(ctx, false, false, rows, out, in, x, in, w, out, 1.0f, y, out);
}

Status layernorm_forward(const Context& ctx, const float* x, int64_t x_stride, const float* w,
                         const float* b, int64_t rows, int64_t c, float* y, float* mean,
                         float* rstd) {
  STRATA_CUDA_LAUNCH(layernorm_forward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads,
                     ctx.stream(), x, x_stride, w, kNoWeightOffset, b, rows, c, static_cast<double>(kLayerNormEps), y,
                     mean, rstd);
  return Status();
}

Status layernorm_backward(const Context& ctx, const float* dy, const float* x, const float* mean,
                          const float* rstd, const float* w, int64_t rows, int64_t c, float* dx,
                          bool accumulate, float* dw, float* db) {
  STRATA_CUDA_LAUNCH(layernorm_backward_dx_kernel, blocks_for(rows, kWarpsPerBlock), kThreads,
                     ctx.stream(), dy, x, mean, rstd, w, kNoWeightOffset, rows, c, dx, accumulate);
  assert((dw == nullptr) == (db == nullptr));
  if (dw == nullptr) return Status();  // frozen
  STRATA_CUDA_LAUNCH(layernorm_backward_params_kernel, blocks_for(c), kThreads, ctx.stream(), dy,
                     x, mean, rstd, rows, c, dw, db);
  return Status();
}

// Each targeted linear's adapter (lora_cuda.h's block entry points; nothing for an untargeted one).
using lora::cuda::adapter_backward_input;
using lora::cuda::adapter_backward_params;
using lora::cuda::adapter_forward;

struct BlockLayout {
  float* ln1_out;
  float* ln1_mean;
  float* ln1_rstd;
  float* qkv;
  float* att;
  float* x1;
  float* ln2_out;
  float* ln2_mean;
  float* ln2_rstd;
  float* fc_pre;
  float* fc_act;
  float* probs;    // [B, H, T, T]
  float* d_probs;  // [B, H, T, T]
  size_t size_bytes;
};

// `training`: with the [B, H, T, T] attention probabilities and their gradients, which only
// training's forward and backward use; decoding leaves them out (null), as they would cost
// 2·H·T² floats for a T-row prompt — 4.3 GB at 32 heads and 4096 rows.
BlockLayout block_layout(const Config& config, const BatchShape& shape, float* base, bool training = true) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t att_rows = training ? shape.batch * config.n_head * shape.seq_len * shape.seq_len : 0;
  WorkspaceCarver carve(base);
  BlockLayout l{};
  l.ln1_out = carve.take(n * c);
  l.ln1_mean = carve.take(n);
  l.ln1_rstd = carve.take(n);
  l.qkv = carve.take(n * 3 * c);
  l.att = carve.take(n * c);
  l.x1 = carve.take(n * c);
  l.ln2_out = carve.take(n * c);
  l.ln2_mean = carve.take(n);
  l.ln2_rstd = carve.take(n);
  l.fc_pre = carve.take(n * 4 * c);
  l.fc_act = carve.take(n * 4 * c);
  l.probs = training ? carve.take(att_rows) : nullptr;
  l.d_probs = training ? carve.take(att_rows) : nullptr;
  l.size_bytes = carve.used_bytes();
  return l;
}

struct HeadLayout {
  float* ln_out;
  float* mean;
  float* rstd;
  float* logits;
  float* d_ln_out;
  float* row_loss;  // [B·T]
  size_t size_bytes;
};

HeadLayout head_layout(const Config& config, const BatchShape& shape, float* base) {
  const int64_t r = kHeadChunkRows;
  WorkspaceCarver carve(base);
  HeadLayout l{};
  l.ln_out = carve.take(r * config.n_embd);
  l.mean = carve.take(r);
  l.rstd = carve.take(r);
  l.logits = carve.take(r * config.vocab_size);
  l.d_ln_out = carve.take(r * config.n_embd);
  l.row_loss = carve.take(shape.rows());
  l.size_bytes = carve.used_bytes();
  return l;
}

void check_call(const Config& config, const BatchShape& shape, const Workspace* workspace,
                size_t needed_bytes) {
  assert(config.n_head > 0 && config.n_embd % config.n_head == 0);
  assert(shape.batch > 0 && shape.seq_len > 0 && shape.seq_len <= config.n_ctx);
  assert(workspace == nullptr ||
         (workspace->data != nullptr && workspace->size_bytes >= needed_bytes &&
          reinterpret_cast<uintptr_t>(workspace->data) % 256 == 0));
  (void)config;
  (void)shape;
  (void)workspace;
  (void)needed_bytes;
}

// Causal attention over the fused qkv: per batch row, one strided-batched product over heads.
Status attention_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                         const BlockLayout& ws, const int32_t* segments) {
  const int64_t t = shape.seq_len;
  const int64_t c = config.n_embd;
  const int64_t hd = config.head_dim();
  const int64_t heads = config.n_head;
  for (int64_t b = 0; b < shape.batch; ++b) {
    const float* q = ws.qkv + b * t * 3 * c;
    float* probs = ws.probs + b * heads * t * t;
    // S = Q·Kᵀ
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, hd, q, 3 * c, hd, q + c, 3 * c,
                                        hd, 0.0f, probs, t, t * t, heads));
  }
  const int64_t rows = shape.batch * heads * t;
  STRATA_CUDA_LAUNCH(causal_softmax_kernel, blocks_for(rows, kWarpsPerBlock), kThreads,
                     ctx.stream(), ws.probs, t, rows,
                     1.0f / std::sqrt(static_cast<float>(hd)), segments, heads);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const float* v = ws.qkv + b * t * 3 * c + 2 * c;
    // att = P·V, written head by head into the merged [T, C] rows.
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, hd, t, ws.probs + b * heads * t * t,
                                        t, t * t, v, 3 * c, hd, 0.0f, ws.att + b * t * c, c, hd,
                                        heads));
  }
  return Status();
}

Status attention_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                          const BlockLayout& ws, const float* d_att, const int32_t* segments,
                          float* d_qkv) {
  const int64_t t = shape.seq_len;
  const int64_t c = config.n_embd;
  const int64_t hd = config.head_dim();
  const int64_t heads = config.n_head;
  for (int64_t b = 0; b < shape.batch; ++b) {
    // dP = dAtt·Vᵀ
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, true, t, t, hd, d_att + b * t * c, c, hd,
                                        ws.qkv + b * t * 3 * c + 2 * c, 3 * c, hd, 0.0f,
                                        ws.d_probs + b * heads * t * t, t, t * t, heads));
  }
  const int64_t rows = shape.batch * heads * t;
  STRATA_CUDA_LAUNCH(softmax_backward_kernel, blocks_for(rows, kWarpsPerBlock), kThreads,
                     ctx.stream(), ws.probs, ws.d_probs, t, rows,
                     1.0f / std::sqrt(static_cast<float>(hd)), segments, heads);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const float* q = ws.qkv + b * t * 3 * c;
    const float* ds = ws.d_probs + b * heads * t * t;
    const float* p = ws.probs + b * heads * t * t;
    float* dq = d_qkv + b * t * 3 * c;
    // dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dAtt
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, false, false, t, hd, t, ds, t, t * t, q + c, 3 * c,
                                        hd, 0.0f, dq, 3 * c, hd, heads));
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, true, false, t, hd, t, ds, t, t * t, q, 3 * c, hd,
                                        0.0f, dq + c, 3 * c, hd, heads));
    STRATA_RETURN_IF_ERROR(gemm_batched(ctx, true, false, t, hd, t, p, t, t * t,
                                        d_att + b * t * c, c, hd, 0.0f, dq + 2 * c, 3 * c, hd,
                                        heads));
  }
  return Status();
}

Status block_forward_into(const Context& ctx, const Config& config, const BatchShape& shape,
                          const BlockWeights& w, const float* x_in, float* x_out,
                          const BlockLayout& ws, const int32_t* segments, const lora::BlockAdapters* adapters) {
  namespace target = lora::gpt2_target;
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  STRATA_RETURN_IF_ERROR(layernorm_forward(ctx, x_in, c, w.ln_1_weight, w.ln_1_bias, n, c,
                                           ws.ln1_out, ws.ln1_mean, ws.ln1_rstd));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.ln1_out, w.attn_c_attn_weight,
                                        w.attn_c_attn_bias, nullptr, n, c, 3 * c, ws.qkv));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::c_attn, ws.ln1_out, n, c, 3 * c, ws.qkv));
  STRATA_RETURN_IF_ERROR(attention_forward(ctx, config, shape, ws, segments));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.att, w.attn_c_proj_weight, w.attn_c_proj_bias,
                                        x_in, n, c, c, ws.x1));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::attn_c_proj, ws.att, n, c, c, ws.x1));
  STRATA_RETURN_IF_ERROR(layernorm_forward(ctx, ws.x1, c, w.ln_2_weight, w.ln_2_bias, n, c,
                                           ws.ln2_out, ws.ln2_mean, ws.ln2_rstd));
  STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.ln2_out, w.mlp_c_fc_weight, w.mlp_c_fc_bias,
                                        nullptr, n, c, 4 * c, ws.fc_pre));
  STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::c_fc, ws.ln2_out, n, c, 4 * c, ws.fc_pre));
  STRATA_CUDA_LAUNCH(gelu_forward_kernel, blocks_for(n * 4 * c), kThreads, ctx.stream(),
                     ws.fc_pre, ws.fc_act, n * 4 * c);
  if (x_out != nullptr) {
    STRATA_RETURN_IF_ERROR(linear_forward(ctx, ws.fc_act, w.mlp_c_proj_weight,
                                          w.mlp_c_proj_bias, ws.x1, n, 4 * c, c, x_out));
    STRATA_RETURN_IF_ERROR(adapter_forward(ctx, adapters, target::mlp_c_proj, ws.fc_act, n, 4 * c, c, x_out));
  }
  return Status();
}

Status head_run(const Context& ctx, const Config& config, const BatchShape& shape,
                const HeadWeights& w, const float* x_final, const int32_t* targets,
                float* d_x_final, const HeadGrads* grads, float* loss,
                const Workspace& workspace, int64_t loss_normalizer_tokens) {
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
    STRATA_RETURN_IF_ERROR(layernorm_forward(ctx, x, c, w.ln_f_weight, w.ln_f_bias, rows, c,
                                             ws.ln_out, ws.mean, ws.rstd));
    STRATA_RETURN_IF_ERROR(
        gemm(ctx, false, true, rows, vocab, c, ws.ln_out, c, w.wte, c, 0.0f, ws.logits, vocab));
    STRATA_CUDA_LAUNCH(cross_entropy_kernel, static_cast<unsigned>(rows), kThreads, ctx.stream(),
                       ws.logits, vocab, targets + r0, grads != nullptr, grad_scale, ws.row_loss + r0);
    if (grads == nullptr) continue;
    STRATA_RETURN_IF_ERROR(gemm(ctx, false, false, rows, c, vocab, ws.logits, vocab, w.wte, c,
                                0.0f, ws.d_ln_out, c));
    if (grads->d_wte != nullptr) {
      STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, vocab, c, rows, ws.logits, vocab, ws.ln_out, c,
                                  1.0f, grads->d_wte, c));
    }
    STRATA_RETURN_IF_ERROR(layernorm_backward(ctx, ws.d_ln_out, x, ws.mean, ws.rstd,
                                              w.ln_f_weight, rows, c, d_x_final + r0 * c, false,
                                              grads->d_ln_f_weight, grads->d_ln_f_bias));
  }
  STRATA_CUDA_LAUNCH(mean_kernel, 1, kThreads, ctx.stream(), ws.row_loss, n, loss_normalizer_tokens, loss);
  return Status();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------

Result<Context> Context::create(cudaStream_t stream) {
  // cuBLAS is loaded at run time (kernels/cuda/cublas_loader.h): a machine without it gets the
  // places searched, not cuBLAS's bare NOT_INITIALIZED.
  if (const RuntimeLibrary& cublas = kernels::cublas_runtime_library(); cublas.handle == nullptr)
    return make_error(ErrorKind::unsupported, "cuBLAS not found (tried " + cublas.tried + "); install the CUDA "
                      "toolkit or the nvidia-cublas wheel, or put its lib folder on LD_LIBRARY_PATH");
  cublasHandle_t handle = nullptr;
  cublasStatus_t code = cublasCreate(&handle);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("create", code);
  Context ctx(stream, handle);  // owns the handle from here on
  code = cublasSetStream(handle, stream);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("set stream", code);
  // Pedantic: plain fp32 products, never TF32, so the CUDA results match the CPU's rounding.
  code = cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);
  if (code != CUBLAS_STATUS_SUCCESS) return cublas_error("set math mode", code);
  return Result<Context>(std::move(ctx));
}

Context::Context(Context&& other) noexcept
    : stream_(other.stream_), cublas_(std::exchange(other.cublas_, nullptr)) {}

Context& Context::operator=(Context&& other) noexcept {
  std::swap(stream_, other.stream_);
  std::swap(cublas_, other.cublas_);
  return *this;
}

Context::~Context() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

size_t block_workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  return block_layout(config, max_shape, nullptr).size_bytes;
}

size_t head_workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  return head_layout(config, max_shape, nullptr).size_bytes;
}

size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  // Qualified: argument-dependent lookup would also find the CPU sizing functions.
  return std::max(cuda::block_workspace_size_bytes(config, max_shape),
                  cuda::head_workspace_size_bytes(config, max_shape));
}

Status embedding_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                         const int32_t* tokens, const float* wte, const float* wpe, float* x0,
                         const PackedRows& packed) {
  check_call(config, shape, nullptr, 0);
  const int64_t c = config.n_embd;
  STRATA_CUDA_LAUNCH(embedding_forward_kernel, blocks_for(shape.rows() * c), kThreads,
                     ctx.stream(), tokens, packed.positions, wte, wpe, 1.0f, shape.rows(), shape.seq_len, c,
                     x0);
  return Status();
}

Status embedding_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                          const int32_t* tokens, const float* d_x0, float* d_wte, float* d_wpe,
                          const PackedRows& packed) {
  check_call(config, shape, nullptr, 0);
  const int64_t c = config.n_embd;
  STRATA_CUDA_LAUNCH(embedding_backward_table_kernel, blocks_for(c), kThreads, ctx.stream(),
                     tokens, d_x0, shape.rows(), c, 1.0f, d_wte);
  if (packed.positions != nullptr) {
    STRATA_CUDA_LAUNCH(embedding_backward_positions_packed_kernel, blocks_for(c), kThreads, ctx.stream(),
                       packed.positions, d_x0, shape.rows(), c, d_wpe);
    return Status();
  }
  STRATA_CUDA_LAUNCH(embedding_backward_positions_kernel, blocks_for(shape.seq_len * c), kThreads,
                     ctx.stream(), d_x0, shape.batch, shape.seq_len, c, d_wpe);
  return Status();
}

Status block_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                     const BlockWeights& weights, const float* x_in, float* x_out,
                     const Workspace& workspace, const PackedRows& packed, const lora::BlockAdapters* adapters) {
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  assert(x_out != nullptr && x_out != x_in);
  return block_forward_into(ctx, config, shape, weights, x_in, x_out, ws, packed.segments, adapters);
}

Status block_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                      const BlockWeights& w, const float* x_in, const float* d_out, float* d_in,
                      const BlockGrads& g, const Workspace& workspace, bool recompute,
                      const PackedRows& packed, const lora::BlockAdapters* adapters) {
  namespace target = lora::gpt2_target;
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  if (recompute) {
    STRATA_RETURN_IF_ERROR(block_forward_into(ctx, config, shape, w, x_in, nullptr, ws, packed.segments, adapters));
  }
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  // The same order and buffer reuse as the CPU block_backward (see gpt2.cpp); null grads are
  // frozen and skipped, and each adapter's backward straddles its linear's dx product.
  float* d_fc = ws.fc_act;
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::mlp_c_proj, ws.fc_act, n, 4 * c, c, d_out));
  if (g.mlp_c_proj_weight != nullptr) {
    STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, 4 * c, c, n, ws.fc_act, 4 * c, d_out, c, 1.0f,
                                g.mlp_c_proj_weight, c));
  }
  STRATA_RETURN_IF_ERROR(column_sums(ctx, d_out, n, c, g.mlp_c_proj_bias));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, n, 4 * c, c, d_out, c, w.mlp_c_proj_weight, c,
                              0.0f, d_fc, 4 * c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::mlp_c_proj, n, 4 * c, d_fc));
  STRATA_CUDA_LAUNCH(gelu_backward_kernel, blocks_for(n * 4 * c), kThreads, ctx.stream(), d_fc,
                     ws.fc_pre, n * 4 * c);
  float* d_ln2 = ws.ln2_out;
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::c_fc, ws.ln2_out, n, c, 4 * c, d_fc));
  if (g.mlp_c_fc_weight != nullptr) {
    STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, c, 4 * c, n, ws.ln2_out, c, d_fc, 4 * c, 1.0f,
                                g.mlp_c_fc_weight, 4 * c));
  }
  STRATA_RETURN_IF_ERROR(column_sums(ctx, d_fc, n, 4 * c, g.mlp_c_fc_bias));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, n, c, 4 * c, d_fc, 4 * c, w.mlp_c_fc_weight,
                              4 * c, 0.0f, d_ln2, c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::c_fc, n, c, d_ln2));
  if (d_in != d_out) {
    const cudaError_t code = cudaMemcpyAsync(d_in, d_out, static_cast<size_t>(n * c) * sizeof(float),
                                             cudaMemcpyDeviceToDevice, ctx.stream());
    if (code != cudaSuccess) return cuda_error("memcpy d_out → d_in", code);
  }
  STRATA_RETURN_IF_ERROR(layernorm_backward(ctx, d_ln2, ws.x1, ws.ln2_mean, ws.ln2_rstd,
                                            w.ln_2_weight, n, c, d_in, true, g.ln_2_weight,
                                            g.ln_2_bias));
  float* d_att = ws.att;
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::attn_c_proj, ws.att, n, c, c, d_in));
  if (g.attn_c_proj_weight != nullptr) {
    STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, c, c, n, ws.att, c, d_in, c, 1.0f,
                                g.attn_c_proj_weight, c));
  }
  STRATA_RETURN_IF_ERROR(column_sums(ctx, d_in, n, c, g.attn_c_proj_bias));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, n, c, c, d_in, c, w.attn_c_proj_weight, c, 0.0f,
                              d_att, c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::attn_c_proj, n, c, d_att));
  float* d_qkv = ws.fc_pre;
  STRATA_RETURN_IF_ERROR(attention_backward(ctx, config, shape, ws, d_att, packed.segments, d_qkv));
  float* d_ln1 = ws.ln1_out;
  STRATA_RETURN_IF_ERROR(adapter_backward_params(ctx, adapters, target::c_attn, ws.ln1_out, n, c, 3 * c, d_qkv));
  if (g.attn_c_attn_weight != nullptr) {
    STRATA_RETURN_IF_ERROR(gemm(ctx, true, false, c, 3 * c, n, ws.ln1_out, c, d_qkv, 3 * c, 1.0f,
                                g.attn_c_attn_weight, 3 * c));
  }
  STRATA_RETURN_IF_ERROR(column_sums(ctx, d_qkv, n, 3 * c, g.attn_c_attn_bias));
  STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, n, c, 3 * c, d_qkv, 3 * c, w.attn_c_attn_weight,
                              3 * c, 0.0f, d_ln1, c));
  STRATA_RETURN_IF_ERROR(adapter_backward_input(ctx, adapters, target::c_attn, n, c, d_ln1));
  return layernorm_backward(ctx, d_ln1, x_in, ws.ln1_mean, ws.ln1_rstd, w.ln_1_weight, n, c, d_in,
                            true, g.ln_1_weight, g.ln_1_bias);
}

Status head_forward_backward(const Context& ctx, const Config& config, const BatchShape& shape,
                             const HeadWeights& weights, const float* x_final,
                             const int32_t* targets, float* d_x_final, const HeadGrads& grads,
                             float* loss, const Workspace& workspace, int64_t loss_normalizer_tokens) {
  assert(d_x_final != nullptr);
  return head_run(ctx, config, shape, weights, x_final, targets, d_x_final, &grads, loss,
                  workspace, loss_normalizer_tokens);
}

Status head_loss(const Context& ctx, const Config& config, const BatchShape& shape,
                 const HeadWeights& weights, const float* x_final, const int32_t* targets,
                 float* loss, const Workspace& workspace, int64_t loss_normalizer_tokens) {
  return head_run(ctx, config, shape, weights, x_final, targets, nullptr, nullptr, loss,
                  workspace, loss_normalizer_tokens);
}

Status head_forward(const Context& ctx, const Config& config, const BatchShape& shape,
                    const HeadWeights& w, const float* x_final, float* logits,
                    const Workspace& workspace) {
  const HeadLayout ws = head_layout(config, shape, workspace.data);
  check_call(config, shape, &workspace, ws.size_bytes);
  const int64_t c = config.n_embd;
  const int64_t stride = shape.seq_len * c;
  for (int64_t b0 = 0; b0 < shape.batch; b0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, shape.batch - b0);
    STRATA_RETURN_IF_ERROR(layernorm_forward(ctx, x_final + b0 * stride + (shape.seq_len - 1) * c,
                                             stride, w.ln_f_weight, w.ln_f_bias, rows, c,
                                             ws.ln_out, ws.mean, ws.rstd));
    STRATA_RETURN_IF_ERROR(gemm(ctx, false, true, rows, config.vocab_size, c, ws.ln_out, c, w.wte,
                                c, 0.0f, logits + b0 * config.vocab_size, config.vocab_size));
  }
  return Status();
}

}  // namespace strata::kernels::gpt2::cuda

// ---------------------------------------------------------------------------------------------
// Decoding with a KV cache (generation): gpt2.cpp's block_decode step for step
// ---------------------------------------------------------------------------------------------

namespace strata::kernels::gpt2::cuda {
namespace {

// One block per (new row r, head h) of the rows first_row…: p_j = softmax_j(scale·q·k_j) over
// the cached positions 0..past+r, then out = Σ_j p_j v_j in position order. q is the fused qkv
// [rows, 3C]; `scores` [launched rows, H, max_positions]. Max and sum by fixed block trees: no
// atomics. A block's result depends on its row alone, so launching the rows in groups
// (block_decode) changes no bit.
__global__ void decode_attention_kernel(const float* qkv, const float* keys, const float* values, int64_t past,
                                        int64_t first_row, int64_t n_head, int64_t head_dim, int64_t max_positions,
                                        float scale, float* scores, float* att) {
  __shared__ double sum_shared[kThreads];
  __shared__ float max_shared[kThreads];
  const int64_t local_row = blockIdx.x / n_head;
  const int64_t r = first_row + local_row;
  const int64_t h = blockIdx.x % n_head;
  const int64_t d = head_dim;
  const int64_t c = n_head * d;
  const int64_t count = past + r + 1;
  const float* q_row = qkv + r * 3 * c + h * d;
  float* p = scores + (local_row * n_head + h) * max_positions;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    const float* k = keys + j * c + h * d;
    float dot = 0.0f;
    for (int64_t e = 0; e < d; ++e) dot += q_row[e] * k[e];
    p[j] = dot * scale;
    local_max = fmaxf(local_max, p[j]);
  }
  const float max_value = block_max(local_max, max_shared);
  double local_sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) {
    p[j] = expf(p[j] - max_value);
    local_sum += p[j];
  }
  const auto inv_sum = static_cast<float>(1.0 / block_sum(local_sum, sum_shared));
  __syncthreads();  // every p_j written before any thread reads them all
  for (int64_t e = threadIdx.x; e < d; e += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < count; ++j) acc += (p[j] * inv_sum) * values[j * c + h * d + e];
    att[r * c + h * d + e] = acc;
  }
}

__global__ void embedding_decode_kernel(const int32_t* tokens, const float* wte, const float* wpe, int64_t past,
                                        int64_t rows, int64_t c, float* x0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * c) return;
  const int64_t r = i / c;
  const int64_t j = i % c;
  x0[i] = wte[static_cast<int64_t>(tokens[r]) * c + j] + wpe[(past + r) * c + j];
}

// The decode workspace: the block's per-row buffers (no training attention scratch) and the
// scores of at most kDecodeScoreRows rows at a time (a long prompt's attention runs in groups
// of rows), so it grows linearly with the prompt, never with its square.
auto decode_layout(const Config& config, int64_t rows, int64_t max_positions, float* base) {
  const int64_t score_rows = std::min(rows, kDecodeScoreRows);
  return decode_layout_after(block_layout(config, BatchShape{1, rows}, base, /*training=*/false),
                             score_rows * config.n_head * max_positions, base);
}

size_t head_decode_size_bytes(const Config& config) { return head_decode_scratch_bytes(config.n_embd, 2); }

}  // namespace

size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions) {
  return std::max(decode_layout(config, max_rows, max_positions, nullptr).size_bytes, head_decode_size_bytes(config));
}

Status embedding_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows, const int32_t* tokens,
                        const float* wte, const float* wpe, float* x0) {
  assert(past >= 0 && rows > 0 && past + rows <= config.n_ctx);
  STRATA_CUDA_LAUNCH(embedding_decode_kernel, blocks_for(rows * config.n_embd), kThreads, ctx.stream(), tokens, wte,
                     wpe, past, rows, config.n_embd, x0);
  return Status();
}

Status block_decode(const Context& ctx, const Config& config, int64_t past, int64_t rows, const BlockWeights& w,
                    const float* x_in, float* x_out, const KvCacheBlock& cache, const Workspace& workspace) {
  assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
  const auto layout = decode_layout(config, rows, cache.max_positions, workspace.data);
  check_call(config, BatchShape{1, 1}, &workspace, layout.size_bytes);
  const BlockLayout& ws = layout.block;
  const int64_t c = config.n_embd;
  STRATA_RETURN_IF_ERROR(
      layernorm_forward(ctx, x_in, c, w.ln_1_weight, w.ln_1_bias, rows, c, ws.ln1_out, ws.ln1_mean, ws.ln1_rstd));
  STRATA_RETURN_IF_ERROR(
      linear_forward(ctx, ws.ln1_out, w.attn_c_attn_weight, w.attn_c_attn_bias, nullptr, rows, c, 3 * c, ws.qkv));
  // The new rows' k and v (columns C..2C and 2C..3C of qkv) into the cache at positions past…
  const size_t row_bytes = static_cast<size_t>(c) * sizeof(float);
  const size_t qkv_pitch = 3 * row_bytes;
  cudaError_t code = cudaMemcpy2DAsync(cache.keys + past * c, row_bytes, ws.qkv + c, qkv_pitch, row_bytes,
                                       static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, ctx.stream());
  if (code != cudaSuccess) return cuda_error("memcpy k into the cache", code);
  code = cudaMemcpy2DAsync(cache.values + past * c, row_bytes, ws.qkv + 2 * c, qkv_pitch, row_bytes,
                           static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, ctx.stream());
  if (code != cudaSuccess) return cuda_error("memcpy v into the cache", code);
  for (int64_t first = 0; first < rows; first += kDecodeScoreRows) {
    const int64_t group = std::min(kDecodeScoreRows, rows - first);
    STRATA_CUDA_LAUNCH(decode_attention_kernel, static_cast<unsigned>(group * config.n_head), kThreads, ctx.stream(),
                       ws.qkv, cache.keys, cache.values, past, first, config.n_head, config.head_dim(),
                       cache.max_positions, 1.0f / std::sqrt(static_cast<float>(config.head_dim())), layout.scores,
                       ws.att);
  }
  STRATA_RETURN_IF_ERROR(
      linear_forward(ctx, ws.att, w.attn_c_proj_weight, w.attn_c_proj_bias, x_in, rows, c, c, ws.x1));
  STRATA_RETURN_IF_ERROR(
      layernorm_forward(ctx, ws.x1, c, w.ln_2_weight, w.ln_2_bias, rows, c, ws.ln2_out, ws.ln2_mean, ws.ln2_rstd));
  STRATA_RETURN_IF_ERROR(
      linear_forward(ctx, ws.ln2_out, w.mlp_c_fc_weight, w.mlp_c_fc_bias, nullptr, rows, c, 4 * c, ws.fc_pre));
  STRATA_CUDA_LAUNCH(gelu_forward_kernel, blocks_for(rows * 4 * c), kThreads, ctx.stream(), ws.fc_pre, ws.fc_act,
                     rows * 4 * c);
  return linear_forward(ctx, ws.fc_act, w.mlp_c_proj_weight, w.mlp_c_proj_bias, ws.x1, rows, 4 * c, c, x_out);
}

Status head_decode(const Context& ctx, const Config& config, int64_t rows, const HeadWeights& w,
                   const float* x_final, float* logits, const Workspace& workspace) {
  check_call(config, BatchShape{1, 1}, &workspace, head_decode_size_bytes(config));
  const int64_t c = config.n_embd;
  WorkspaceCarver carve(workspace.data);
  float* normed = carve.take(c);
  float* mean = carve.take(1);
  float* rstd = carve.take(1);
  STRATA_RETURN_IF_ERROR(layernorm_forward(ctx, x_final + (rows - 1) * c, c, w.ln_f_weight, w.ln_f_bias, 1, c,
                                           normed, mean, rstd));
  return gemm(ctx, false, true, 1, config.vocab_size, c, normed, c, w.wte, c, 0.0f, logits, config.vocab_size);
}

}  // namespace strata::kernels::gpt2::cuda
