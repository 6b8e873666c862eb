// strata/kernels/lora/lora.h — the LoRA op: a low-rank adapter added to one linear of a frozen
// (or trained) base, forward and backward, on the CPU; the CPU backend's lora ops (backend.h)
// run it for each targeted linear a model composes, and the CUDA twins run the same math with
// cuBLAS (lora_cuda.h).
//
// Contract
// - Math: PEFT's LoRA on a linear y = x·Wᵀ (+ b) — or a Conv1D y = x·W (+ b), which is the
//   same map with W stored transposed:
//       y += scale · (drop(x) · Aᵀ) · Bᵀ
//   A [rank, in] and B [out, rank], fp32 row-major: PEFT's lora_A.weight / lora_B.weight as they
//   are, for Conv1D targets too (PEFT keeps A and B in nn.Linear's layout there). `scale` is the
//   caller's α/r (or α/√r with rsLoRA): the op never derives it.
// - Dropout: PEFT's nn.Dropout on the adapter's input only (the base linear sees x). Inverted:
//   an element is kept with probability 1 − p and then multiplied by 1/(1 − p) (that factor
//   computed once in fp32); a dropped element is 0. p == 0 builds no mask
//   at all — bit for bit the op without dropout. The mask is not random state: `keep` derives it
//   from (mask_key, target, row, col) with integer arithmetic alone (a SplitMix64 chain, below),
//   so a forward, the backward's recompute of it, the CPU and CUDA all draw the same mask, and a
//   test can rebuild it in Python; `row` is Spec::mask_first_row + the call's row. The caller
//   picks mask_key per (step, block) and mask_first_row as the call's place in the update's batch.
// - Gradients: d_A and d_B are ACCUMULATED (+=), as every weight gradient (ops.h); the input
//   gradient is added into dx (the base linear's own dx is the caller's, written first or after:
//   see backward_params / backward_input). With u = drop(x)·Aᵀ:
//       d_B += scale · dyᵀ · u;  du = scale · dy · B;  d_A += duᵀ · drop(x);
//       dx  += mask ⊙ (du · A) / (1 − p)
// - Numerics: fp32 storage and products through cpu_math::sgemm (fixed tiles), so every result
//   is bit-identical run after run whatever the thread count. `scale` is applied to u (forward)
//   and to dy·B (backward), the [rows, rank] factors, not to the [rows, out] product: PEFT scales
//   the product; the two agree to fp32 rounding (tests/lora: within 1e-5 of float64 PyTorch).
// - Memory: every pointer is host memory of the caller's (row-major fp32). The op allocates
//   nothing: `scratch` (64-byte aligned, at least scratch_size_bytes for the call's rows, the
//   block's widest input and its rank) holds u, the du of up to kDuSlots targets at once and,
//   with dropout, the dropped input. The op reads x, A and B and writes only y / dx, the
//   gradients and scratch; x and y (dx) must not overlap.
// - Threads: as every CPU op (backend.h: the calling thread fans out to TBB); calls sharing a scratch must not
//   run concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <cmath>
#include <cstdint>

#include "common/mix.h"
#include "kernels/ops.h"  // Workspace

#ifdef __CUDACC__
#define STRATA_LORA_HOST_DEVICE __host__ __device__
#else
#define STRATA_LORA_HOST_DEVICE
#endif

