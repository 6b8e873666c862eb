// The CUDA twin of adamw8bit.h (declared in optim_cuda.h): one thread block per quantisation
// block. The element math is adamw8bit_element.h's, the code search bitsandbytes' seven
// probes over the table in shared memory (the CPU's bucket lookup returns the same code for
// every input: tests/optim/test_adamw8bit.cpp), and the block max is exact, so the GPU gives
// the CPU's params, codes and absmax bit for bit (tests/optim/test_optim_cuda.cpp).
#include <cmath>
#include <string>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/adamw8bit_element.h"
#include "kernels/optim/optim_cuda.h"

namespace strata::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxGridBlocks = 8192;  // a grid-stride loop covers larger chunks

// The two code tables by value (2 KiB of kernel parameters, under CUDA's 4 KiB limit).
struct CodeValues {
  float exp_avg[256];
  float exp_avg_sq[256];
};

Status launch_status(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::ok_status();
  return make_error(ErrorKind::internal,
                    std::string("CUDA launch of ") + what + " failed: " + cudaGetErrorString(error));
}

__device__ inline float widen(float grad) { return grad; }
__device__ inline float widen(uint16_t grad_bf16) { return detail::bf16_bits_to_fp32(grad_bf16); }

// midpoints[k] between values[k-1] and values[k], -inf and +inf at the ends, as the CPU builds them.
__device__ void load_table(const float* values, float* shared_values, float* shared_midpoints) {
  for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) shared_values[k] = values[k];
  __syncthreads();
  for (unsigned k = threadIdx.x; k < 257; k += blockDim.x) {
    shared_midpoints[k] = k == 0     ? -INFINITY
                          : k == 256 ? INFINITY
                                     : __fmul_rn(__fadd_rn(shared_values[k - 1], shared_values[k]), 0.5f);
  }
}

template <typename Grad>
__global__ void __launch_bounds__(kThreads) adamw8bit_kernel(
    detail::AdamWStepScalars scalars, const float* __restrict__ device_grad_scale, float* __restrict__ params,
    const Grad* __restrict__ grads, uint8_t* __restrict__ m_codes, uint8_t* __restrict__ v_codes,
    float* __restrict__ m_absmax, float* __restrict__ v_absmax, size_t count, unsigned block_elements,
    DType copy_dtype, uint16_t* __restrict__ copy, CodeValues tables) {
  __shared__ float m_values[256], v_values[256], m_mid[257], v_mid[257];
  __shared__ float fresh_m[kAdamW8bitMaxBlockElements], fresh_v[kAdamW8bitMaxBlockElements];
  __shared__ float m_partial[kThreads], v_partial[kThreads];
  if (device_grad_scale != nullptr) scalars.grad_scale = *device_grad_scale;
  load_table(tables.exp_avg, m_values, m_mid);
  load_table(tables.exp_avg_sq, v_values, v_mid);
  __syncthreads();
  const size_t block_count = (count + block_elements - 1) / block_elements;
  for (size_t block = blockIdx.x; block < block_count; block += gridDim.x) {
    const size_t begin = block * block_elements;
    const unsigned n = static_cast<unsigned>(count - begin < block_elements ? count - begin : block_elements);
    const float m_scale = m_absmax[block], v_scale = v_absmax[block];
    float m_max = 0.0f, v_max = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
      const size_t e = begin + i;
      float p = params[e];
      float m = __fmul_rn(m_values[m_codes[e]], m_scale);
      float v = __fmul_rn(v_values[v_codes[e]], v_scale);
      detail::adamw8bit_element(scalars, widen(grads[e]), p, m, v);
      params[e] = p;
      if (copy_dtype == DType::bf16) {
        copy[e] = detail::fp32_to_bf16_bits(p);
      } else if (copy_dtype == DType::f16) {
        copy[e] = detail::fp32_to_fp16_bits(p);
      }
      fresh_m[i] = m;
      fresh_v[i] = v;
      // The CPU's rule, `a > max ? a : max` from 0: a NaN never enters the max.
      const float m_abs = fabsf(m), v_abs = fabsf(v);
      m_max = m_abs > m_max ? m_abs : m_max;
      v_max = v_abs > v_max ? v_abs : v_max;
    }
    m_partial[threadIdx.x] = m_max;
    v_partial[threadIdx.x] = v_max;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {  // max is exact in any order
      if (threadIdx.x < half) {
        const float m_other = m_partial[threadIdx.x + half], v_other = v_partial[threadIdx.x + half];
        m_partial[threadIdx.x] = m_other > m_partial[threadIdx.x] ? m_other : m_partial[threadIdx.x];
        v_partial[threadIdx.x] = v_other > v_partial[threadIdx.x] ? v_other : v_partial[threadIdx.x];
      }
      __syncthreads();
    }
    const float m_block_max = m_partial[0], v_block_max = v_partial[0];
    const float m_inverse = detail::inverse_absmax(m_block_max), v_inverse = detail::inverse_absmax(v_block_max);
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
      const float m = fresh_m[i], v = fresh_v[i];
      const uint32_t m_code = detail::nearest_code(m_values, m_mid, __fmul_rn(m, m_inverse));
      m_codes[begin + i] = static_cast<uint8_t>(detail::keep_sign(m_code, m));
      v_codes[begin + i] = static_cast<uint8_t>(detail::nearest_code(v_values, v_mid, __fmul_rn(v, v_inverse)));
    }
    if (threadIdx.x == 0) {
      m_absmax[block] = m_block_max;
      v_absmax[block] = v_block_max;
    }
    __syncthreads();  // the next block reuses fresh_* and the partials
  }
}

