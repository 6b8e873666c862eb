// cast.h and adamw.h on CPU: picks the ISA at run time, splits spans into tiles across the
// calling thread's TBB arena, and calls the single-thread loops of cpu_kernels.h per tile.
#include <cassert>
#include <cmath>
#include <cstdint>

#include <cpuid.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include "kernels/optim/adamw.h"
#include "kernels/optim/cast.h"
#include "kernels/optim/cpu_kernels.h"

namespace strata::kernels {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::best: return "best";
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

CpuIsa detect_cpu_isa() {
  // Computed once; __builtin_cpu_supports reads cpuid (and the OS's xsave state for AVX).
  static const CpuIsa detected = [] {
    __builtin_cpu_init();
    // F16C from cpuid leaf 1 directly: clang's __builtin_cpu_supports does not know "f16c"
    // (the fuzz build compiles this with clang).
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    return avx2 ? CpuIsa::avx2 : CpuIsa::scalar;
  }();
  return detected;
}

bool cpu_has_avx512() {
  // __builtin_cpu_supports checks the OS's xsave state (zmm registers enabled) as well.
  static const bool has = [] {
    __builtin_cpu_init();
    return detect_cpu_isa() == CpuIsa::avx2 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
}

CpuIsa resolve_cpu_isa(CpuIsa isa) {
  if (isa == CpuIsa::best) return detect_cpu_isa();
  if (isa == CpuIsa::avx512) {
    assert(cpu_has_avx512() && "CpuIsa::avx512 asked for on a CPU without AVX-512 F/BW/DQ/VL/VBMI");
    return CpuIsa::avx2;  // the kernels of this file have no AVX-512 loop
  }
  assert((isa != CpuIsa::avx2 || detect_cpu_isa() == CpuIsa::avx2) &&
         "CpuIsa::avx2 asked for on a CPU without AVX2/FMA/F16C");
  return isa;
}

namespace {

constexpr size_t kCastTileElements = size_t{1} << 14;

[[maybe_unused]] bool disjoint(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_bytes == 0 || b_bytes == 0 || a_begin + a_bytes <= b_begin || b_begin + b_bytes <= a_begin;
}

// Runs `loop(begin, end)` over [0, count): on the caller when the span is small, otherwise in
// tiles of `tile` elements across the arena. Elements are independent, so any split gives the
// same bits.
template <typename Loop>
void for_tiles(size_t count, size_t tile, size_t parallel_min, const Loop& loop) {
  if (count < parallel_min) {
    if (count > 0) loop(size_t{0}, count);
    return;
  }
  const size_t tile_count = (count + tile - 1) / tile;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tile_count, 1),
                    [&](const tbb::blocked_range<size_t>& tiles) {
                      const size_t begin = tiles.begin() * tile;
                      const size_t end = std::min(count, tiles.end() * tile);
                      loop(begin, end);
                    });
}

template <typename Src, typename Dst>
void cast_span(std::span<const Src> src, std::span<Dst> dst, CpuIsa isa,
               void (*scalar)(const Src*, Dst*, size_t), void (*avx2)(const Src*, Dst*, size_t)) {
  assert(src.size() == dst.size());
  assert(disjoint(src.data(), src.size_bytes(), dst.data(), dst.size_bytes()) &&
         "cast source and destination overlap");
  const auto kernel = resolve_cpu_isa(isa) == CpuIsa::avx2 ? avx2 : scalar;
  for_tiles(src.size(), kCastTileElements, kCastParallelMinElements,
            [&](size_t begin, size_t end) { kernel(src.data() + begin, dst.data() + begin, end - begin); });
}

}  // namespace

void cast_fp32_to_bf16(std::span<const float> src, std::span<uint16_t> dst, CpuIsa isa) {
  cast_span(src, dst, isa, detail::cast_fp32_to_bf16_scalar, detail::cast_fp32_to_bf16_avx2);
}
void cast_bf16_to_fp32(std::span<const uint16_t> src, std::span<float> dst, CpuIsa isa) {
  cast_span(src, dst, isa, detail::cast_bf16_to_fp32_scalar, detail::cast_bf16_to_fp32_avx2);
}
void cast_fp32_to_fp16(std::span<const float> src, std::span<uint16_t> dst, CpuIsa isa) {
  cast_span(src, dst, isa, detail::cast_fp32_to_fp16_scalar, detail::cast_fp32_to_fp16_avx2);
}
void cast_fp16_to_fp32(std::span<const uint16_t> src, std::span<float> dst, CpuIsa isa) {
  cast_span(src, dst, isa, detail::cast_fp16_to_fp32_scalar, detail::cast_fp16_to_fp32_avx2);
}

// --- AdamW ---------------------------------------------------------------------------------------

