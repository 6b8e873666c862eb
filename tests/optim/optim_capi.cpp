// A tiny C ABI over kernels/optim for the PyTorch reference script (torch_reference.py), which
// loads it with ctypes and compares against torch in-process, chunk by chunk, with no files in
// between. Test-only: the `isa` ints are 0 best, 1 scalar, 2 avx2, 3 avx512 (the 8-bit AdamW's
// loop; the other kernels run avx2 under it); copy dtype 0 none, 1 bf16, 2 fp16.
#include <cstddef>
#include <cstdint>

#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cast.h"

namespace {
using strata::kernels::CpuIsa;
CpuIsa to_isa(int isa) { return static_cast<CpuIsa>(isa); }
strata::DType to_copy_dtype(int copy) {
  return copy == 1 ? strata::DType::bf16 : copy == 2 ? strata::DType::f16 : strata::DType::f32;
}
}  // namespace

extern "C" {

int strata_optim_detected_isa() { return static_cast<int>(strata::kernels::detect_cpu_isa()); }
int strata_optim_has_avx512() { return strata::kernels::cpu_has_avx512() ? 1 : 0; }

void strata_cast_fp32_to_bf16(const float* src, uint16_t* dst, size_t count, int isa) {
  strata::kernels::cast_fp32_to_bf16({src, count}, {dst, count}, to_isa(isa));
}
void strata_cast_bf16_to_fp32(const uint16_t* src, float* dst, size_t count, int isa) {
  strata::kernels::cast_bf16_to_fp32({src, count}, {dst, count}, to_isa(isa));
}
void strata_cast_fp32_to_fp16(const float* src, uint16_t* dst, size_t count, int isa) {
  strata::kernels::cast_fp32_to_fp16({src, count}, {dst, count}, to_isa(isa));
}
void strata_cast_fp16_to_fp32(const uint16_t* src, float* dst, size_t count, int isa) {
  strata::kernels::cast_fp16_to_fp32({src, count}, {dst, count}, to_isa(isa));
}

// grads_dtype: 0 fp32 (`grads` points at floats), 1 bf16 (at uint16_t patterns).
void strata_adamw_step(double lr, double beta1, double beta2, double eps, double weight_decay,
                       int64_t step, float grad_scale, float* params, const void* grads,
                       int grads_dtype, float* exp_avg, float* exp_avg_sq, int copy_dtype,
                       uint16_t* copy, size_t count, int isa) {
  const strata::kernels::AdamWConfig config{lr, beta1, beta2, eps, weight_decay};
  const auto scalars = strata::kernels::adamw_step_scalars(config, step, grad_scale);
  strata::kernels::ComputeCopy out{to_copy_dtype(copy_dtype), {copy, copy == nullptr ? 0 : count}};
  if (grads_dtype == 1) {
    strata::kernels::adamw_step_bf16_grads(scalars, {params, count},
                                           {static_cast<const uint16_t*>(grads), count},
                                           {exp_avg, count}, {exp_avg_sq, count}, out, to_isa(isa));
  } else {
    strata::kernels::adamw_step(scalars, {params, count}, {static_cast<const float*>(grads), count},
                                {exp_avg, count}, {exp_avg_sq, count}, out, to_isa(isa));
  }
}

double strata_sum_squares(const float* values, size_t count, int isa) {
  return strata::kernels::sum_squares(std::span<const float>(values, count), to_isa(isa));
}

float strata_clip_coefficient(double total_norm, double max_norm) {
  return strata::kernels::clip_coefficient(total_norm, max_norm);
}

// The 256 values of bitsandbytes' dynamic map (signed: m's, unsigned: v's) into `out`.
void strata_dynamic_code(int is_signed, float* out) {
  const auto& code = strata::kernels::dynamic_code(is_signed != 0);
  for (size_t i = 0; i < code.size(); ++i) out[i] = code[i];
}

// One 8-bit AdamW step over one chunk (adamw8bit.h); grads_dtype and copy_dtype as above.
void strata_adamw8bit_step(double lr, double beta1, double beta2, double eps, double weight_decay,
                           int64_t step, float grad_scale, float* params, const void* grads,
                           int grads_dtype, uint8_t* exp_avg_codes, uint8_t* exp_avg_sq_codes,
                           float* exp_avg_absmax, float* exp_avg_sq_absmax, size_t block_elements,
                           int copy_dtype, uint16_t* copy, size_t count, int isa) {
  const strata::kernels::AdamWConfig config{lr, beta1, beta2, eps, weight_decay};
  const auto scalars = strata::kernels::adamw_step_scalars(config, step, grad_scale);
  const size_t blocks = strata::kernels::adamw8bit_block_count(count, block_elements);
  const strata::kernels::AdamW8bitState state{{params, count},
                                              {exp_avg_codes, count},
                                              {exp_avg_sq_codes, count},
                                              {exp_avg_absmax, blocks},
                                              {exp_avg_sq_absmax, blocks},
                                              block_elements};
  strata::kernels::ComputeCopy out{to_copy_dtype(copy_dtype), {copy, copy == nullptr ? 0 : count}};
  if (grads_dtype == 1) {
    strata::kernels::adamw8bit_step_bf16_grads(
        scalars, state, {static_cast<const uint16_t*>(grads), count}, out, to_isa(isa));
  } else {
    strata::kernels::adamw8bit_step(scalars, state, {static_cast<const float*>(grads), count}, out,
                                    to_isa(isa));
  }
}

}  // extern "C"
