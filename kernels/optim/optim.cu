// The CUDA twins of kernels/optim (optim_cuda.h): one fused AdamW kernel writing the compute
// copy, the four casts, and a deterministic sum of squares. The per-element math is
// elementwise.h's, shared with the CPU, so both give the same bits.
#include <string>

#include "kernels/optim/optim_cuda.h"

namespace strata::kernels::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; a grid-stride loop covers the rest,
// so the grid never needs more than this whatever the count.
constexpr size_t kMaxBlocks = 8192;

unsigned blocks_for(size_t count) {
  const size_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

Status launch_status(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::ok_status();
  return make_error(ErrorKind::internal,
                    std::string("CUDA launch of ") + what + " failed: " + cudaGetErrorString(error));
}

__device__ inline float widen(float grad) { return grad; }
__device__ inline float widen(uint16_t grad_bf16) { return detail::bf16_bits_to_fp32(grad_bf16); }

template <typename Grad>
__global__ void adamw_kernel(AdamWStepScalars scalars, float* __restrict__ params,
                             const Grad* __restrict__ grads, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, size_t count, DType copy_dtype,
                             uint16_t* __restrict__ copy, const float* __restrict__ grad_scale) {
  if (grad_scale != nullptr) scalars.grad_scale = *grad_scale;  // left on the stream by clip_coefficient
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    detail::adamw_element(scalars, widen(grads[i]), p, m, v);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (copy_dtype == DType::bf16) {
      copy[i] = detail::fp32_to_bf16_bits(p);
    } else if (copy_dtype == DType::f16) {
      copy[i] = detail::fp32_to_fp16_bits(p);
    }
  }
}

// adamw.h's clip_coefficient(sqrt(sum), max_norm), operation for operation: the norm in double,
// then fp32 as torch evaluates it (reciprocal of norm + 1e-6, times max_norm, clamped at 1).
__global__ void clip_coefficient_kernel(const double* sum_squares, double max_norm, float* coefficient) {
  const double total_norm = __dsqrt_rn(*sum_squares);
  const float denom = __fadd_rn(__double2float_rn(total_norm), __double2float_rn(1e-6));
  const float value = __fmul_rn(__fdiv_rn(1.0f, denom), __double2float_rn(max_norm));
  *coefficient = value < 1.0f ? value : 1.0f;
}

// Casts: one functor per direction keeps the four launches one template.
struct ToBf16 {
  __device__ uint16_t operator()(float x) const { return detail::fp32_to_bf16_bits(x); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t x) const { return detail::bf16_bits_to_fp32(x); }
};
struct ToFp16 {
  __device__ uint16_t operator()(float x) const { return detail::fp32_to_fp16_bits(x); }
};
struct FromFp16 {
  __device__ float operator()(uint16_t x) const { return detail::fp16_bits_to_fp32(x); }
};

template <typename Src, typename Dst, typename Op>
__global__ void cast_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, size_t count, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = op(src[i]);
  }
}

template <typename Src, typename Dst, typename Op>
Status launch_cast(const Src* src, Dst* dst, size_t count, cudaStream_t stream, const char* what) {
  if (count == 0) return Status::ok_status();
  cast_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(src, dst, count, Op{});
  return launch_status(what);
}

// Fixed-order tree over one block's shared values (power-of-two size).
__device__ double block_tree_sum(double* shared, double value) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// Stage 1: thread t of block b sums x² over i = b*T + t, stepping by the whole (fixed) grid;
// each block reduces by a fixed tree into workspace[b].
template <typename Value>
__global__ void sum_squares_blocks(const Value* __restrict__ values, size_t count, double* workspace) {
  __shared__ double shared[kCudaSumSquaresThreads];
  const size_t stride = static_cast<size_t>(kCudaSumSquaresBlocks) * kCudaSumSquaresThreads;
  double sum = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kCudaSumSquaresThreads + threadIdx.x; i < count; i += stride) {
    const double x = widen(values[i]);
    sum = __fma_rn(x, x, sum);  // x*x is exact in double: the same as an add of the square
  }
  const double block_sum = block_tree_sum(shared, sum);
  if (threadIdx.x == 0) workspace[blockIdx.x] = block_sum;
}

