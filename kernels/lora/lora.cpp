// kernels/lora/lora.cpp — the CPU LoRA op: four or five thin products through cpu_math's
// fixed-tile sgemm, and the dropout mask from lora.h's hash. Row loops write disjoint rows, so
// the results do not depend on how TBB schedules them (lora.h, "Numerics").
#include "kernels/lora/lora.h"

#include <cassert>

#include "kernels/cpu/cpu_math.h"

namespace strata::kernels::lora {

bool keep(uint64_t mask_key, int target, int64_t row, int64_t col, float dropout) {
  return keep_element(row_hash(mask_key, target, row), col, drop_threshold(dropout));
}

// One description of the scratch for the sizing function and every backend's op.
ScratchLayout scratch_layout(int64_t rows, int64_t max_in, int64_t rank, float dropout, float* base) {
  WorkspaceCarver carve(base);
  ScratchLayout layout{};
  layout.u = carve.take(rows * rank);
  for (float*& slot : layout.du) slot = carve.take(rows * rank);
  layout.dropped = dropout > 0.0f ? carve.take(rows * max_in) : nullptr;
  layout.size_bytes = carve.used_bytes();
  return layout;
}

namespace {

using cpu_math::for_rows;
using cpu_math::kRowGrain;
using cpu_math::sgemm;

ScratchLayout checked_layout(const Spec& spec, int64_t rows, int64_t in, const Workspace& scratch) {
  assert(spec.rank > 0 && spec.dropout >= 0.0f && spec.dropout < 1.0f);
  const ScratchLayout layout = scratch_layout(rows, in, spec.rank, spec.dropout, scratch.data);
  assert(scratch.data != nullptr && scratch.size_bytes >= layout.size_bytes);
  assert(reinterpret_cast<uintptr_t>(scratch.data) % 64 == 0);
  return layout;
}

// 1/(1 − p) in fp32: the one factor every kept element is multiplied by.
float inverse_keep(float dropout) { return 1.0f / (1.0f - dropout); }

// dst = drop(x): kept elements × 1/(1 − p), dropped ones 0.
void apply_dropout(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in,
                   float* dst) {
  const uint32_t threshold = drop_threshold(spec.dropout);
  const float factor = inverse_keep(spec.dropout);
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const uint64_t hash = row_hash(mask_key, target, spec.mask_first_row + r);
    const float* x_row = x + r * in;
    float* d_row = dst + r * in;
    for (int64_t j = 0; j < in; ++j) d_row[j] = keep_element(hash, j, threshold) ? x_row[j] * factor : 0.0f;
  });
}

// values[rows, cols] *= factor.
void scale_rows(float* values, int64_t rows, int64_t cols, float factor) {
  for_rows(rows, kRowGrain * 8, [&](int64_t r) {
    float* row = values + r * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] *= factor;
  });
}

// The adapter's input as the products read it: x itself, or drop(x) written to the scratch.
const float* adapter_input(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in,
                           const ScratchLayout& layout) {
  if (spec.dropout == 0.0f) return x;
  apply_dropout(spec, mask_key, target, x, rows, in, layout.dropped);
  return layout.dropped;
}

}  // namespace

size_t scratch_size_bytes(int64_t rows, int64_t max_in, int64_t /*max_out*/, int64_t rank, float dropout) {
  // The output width costs nothing: dy·B and the product into y need no [rows, out] temporary.
  return scratch_layout(rows, max_in, rank, dropout, nullptr).size_bytes;
}

void forward(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in, int64_t out,
             Adapter adapter, float* y, const Workspace& scratch) {
  if (adapter.a == nullptr) return;
  cpu_math::pin_blas_to_one_thread();
  assert(adapter.b != nullptr && x != y);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  const float* input = adapter_input(spec, mask_key, target, x, rows, in, layout);
  sgemm(false, true, rows, rank, in, input, in, adapter.a, in, 0.0f, layout.u, rank);
  scale_rows(layout.u, rows, rank, spec.scale);
  sgemm(false, true, rows, out, rank, layout.u, rank, adapter.b, rank, 1.0f, y, out);
}