namespace strata::kernels::lora {

using kernels::Workspace;

// One adapter configuration for every target of a model (PEFT's r, lora_alpha → scale, lora_dropout).
struct Spec {
  int64_t rank = 0;
  float scale = 0.0f;
  float dropout = 0.0f;  // p in [0, 1)
  // The dropout mask's row of this call's row 0: a call's rows are rows mask_first_row … of the
  // whole update's batch (every micro-batch, every rank), so the mask an input row gets does not
  // depend on how gradient accumulation or ZeRO split the batch (K × b rows = one batch of K·b,
  // N ranks = one process). 0 for a caller that is the whole batch.
  int64_t mask_first_row = 0;
};
// One target's tensors: A [rank, in], B [out, rank]. Null `a`: this linear is not targeted.
struct Adapter {
  const float* a = nullptr;
  const float* b = nullptr;
};
// Their gradients, ACCUMULATED (+=); same shapes.
struct AdapterGrads {
  float* d_a = nullptr;
  float* d_b = nullptr;
};

inline constexpr int kMaxTargets = 8;

// A block's adapters, indexed by the model's linear index (each model's shape in models/ names
// its targets' indices: its lora_target namespace). Memory of the backend the block op runs on
// (host on the CPU backend, device on CUDA).
struct BlockAdapters {
  Spec spec;
  uint64_t mask_key = 0;  // dropout key of this (step, block): a forward and the backward's
                          // recompute pass the same key (and spec) and get the same mask
  std::array<Adapter, kMaxTargets> adapters{};
  std::array<AdapterGrads, kMaxTargets> grads{};  // backward only
  Workspace scratch;  // the backend's memory, >= scratch_size_bytes(...) for the block
};

// --- The dropout mask (shared, bit for bit, by the CPU and CUDA) ---
// SplitMix64 (common/mix.h, host and device) keys every draw.
// The hash of one row of one target: splitmix64(splitmix64(splitmix64(mask_key) + target) + row).
// The key is mixed before the target joins it, so keys that differ by one (a caller numbering
// blocks base + i) draw unrelated masks for every target. A row's elements then cost one
// splitmix64 each: splitmix64(row_hash + col).
STRATA_LORA_HOST_DEVICE inline uint64_t row_hash(uint64_t mask_key, int target, int64_t row) {
  return splitmix64(splitmix64(splitmix64(mask_key) + static_cast<uint64_t>(target)) + static_cast<uint64_t>(row));
}
// An element is dropped when the top 24 bits of its hash, read as k / 2²⁴, fall below p:
// k < ceil(p · 2²⁴) (p as fp32, widened exactly). So p = 0 drops nothing.
STRATA_LORA_HOST_DEVICE inline uint32_t drop_threshold(float dropout) {
  return static_cast<uint32_t>(::ceil(static_cast<double>(dropout) * 16777216.0));
}
STRATA_LORA_HOST_DEVICE inline bool keep_element(uint64_t row_hash_value, int64_t col, uint32_t threshold) {
  return static_cast<uint32_t>(splitmix64(row_hash_value + static_cast<uint64_t>(col)) >> 40) >= threshold;
}
// Whether element (row, col) of target `target`'s input is kept (the functions above together).
bool keep(uint64_t mask_key, int target, int64_t row, int64_t col, float dropout);

// --- Scratch ---
// du of this many targets can be alive at once: a block's q, k and v projections may share one
// input, whose buffer the base backward overwrites with dx, so all three adapters' d_A / d_B are formed
// before any of their dx (backward_params, then backward_input per target).
inline constexpr int kDuSlots = 3;
// Bytes of scratch for `rows` rows, the widest input / output of the block's targets and `rank`
// (what BlockAdapters::scratch must hold, on every backend).
size_t scratch_size_bytes(int64_t rows, int64_t max_in, int64_t max_out, int64_t rank, float dropout);
// Its pieces, carved the same way by the sizing function and every backend's op (64-byte
// aligned slices from `base`; null base: sizes only).
struct ScratchLayout {
  float* u;                          // [rows, rank]: scale · drop(x)·Aᵀ
  std::array<float*, kDuSlots> du;   // [rows, rank] each: scale · dy·B
  float* dropped;                    // [rows, max_in], dropout only: drop(x), then du·A before the mask
  size_t size_bytes;
};
ScratchLayout scratch_layout(int64_t rows, int64_t max_in, int64_t rank, float dropout, float* base);

// --- The CPU op (the CPU backend's lora ops call it for each targeted linear) ---
// y[rows, out] += scale · drop(x) · Aᵀ · Bᵀ. Nothing when adapter.a is null.
void forward(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in, int64_t out,
             Adapter adapter, float* y /* accumulated into */, const Workspace& scratch);
// The whole backward of one target: backward_params then backward_input (slot 0).
void backward(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in, int64_t out,
              Adapter adapter, const float* dy, float* dx /* accumulated into */, AdapterGrads grads,
              const Workspace& scratch);
// The backward in two halves, for kernels whose base backward writes dx over x's buffer: the
// first reads x and dy, accumulates d_A and d_B and leaves du in du slot `slot`; the second
// reads only that du, A and the mask (no x), and adds the adapter's share into dx. Another
// target's backward_params may run between them on another slot.
void backward_params(const Spec& spec, uint64_t mask_key, int target, const float* x, int64_t rows, int64_t in,
                     int64_t out, Adapter adapter, const float* dy, AdapterGrads grads, const Workspace& scratch,
                     int slot);
void backward_input(const Spec& spec, uint64_t mask_key, int target, int64_t rows, int64_t in, Adapter adapter,
                    float* dx, const Workspace& scratch, int slot);

// The adapter of `target` in `adapters` (null `adapters`: none), for the call sites below.
inline bool targeted(const BlockAdapters* adapters, int target) {
  return adapters != nullptr && adapters->adapters[static_cast<size_t>(target)].a != nullptr;
}

// A block's call sites (the CPU backend's lora ops, backend.h): the op of `target` with the
// block's spec, key and scratch — nothing when `adapters` is null or does not target it. The
// backward in its two halves around the base's dx product, which may overwrite x's buffer;
// targets that share an input (q, k, v; gate, up) keep their du in slots 0, 1, 2.
void adapter_forward(const BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in, int64_t out,
                     float* y);
void adapter_backward_params(const BlockAdapters* adapters, int target, const float* x, int64_t rows, int64_t in,
                             int64_t out, const float* dy, int slot = 0);
void adapter_backward_input(const BlockAdapters* adapters, int target, int64_t rows, int64_t in, float* dx,
                            int slot = 0);

}  // namespace strata::kernels::lora