AdamWStepScalars adamw_step_scalars(const AdamWConfig& config, int64_t step, float grad_scale) {
  assert(step >= 1 && "AdamW steps count from 1, as torch's state['step'] after its increment");
  // Python evaluates these in double (torch 1.13 _single_tensor_adamw); `beta ** step` is C's
  // pow on doubles there too. Each is rounded to fp32 once, where torch's kernels take it.
  const double step_d = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(config.beta1, step_d);
  const double bias_correction2 = 1.0 - std::pow(config.beta2, step_d);
  const double step_size = config.lr / bias_correction1;
  AdamWStepScalars s{};
  s.decay = static_cast<float>(1.0 - config.lr * config.weight_decay);
  s.beta1 = static_cast<float>(config.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
  s.beta2 = static_cast<float>(config.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(config.eps);
  s.neg_step_size = static_cast<float>(-step_size);
  s.grad_scale = grad_scale;
  return s;
}

namespace {

template <typename Grad>
void adamw_span(const AdamWStepScalars& scalars, std::span<float> params, std::span<const Grad> grads,
                std::span<float> exp_avg, std::span<float> exp_avg_sq, ComputeCopy copy, CpuIsa isa,
                void (*scalar)(const AdamWStepScalars&, float*, const Grad*, float*, float*, DType,
                               uint16_t*, size_t),
                void (*avx2)(const AdamWStepScalars&, float*, const Grad*, float*, float*, DType,
                             uint16_t*, size_t)) {
  const size_t count = params.size();
  assert(grads.size() == count && exp_avg.size() == count && exp_avg_sq.size() == count);
  assert(copy.dtype == DType::f32 || copy.bits.size() == count);
  const auto kernel = resolve_cpu_isa(isa) == CpuIsa::avx2 ? avx2 : scalar;
  for_tiles(count, kAdamWTileElements, kAdamWTileElements, [&](size_t begin, size_t end) {
    kernel(scalars, params.data() + begin, grads.data() + begin, exp_avg.data() + begin,
           exp_avg_sq.data() + begin, copy.dtype,
           copy.dtype == DType::f32 ? nullptr : copy.bits.data() + begin, end - begin);
  });
}

}  // namespace

void adamw_step(const AdamWStepScalars& scalars, std::span<float> params,
                std::span<const float> grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, ComputeCopy copy, CpuIsa isa) {
  adamw_span(scalars, params, grads, exp_avg, exp_avg_sq, copy, isa,
             detail::adamw_fp32_grads_scalar, detail::adamw_fp32_grads_avx2);
}

void adamw_step_bf16_grads(const AdamWStepScalars& scalars, std::span<float> params,
                           std::span<const uint16_t> grads_bf16, std::span<float> exp_avg,
                           std::span<float> exp_avg_sq, ComputeCopy copy, CpuIsa isa) {
  adamw_span(scalars, params, grads_bf16, exp_avg, exp_avg_sq, copy, isa,
             detail::adamw_bf16_grads_scalar, detail::adamw_bf16_grads_avx2);
}

// --- sum of squares ------------------------------------------------------------------------------

namespace {

// Fixed blocks from the span's start, combined by TBB's deterministic reduction: its split
// tree depends only on the block count (grain 1), never on which thread ran what.
template <typename Value>
double sum_squares_span(std::span<const Value> values, double (*kernel)(const Value*, size_t)) {
  const size_t block_count = (values.size() + kSumSquaresBlockElements - 1) / kSumSquaresBlockElements;
  if (block_count <= 1) return values.empty() ? 0.0 : kernel(values.data(), values.size());
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<size_t>(0, block_count, 1), 0.0,
      [&](const tbb::blocked_range<size_t>& blocks, double partial) {
        for (size_t block = blocks.begin(); block != blocks.end(); ++block) {
          const size_t begin = block * kSumSquaresBlockElements;
          const size_t end = std::min(values.size(), begin + kSumSquaresBlockElements);
          partial += kernel(values.data() + begin, end - begin);
        }
        return partial;
      },
      [](double left, double right) { return left + right; });
}

}  // namespace

double sum_squares(std::span<const std::span<const float>> spans, CpuIsa isa) {
  const auto kernel = resolve_cpu_isa(isa) == CpuIsa::avx2 ? detail::sum_squares_fp32_avx2
                                                           : detail::sum_squares_fp32_scalar;
  double total = 0.0;
  for (const auto& span : spans) total += sum_squares_span(span, kernel);
  return total;
}

double sum_squares_bf16(std::span<const std::span<const uint16_t>> spans, CpuIsa isa) {
  const auto kernel = resolve_cpu_isa(isa) == CpuIsa::avx2 ? detail::sum_squares_bf16_avx2
                                                           : detail::sum_squares_bf16_scalar;
  double total = 0.0;
  for (const auto& span : spans) total += sum_squares_span(span, kernel);
  return total;
}

double sum_squares(std::span<const float> values, CpuIsa isa) {
  return sum_squares(std::span<const std::span<const float>>(&values, 1), isa);
}

float clip_coefficient(double total_norm, double max_norm) {
  // torch 1.13: clip_coef = max_norm / (total_norm + 1e-6) on an fp32 tensor, which Python
  // evaluates as total.reciprocal() * max_norm; then clamp(max=1.0).
  const float denom = static_cast<float>(total_norm) + static_cast<float>(1e-6);
  const float coefficient = (1.0f / denom) * static_cast<float>(max_norm);
  return coefficient < 1.0f ? coefficient : 1.0f;
}

}  // namespace strata::kernels
