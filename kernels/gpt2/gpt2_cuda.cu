// kernels/gpt2/gpt2_cuda.cu — the CUDA GPT-2 decode and the cuBLAS Context: cuBLAS for the
// products, the operations' small kernels (op_kernels.cuh) for the rest. Mirrors gpt2.cpp's
// block_decode step for step; reductions are fixed-order (see gpt2_cuda.h). Training runs the
// operations (cuda_ops.h) under the model definitions.
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

namespace strata::kernels::gpt2::cuda {

namespace {

// The kernels are op_kernels.cuh's, the CUDA operations' own (cuda_ops.cu): one copy each.
using op_kernels::fill_rows_kernel;
using op_kernels::gelu_forward_kernel;
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

// The per-row buffers of one block's forward for `rows` rows (decoding keeps no attention
// probabilities: its scores have their own, row-grouped buffer).
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
  size_t size_bytes;
};

BlockLayout block_layout(const Config& config, int64_t rows, float* base) {
  const int64_t n = rows;
  const int64_t c = config.n_embd;
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
  return decode_layout_after(block_layout(config, rows, base),
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