CodeValues code_values() {
  CodeValues tables{};
  const auto& m = dynamic_code(true);
  const auto& v = dynamic_code(false);
  for (size_t k = 0; k < 256; ++k) {
    tables.exp_avg[k] = m[k];
    tables.exp_avg_sq[k] = v[k];
  }
  return tables;
}

template <typename Grad>
Status launch(const AdamWStepScalars& scalars, const float* device_grad_scale, float* params, const Grad* grads,
              uint8_t* exp_avg_codes, uint8_t* exp_avg_sq_codes, float* exp_avg_absmax, float* exp_avg_sq_absmax,
              size_t count, size_t block_elements, DType copy_dtype, uint16_t* copy, cudaStream_t stream,
              const char* what) {
  if (count == 0) return Status::ok_status();
  if (block_elements == 0 || block_elements > kAdamW8bitMaxBlockElements) {
    return make_error(ErrorKind::invalid_argument,
                      "adamw8bit: block_elements must be 1.." + std::to_string(kAdamW8bitMaxBlockElements));
  }
  static const CodeValues tables = code_values();
  const size_t blocks = adamw8bit_block_count(count, block_elements);
  const unsigned grid = static_cast<unsigned>(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
  adamw8bit_kernel<<<grid, kThreads, 0, stream>>>(scalars, device_grad_scale, params, grads, exp_avg_codes,
                                                  exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax, count,
                                                  static_cast<unsigned>(block_elements), copy_dtype, copy, tables);
  return launch_status(what);
}

}  // namespace

Status adamw8bit_step(const AdamWStepScalars& scalars, const float* device_grad_scale, float* params,
                      const float* grads, uint8_t* exp_avg_codes, uint8_t* exp_avg_sq_codes, float* exp_avg_absmax,
                      float* exp_avg_sq_absmax, size_t count, size_t block_elements, DType copy_dtype,
                      uint16_t* copy, cudaStream_t stream) {
  return launch(scalars, device_grad_scale, params, grads, exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax,
                exp_avg_sq_absmax, count, block_elements, copy_dtype, copy, stream, "adamw8bit_kernel");
}

Status adamw8bit_step_bf16_grads(const AdamWStepScalars& scalars, const float* device_grad_scale, float* params,
                                 const uint16_t* grads_bf16, uint8_t* exp_avg_codes, uint8_t* exp_avg_sq_codes,
                                 float* exp_avg_absmax, float* exp_avg_sq_absmax, size_t count, size_t block_elements,
                                 DType copy_dtype, uint16_t* copy, cudaStream_t stream) {
  return launch(scalars, device_grad_scale, params, grads_bf16, exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax,
                exp_avg_sq_absmax, count, block_elements, copy_dtype, copy, stream,
                "adamw8bit_kernel (bf16 grads)");
}

}  // namespace strata::kernels::cuda