void backward_params(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in,
                     int64_t out, Adapter adapter, const float* dy, AdapterGrads grads, const Workspace& scratch,
                     int slot) {
  if (adapter.a == nullptr) return;
  cpu_math::pin_blas_to_one_thread();
  assert(adapter.b != nullptr && grads.d_a != nullptr && grads.d_b != nullptr);
  assert(slot >= 0 && slot < kDuSlots);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  float* du = layout.du[static_cast<size_t>(slot)];
  // The forward's u again (recomputed, not kept: it is [rows, rank], cheaper than its memory).
  const float* input = adapter_input(spec, mask_key, target, x, rows, in, layout);
  sgemm(false, true, rows, rank, in, input, in, adapter.a, in, 0.0f, layout.u, rank);
  scale_rows(layout.u, rows, rank, spec.scale);
  // d_B += dyᵀ · (scale · u)
  sgemm(true, false, out, rank, rows, dy, out, layout.u, rank, 1.0f, grads.d_b, rank);
  // du = scale · dy · B
  sgemm(false, false, rows, rank, out, dy, out, adapter.b, rank, 0.0f, du, rank);
  scale_rows(du, rows, rank, spec.scale);
  // d_A += duᵀ · drop(x)
  sgemm(true, false, rank, in, rows, du, rank, input, in, 1.0f, grads.d_a, in);
}

void backward_input(const Spec& spec, uint64_t mask_key, int target, int64_t rows, int64_t in, Adapter adapter,
                    float* dx, const Workspace& scratch, int slot) {
  if (adapter.a == nullptr) return;
  cpu_math::pin_blas_to_one_thread();
  assert(slot >= 0 && slot < kDuSlots);
  const ScratchLayout layout = checked_layout(spec, rows, in, scratch);
  const int64_t rank = spec.rank;
  const float* du = layout.du[static_cast<size_t>(slot)];
  if (spec.dropout == 0.0f) {
    sgemm(false, false, rows, in, rank, du, rank, adapter.a, in, 1.0f, dx, in);
    return;
  }
  // dx += mask ⊙ (du · A) / (1 − p): the product into the (now dead) dropped-input buffer first.
  sgemm(false, false, rows, in, rank, du, rank, adapter.a, in, 0.0f, layout.dropped, in);
  const uint32_t threshold = drop_threshold(spec.dropout);
  const float factor = inverse_keep(spec.dropout);
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const uint64_t hash = row_hash(mask_key, target, spec.mask_first_row + r);
    const float* g_row = layout.dropped + r * in;
    float* dx_row = dx + r * in;
    for (int64_t j = 0; j < in; ++j)
      if (keep_element(hash, j, threshold)) dx_row[j] += g_row[j] * factor;
  });
}

void backward(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in, int64_t out,
              Adapter adapter, const float* dy, float* dx, AdapterGrads grads, const Workspace& scratch) {
  backward_params(spec, mask_key, target, x, rows, in, out, adapter, dy, grads, scratch, 0);
  backward_input(spec, mask_key, target, rows, in, adapter, dx, scratch, 0);
}

void adapter_forward(const BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in, int64_t out,
                     float* y) {
  if (!targeted(adapters, target)) return;
  forward(adapters->spec, adapters->mask_key, target, x, rows, in, out, adapters->adapters[static_cast<size_t>(target)],
          y, adapters->scratch);
}

void adapter_backward_params(const BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in,
                             int64_t out, const float* dy, int slot) {
  if (!targeted(adapters, target)) return;
  const auto t = static_cast<size_t>(target);
  backward_params(adapters->spec, adapters->mask_key, target, x, rows, in, out, adapters->adapters[t], dy,
                  adapters->grads[t], adapters->scratch, slot);
}

void adapter_backward_input(const BlockAdapters* adapters, int target, int64_t rows, int64_t in, float* dx, int slot) {
  if (!targeted(adapters, target)) return;
  backward_input(adapters->spec, adapters->mask_key, target, rows, in, adapters->adapters[static_cast<size_t>(target)],
                 dx, adapters->scratch, slot);
}

}  // namespace strata::kernels::lora