// Stage 2: one block of kCudaSumSquaresThreads folds the block sums, each thread a fixed
// slice in order, then the same tree.
__global__ void sum_squares_final(const double* __restrict__ workspace, double* result, bool accumulate) {
  __shared__ double shared[kCudaSumSquaresThreads];
  double sum = 0.0;
  for (unsigned b = threadIdx.x; b < kCudaSumSquaresBlocks; b += kCudaSumSquaresThreads) sum += workspace[b];
  const double total = block_tree_sum(shared, sum);
  if (threadIdx.x == 0) *result = accumulate ? *result + total : total;
}

template <typename Value>
Status launch_sum_squares(const Value* values, size_t count, double* workspace, double* result,
                          bool accumulate, cudaStream_t stream) {
  sum_squares_blocks<<<kCudaSumSquaresBlocks, kCudaSumSquaresThreads, 0, stream>>>(values, count, workspace);
  STRATA_RETURN_IF_ERROR(launch_status("sum_squares_blocks"));
  sum_squares_final<<<1, kCudaSumSquaresThreads, 0, stream>>>(workspace, result, accumulate);
  return launch_status("sum_squares_final");
}

}  // namespace

Status adamw_step(const AdamWStepScalars& scalars, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, size_t count, DType copy_dtype, uint16_t* copy, cudaStream_t stream) {
  if (count == 0) return Status::ok_status();
  adamw_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(scalars, params, grads, exp_avg, exp_avg_sq,
                                                                    count, copy_dtype, copy, nullptr);
  return launch_status("adamw_kernel");
}

Status adamw_step_bf16_grads(const AdamWStepScalars& scalars, float* params, const uint16_t* grads_bf16,
                             float* exp_avg, float* exp_avg_sq, size_t count, DType copy_dtype,
                             uint16_t* copy, cudaStream_t stream) {
  if (count == 0) return Status::ok_status();
  adamw_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(scalars, params, grads_bf16, exp_avg,
                                                                    exp_avg_sq, count, copy_dtype, copy, nullptr);
  return launch_status("adamw_kernel (bf16 grads)");
}

Status adamw_step_device_scale(const AdamWStepScalars& scalars, const float* grad_scale, float* params,
                               const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                               DType copy_dtype, uint16_t* copy, cudaStream_t stream) {
  if (count == 0) return Status::ok_status();
  adamw_kernel<<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(scalars, params, grads, exp_avg, exp_avg_sq,
                                                                    count, copy_dtype, copy, grad_scale);
  return launch_status("adamw_kernel (device grad scale)");
}

Status clip_coefficient(const double* sum_squares, double max_norm, float* coefficient, cudaStream_t stream) {
  clip_coefficient_kernel<<<1, 1, 0, stream>>>(sum_squares, max_norm, coefficient);
  return launch_status("clip_coefficient_kernel");
}

Status cast_fp32_to_bf16(const float* src, uint16_t* dst, size_t count, cudaStream_t stream) {
  return launch_cast<float, uint16_t, ToBf16>(src, dst, count, stream, "cast fp32→bf16");
}
Status cast_bf16_to_fp32(const uint16_t* src, float* dst, size_t count, cudaStream_t stream) {
  return launch_cast<uint16_t, float, FromBf16>(src, dst, count, stream, "cast bf16→fp32");
}
Status cast_fp32_to_fp16(const float* src, uint16_t* dst, size_t count, cudaStream_t stream) {
  return launch_cast<float, uint16_t, ToFp16>(src, dst, count, stream, "cast fp32→fp16");
}
Status cast_fp16_to_fp32(const uint16_t* src, float* dst, size_t count, cudaStream_t stream) {
  return launch_cast<uint16_t, float, FromFp16>(src, dst, count, stream, "cast fp16→fp32");
}

Status sum_squares(const float* values, size_t count, double* workspace, double* result, bool accumulate,
                   cudaStream_t stream) {
  return launch_sum_squares(values, count, workspace, result, accumulate, stream);
}
Status sum_squares_bf16(const uint16_t* values, size_t count, double* workspace, double* result,
                        bool accumulate, cudaStream_t stream) {
  return launch_sum_squares(values, count, workspace, result, accumulate, stream);
}

}  // namespace strata::kernels::cuda
