// kernels/llama/llama_cuda.cu — the CUDA Llama decode: cuBLAS for the products (cuda_common.cuh's
// sgemm, shared with GPT-2's twin), the operations' small kernels (op_kernels.cuh) for RMSNorm,
// RoPE, SwiGLU and the embedding. Mirrors llama.cpp's block_decode step for step. Training runs
// the operations (cuda_ops.h) under the model definitions.
#include "kernels/llama/llama_cuda.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/op_kernels.cuh"
#include "kernels/llama/llama_math.h"

namespace strata::kernels::llama::cuda {
namespace {

using gpt2::WorkspaceCarver;
using gpt2::cuda::blocks_for;
using gpt2::cuda::check_launch;
using gpt2::cuda::cuda_error;
using gpt2::cuda::gemm;
using gpt2::cuda::kThreads;
using gpt2::cuda::kWarpsPerBlock;

// The kernels are op_kernels.cuh's, the CUDA operations' own (cuda_ops.cu): one copy each.
using op_kernels::add_bias_kernel;
using op_kernels::embedding_forward_kernel;
using op_kernels::rmsnorm_forward_kernel;
using op_kernels::rope_kernel;
using op_kernels::swiglu_forward_kernel;

// Llama's RMSNorm multiplies by w itself (ops::NormForward::weight_offset 0).
constexpr float kNoWeightOffset = 0.0f;

// The per-row buffers of one block's forward for `rows` rows (decoding keeps no attention
// probabilities: its scores have their own, row-grouped buffer).
struct BlockLayout {
  float *n1, *rstd1, *q, *k, *v, *att, *h, *n2, *rstd2, *gate, *up, *act;
  size_t size_bytes;
};

BlockLayout block_layout(const Config& config, int64_t rows, float* base) {
  const int64_t n = rows;
  const int64_t c = config.n_embd;
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

}  // namespace

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
  return gpt2::decode_layout_after(block_layout(config, rows, base),
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
