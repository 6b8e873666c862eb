// strata/kernels/optim/adamw.h — AdamW on CPU with PyTorch's semantics, fused with the emission
// of the bf16/fp16 compute copy, plus the deterministic gradient sum of squares for clipping.
//
// Contract:
//   * Semantics: exactly torch.optim.AdamW (torch 1.13, amsgrad=False, maximize=False): at step
//     t (1-based) p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//     p += (-lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps), in torch's operation order and
//     rounding (elementwise.h), so the fp32 results equal torch's bit for bit on x86.
//   * State: the caller owns every buffer. Master params, exp_avg (m) and exp_avg_sq (v) are
//     fp32 and updated in place; moments start at zero at step 1 as in torch. Gradients are
//     read only, fp32 or bf16, and multiplied by `grad_scale` before use (1/loss_scale, a clip
//     coefficient, or their product; 1 is exact). The compute copy, when asked for, receives
//     the updated params rounded exactly like cast.h in the same pass.
//   * Shapes: all spans of one call have the same length (asserted); any length, no alignment
//     needed. Buffers of one call must not overlap each other.
//   * Threads: a call splits its range into tiles of kAdamWTileElements across the calling
//     thread's TBB arena (bound it with tbb::task_arena). Results never depend on the thread
//     count or on the ISA: each element's math is independent and the scalar and AVX2 paths
//     give identical bits. Calls on disjoint tensors may run concurrently from several threads.
//   * Sum of squares: computed in double over fixed blocks of kSumSquaresBlockElements, the
//     blocks combined by a fixed tree (tbb::parallel_deterministic_reduce), so the bits depend
//     only on the data and the span boundaries — never on the thread count or the ISA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "kernels/optim/cast.h"
#include "kernels/optim/elementwise.h"

namespace strata::kernels {

// Hyper-parameters as torch takes them (Python floats, i.e. double).
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

using detail::AdamWStepScalars;

// The fp32 constants of step `step` (1-based, the value torch's state['step'] has after its
// increment), computed in double as torch does and rounded to fp32 once. `grad_scale` is
// stored as given.
AdamWStepScalars adamw_step_scalars(const AdamWConfig& config, int64_t step,
                                    float grad_scale = 1.0f);

// Where the step writes the compute copy of the updated params: dtype bf16 or fp16 and one
// 16-bit pattern per param; dtype f32 (the default) means no copy.
struct ComputeCopy {
  DType dtype = DType::f32;
  std::span<uint16_t> bits;
};

// Tiles handed to one TBB task: 16 Ki elements is 64 KiB of each fp32 array, so a task's
// p, g, m, v and copy stay in L2 between the read and the write, and 200M params make ~12k
// tasks — enough to balance two cores, few enough that scheduling costs nothing.
inline constexpr size_t kAdamWTileElements = size_t{1} << 14;

// One AdamW step over one tensor (or any flat range of one). fp32 gradients.
void adamw_step(const AdamWStepScalars& scalars, std::span<float> params,
                std::span<const float> grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, ComputeCopy copy = {},
                CpuIsa isa = CpuIsa::best);
// The same with bf16 gradients (raw bits), widened exactly to fp32 before scaling.
void adamw_step_bf16_grads(const AdamWStepScalars& scalars, std::span<float> params,
                           std::span<const uint16_t> grads_bf16, std::span<float> exp_avg,
                           std::span<float> exp_avg_sq, ComputeCopy copy = {},
                           CpuIsa isa = CpuIsa::best);

// --- gradient norm for clipping -----------------------------------------------------------------
inline constexpr size_t kSumSquaresBlockElements = size_t{1} << 14;

// Σ x² over all spans, in double (each square is exact in double; the adds round in double).
// Spans are summed one after another in the order given; pass a layer's tensors in a fixed
// order and add the per-layer results in a fixed order to get a deterministic global norm.
double sum_squares(std::span<const std::span<const float>> spans, CpuIsa isa = CpuIsa::best);
double sum_squares_bf16(std::span<const std::span<const uint16_t>> spans,
                        CpuIsa isa = CpuIsa::best);
double sum_squares(std::span<const float> values, CpuIsa isa = CpuIsa::best);

// torch.nn.utils.clip_grad_norm_'s factor for a total L2 norm (sqrt of the sum of squares):
// min(1, max_norm / (total_norm + 1e-6)), evaluated in fp32 as torch evaluates it. Pass the
// result as `grad_scale` (times 1/loss_scale if the loss is scaled) to the step.
float clip_coefficient(double total_norm, double max_norm);

}  // namespace strata::kernels
