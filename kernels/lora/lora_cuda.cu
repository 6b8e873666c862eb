// kernels/lora/lora_cuda.cu — the CUDA LoRA op: cuBLAS products on the stream and two small
// element-wise kernels that apply lora.h's dropout mask (to the input, and to the input's
// gradient share). Mirrors lora.cpp step for step.
#include "kernels/lora/lora_cuda.h"

#include <cassert>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"

namespace strata::kernels::lora::cuda {

namespace {

using kernels::cuda::blocks_for;
using kernels::cuda::check_launch;
using kernels::cuda::gemm_scaled;
using kernels::cuda::kThreads;

// dst[r, j] = keep(r, j) ? x[r, j] · factor : 0 — one thread per element; the hash is lora.h's.
__global__ void dropout_kernel(const float* x, int64_t rows, int64_t in, uint64_t mask_key, int target,
                               int64_t first_row, uint32_t threshold, float factor, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * in) return;
  const int64_t r = i / in;
  const int64_t j = i % in;
  dst[i] = keep_element(row_hash(mask_key, target, first_row + r), j, threshold) ? x[i] * factor : 0.0f;
}

// dx[r, j] += keep(r, j) ? g[r, j] · factor : 0.
__global__ void masked_accumulate_kernel(const float* g, int64_t rows, int64_t in, uint64_t mask_key, int target,
                                         int64_t first_row, uint32_t threshold, float factor, float* dx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * in) return;
  const int64_t r = i / in;
  const int64_t j = i % in;
  if (keep_element(row_hash(mask_key, target, first_row + r), j, threshold)) dx[i] += g[i] * factor;
}

ScratchLayout checked_layout(const Spec& spec, int64_t rows, int64_t in, const Workspace& scratch) {
  assert(spec.rank > 0 && spec.dropout >= 0.0f && spec.dropout < 1.0f);
  const ScratchLayout layout = scratch_layout(rows, in, spec.rank, spec.dropout, scratch.data);
  assert(scratch.data != nullptr && scratch.size_bytes >= layout.size_bytes);
  (void)scratch;
  return layout;
}

float inverse_keep(float dropout) { return 1.0f / (1.0f - dropout); }

// The adapter's input as the products read it: x, or drop(x) in the scratch.
Result<const float*> adapter_input(const Context& ctx, const Spec& spec, uint64_t mask_key, int target,
                                   const float* x, int64_t rows, int64_t in, const ScratchLayout& layout) {
  if (spec.dropout == 0.0f) return x;
  dropout_kernel<<<blocks_for(rows * in), kThreads, 0, ctx.stream()>>>(
      x, rows, in, mask_key, target, spec.mask_first_row, drop_threshold(spec.dropout), inverse_keep(spec.dropout),
      layout.dropped);
  STRATA_RETURN_IF_ERROR(check_launch("lora dropout_kernel"));
  return static_cast<const float*>(layout.dropped);
}

}  // namespace

Status forward(const Context& ctx, const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows,
               int64_t in, int64_t out, Adapter adapter, float* y, const Workspace& scratch) {
  if (adapter.a == nullptr) return Status();
  assert(adapter.b != nullptr && x != y);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  STRATA_ASSIGN_OR_RETURN(const float* input, adapter_input(ctx, spec, mask_key, target, x, rows, in, layout));
  // u = scale · drop(x)·Aᵀ; y += u·Bᵀ
  STRATA_RETURN_IF_ERROR(
      gemm_scaled(ctx, false, true, rows, rank, in, spec.scale, input, in, adapter.a, in, 0.0f, layout.u, rank));
  return gemm_scaled(ctx, false, true, rows, out, rank, 1.0f, layout.u, rank, adapter.b, rank, 1.0f, y, out);
}

Status backward_params(const Context& ctx, const Spec& spec, uint64_t mask_key, int target, const float* x,
                       int64_t rows, int64_t in, int64_t out, Adapter adapter, const float* dy, AdapterGrads grads,
                       const Workspace& scratch, int slot) {
  if (adapter.a == nullptr) return Status();
  assert(adapter.b != nullptr && grads.d_a != nullptr && grads.d_b != nullptr);
  assert(slot >= 0 && slot < kDuSlots);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  float* du = layout.du[static_cast<size_t>(slot)];
  STRATA_ASSIGN_OR_RETURN(const float* input, adapter_input(ctx, spec, mask_key, target, x, rows, in, layout));
  STRATA_RETURN_IF_ERROR(
      gemm_scaled(ctx, false, true, rows, rank, in, spec.scale, input, in, adapter.a, in, 0.0f, layout.u, rank));
  // d_B += dyᵀ·u;  du = scale · dy·B;  d_A += duᵀ·drop(x)
  STRATA_RETURN_IF_ERROR(
      gemm_scaled(ctx, true, false, out, rank, rows, 1.0f, dy, out, layout.u, rank, 1.0f, grads.d_b, rank));
  STRATA_RETURN_IF_ERROR(
      gemm_scaled(ctx, false, false, rows, rank, out, spec.scale, dy, out, adapter.b, rank, 0.0f, du, rank));
  return gemm_scaled(ctx, true, false, rank, in, rows, 1.0f, du, rank, input, in, 1.0f, grads.d_a, in);
}

Status backward_input(const Context& ctx, const Spec& spec, uint64_t mask_key, int target, int64_t rows, int64_t in,
                      Adapter adapter, float* dx, const Workspace& scratch, int slot) {
  if (adapter.a == nullptr) return Status();
  assert(slot >= 0 && slot < kDuSlots);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  const float* du = layout.du[static_cast<size_t>(slot)];
  if (spec.dropout == 0.0f)
    return gemm_scaled(ctx, false, false, rows, in, rank, 1.0f, du, rank, adapter.a, in, 1.0f, dx, in);
  STRATA_RETURN_IF_ERROR(
      gemm_scaled(ctx, false, false, rows, in, rank, 1.0f, du, rank, adapter.a, in, 0.0f, layout.dropped, in));
  masked_accumulate_kernel<<<blocks_for(rows * in), kThreads, 0, ctx.stream()>>>(
      layout.dropped, rows, in, mask_key, target, spec.mask_first_row, drop_threshold(spec.dropout),
      inverse_keep(spec.dropout), dx);
  return check_launch("lora masked_accumulate_kernel");
}

Status adapter_forward(const Context& ctx, const BlockAdapters* adapters, int target, const float* x, int64_t rows,
                       int64_t in, int64_t out, float* y) {
  if (!targeted(adapters, target)) return Status();
  return forward(ctx, adapters->spec, adapters->mask_key, target, x, rows, in, out,
                 adapters->adapters[static_cast<size_t>(target)], y, adapters->scratch);
}

Status adapter_backward_params(const Context& ctx, const BlockAdapters* adapters, int target, const float* x,
                               int64_t rows, int64_t in, int64_t out, const float* dy, int slot) {
  if (!targeted(adapters, target)) return Status();
  const auto t = static_cast<size_t>(target);
  return backward_params(ctx, adapters->spec, adapters->mask_key, target, x, rows, in, out, adapters->adapters[t], dy,
                         adapters->grads[t], adapters->scratch, slot);
}

Status adapter_backward_input(const Context& ctx, const BlockAdapters* adapters, int target, int64_t rows, int64_t in,
                              float* dx, int slot) {
  if (!targeted(adapters, target)) return Status();
  return backward_input(ctx, adapters->spec, adapters->mask_key, target, rows, in,
                        adapters->adapters[static_cast<size_t>(target)], dx, adapters->scratch, slot);
}

}  // namespace strata::kernels::lora::cuda
