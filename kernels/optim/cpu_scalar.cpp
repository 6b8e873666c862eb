// The portable single-thread loops: the reference the AVX2 path must match bit for bit, and
// the path taken on CPUs without AVX2/FMA/F16C. Built with -ffp-contract=off (see meson.build)
// so the compiler never fuses a multiply and an add that torch keeps apart.
#include "kernels/optim/cpu_kernels.h"

namespace strata::kernels::detail {

void cast_fp32_to_bf16_scalar(const float* src, uint16_t* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = fp32_to_bf16_bits(src[i]);
}
void cast_bf16_to_fp32_scalar(const uint16_t* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bf16_bits_to_fp32(src[i]);
}
void cast_fp32_to_fp16_scalar(const float* src, uint16_t* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = fp32_to_fp16_bits(src[i]);
}
void cast_fp16_to_fp32_scalar(const uint16_t* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = fp16_bits_to_fp32(src[i]);
}

namespace {

inline float widen(float grad) { return grad; }
inline float widen(uint16_t grad_bf16) { return bf16_bits_to_fp32(grad_bf16); }

template <typename Grad>
void adamw_loop(const AdamWStepScalars& s, float* params, const Grad* grads, float* exp_avg,
                float* exp_avg_sq, DType copy_dtype, uint16_t* copy, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    adamw_element(s, widen(grads[i]), params[i], exp_avg[i], exp_avg_sq[i]);
    if (copy_dtype == DType::bf16) {
      copy[i] = fp32_to_bf16_bits(params[i]);
    } else if (copy_dtype == DType::f16) {
      copy[i] = fp32_to_fp16_bits(params[i]);
    }
  }
}

template <typename Value>
double sum_squares_loop(const Value* values, size_t count) {
  double lanes[kSumSquaresLanes] = {};
  for (size_t i = 0; i < count; ++i) {
    const double x = widen(values[i]);
    lanes[i % kSumSquaresLanes] += x * x;  // the square of a float is exact in double
  }
  return combine_sum_squares_lanes(lanes);
}

}  // namespace

void adamw_fp32_grads_scalar(const AdamWStepScalars& s, float* params, const float* grads,
                             float* exp_avg, float* exp_avg_sq, DType copy_dtype, uint16_t* copy,
                             size_t count) {
  adamw_loop(s, params, grads, exp_avg, exp_avg_sq, copy_dtype, copy, count);
}
void adamw_bf16_grads_scalar(const AdamWStepScalars& s, float* params, const uint16_t* grads,
                             float* exp_avg, float* exp_avg_sq, DType copy_dtype, uint16_t* copy,
                             size_t count) {
  adamw_loop(s, params, grads, exp_avg, exp_avg_sq, copy_dtype, copy, count);
}
double sum_squares_fp32_scalar(const float* values, size_t count) {
  return sum_squares_loop(values, count);
}
double sum_squares_bf16_scalar(const uint16_t* values, size_t count) {
  return sum_squares_loop(values, count);
}

}  // namespace strata::kernels::detail
