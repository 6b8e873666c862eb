// kernels/optim on CUDA: proves the GPU kernels give the CPU's exact bits (AdamW with its bf16
// and fp16 copies, bf16 grads, odd lengths; the 8-bit block-wise AdamW's params, codes and
// absmax with NaN/inf gradients and several block sizes; all four casts over every 16-bit pattern and
// millions of fp32 ones) and that the GPU sum of squares is run-to-run identical and agrees
// with the CPU's to double rounding. Exits 77 (skip) where no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cast.h"
#include "kernels/optim/optim_cuda.h"

namespace strata::kernels {
namespace {

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    void* pointer = nullptr;
    EXPECT_EQ(cudaMalloc(&pointer, std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess);
    data_ = static_cast<T*>(pointer);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  T* get() { return data_; }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

std::vector<float> random_floats(size_t count, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

template <typename T>
void expect_same_bytes(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&a[i], &b[i], sizeof(T))) << what << " differs at " << i;
  }
}

TEST(OptimCuda, AdamWMatchesCpuBitForBit) {
  const AdamWConfig config{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (const size_t count : {size_t{1}, size_t{1000}, size_t{300'007}}) {
    for (const DType copy_dtype : {DType::bf16, DType::f16}) {
      for (const bool bf16_grads : {false, true}) {
        std::vector<float> params = random_floats(count, 1, 1.0f), exp_avg(count, 0.0f), exp_avg_sq(count, 0.0f);
        std::vector<uint16_t> copy(count);
        DeviceArray<float> d_params(params), d_exp_avg(exp_avg), d_exp_avg_sq(exp_avg_sq);
        DeviceArray<uint16_t> d_copy(count);
        for (int step = 1; step <= 5; ++step) {
          const std::vector<float> grads = random_floats(count, 100 + step, 0.1f);
          std::vector<uint16_t> grads_bf16(count);
          cast_fp32_to_bf16(grads, grads_bf16);
          const AdamWStepScalars scalars = adamw_step_scalars(config, step, 0.5f);
          const ComputeCopy out{copy_dtype, copy};
          if (bf16_grads) {
            adamw_step_bf16_grads(scalars, params, grads_bf16, exp_avg, exp_avg_sq, out);
            DeviceArray<uint16_t> d_grads(grads_bf16);
            ASSERT_TRUE(cuda::adamw_step_bf16_grads(scalars, d_params.get(), d_grads.get(), d_exp_avg.get(),
                                                    d_exp_avg_sq.get(), count, copy_dtype, d_copy.get(), nullptr)
                            .ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          } else {
            adamw_step(scalars, params, grads, exp_avg, exp_avg_sq, out);
            DeviceArray<float> d_grads(grads);
            ASSERT_TRUE(cuda::adamw_step(scalars, d_params.get(), d_grads.get(), d_exp_avg.get(), d_exp_avg_sq.get(),
                                         count, copy_dtype, d_copy.get(), nullptr)
                            .ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          }
        }
        SCOPED_TRACE(testing::Message() << "count " << count << " copy " << dtype_name(copy_dtype));
        expect_same_bytes(d_params.to_host(), params, "params");
        expect_same_bytes(d_exp_avg.to_host(), exp_avg, "exp_avg");
        expect_same_bytes(d_exp_avg_sq.to_host(), exp_avg_sq, "exp_avg_sq");
        expect_same_bytes(d_copy.to_host(), copy, "compute copy");
      }
    }
  }
}

// The 8-bit AdamW (adamw8bit.cu against the CPU's scalar path): 6 steps over chunks with
// short tails, gradients over 12 decades per block and NaN/inf entries, a device grad scale.
TEST(OptimCuda, AdamW8bitMatchesCpuBitForBit) {
  const AdamWConfig config{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  for (const size_t block : {size_t{256}, size_t{64}, size_t{4096}}) {
    for (const size_t count : {size_t{1}, size_t{1000}, size_t{300'007}}) {
      for (const bool bf16_grads : {false, true}) {
        const DType copy_dtype = bf16_grads ? DType::f16 : DType::bf16;
        const size_t blocks = adamw8bit_block_count(count, block);
        std::vector<float> params = random_floats(count, 1, 1.0f), m_absmax(blocks), v_absmax(blocks);
        std::vector<uint8_t> m_codes(count), v_codes(count);
        std::vector<uint16_t> copy(count);
        const AdamW8bitState state{params, m_codes, v_codes, m_absmax, v_absmax, block};
        adamw8bit_init(state);
        DeviceArray<float> d_params(params), d_m_absmax(m_absmax), d_v_absmax(v_absmax);
        DeviceArray<uint8_t> d_m_codes(m_codes), d_v_codes(v_codes);
        DeviceArray<uint16_t> d_copy(count);
        DeviceArray<float> d_scale(std::vector<float>{0.5f});
        std::mt19937_64 rng(9);
        for (int step = 1; step <= 6; ++step) {
          std::vector<float> grads = random_floats(count, 200 + step, 1.0f);
          for (size_t begin = 0; begin < count; begin += block) {
            const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>(rng() % 12) - 9));
            for (size_t i = begin; i < std::min(count, begin + block); ++i) grads[i] *= scale;
          }
          for (size_t i = step; i < count; i += 53) grads[i] = (i % 3 == 0) ? NAN : (i % 3 == 1 ? INFINITY : -INFINITY);
          std::vector<uint16_t> grads_bf16(count);
          cast_fp32_to_bf16(grads, grads_bf16);
          const AdamWStepScalars scalars = adamw_step_scalars(config, step, 0.5f);
          const ComputeCopy out{copy_dtype, copy};
          if (bf16_grads) {
            adamw8bit_step_bf16_grads(scalars, state, grads_bf16, out, CpuIsa::scalar);
            DeviceArray<uint16_t> d_grads(grads_bf16);
            ASSERT_TRUE(cuda::adamw8bit_step_bf16_grads(scalars, d_scale.get(), d_params.get(), d_grads.get(),
                                                        d_m_codes.get(), d_v_codes.get(), d_m_absmax.get(),
                                                        d_v_absmax.get(), count, block, copy_dtype, d_copy.get(),
                                                        nullptr)
                            .ok());
          } else {
            adamw8bit_step(scalars, state, grads, out, CpuIsa::scalar);
            DeviceArray<float> d_grads(grads);
            ASSERT_TRUE(cuda::adamw8bit_step(scalars, nullptr, d_params.get(), d_grads.get(), d_m_codes.get(),
                                             d_v_codes.get(), d_m_absmax.get(), d_v_absmax.get(), count, block,
                                             copy_dtype, d_copy.get(), nullptr)
                            .ok());
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
        SCOPED_TRACE(testing::Message() << "block " << block << " count " << count << " bf16 grads " << bf16_grads);
        expect_same_bytes(d_params.to_host(), params, "params");
        expect_same_bytes(d_m_codes.to_host(), m_codes, "exp_avg codes");
        expect_same_bytes(d_v_codes.to_host(), v_codes, "exp_avg_sq codes");
        expect_same_bytes(d_m_absmax.to_host(), m_absmax, "exp_avg absmax");
        expect_same_bytes(d_v_absmax.to_host(), v_absmax, "exp_avg_sq absmax");
        expect_same_bytes(d_copy.to_host(), copy, "compute copy");
      }
    }
  }
  // A block larger than the kernel takes is refused, not run.
  EXPECT_FALSE(cuda::adamw8bit_step(adamw_step_scalars(config, 1), nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, 10, kAdamW8bitMaxBlockElements + 1, DType::f32, nullptr,
                                    nullptr)
                   .ok());
}

TEST(OptimCuda, CastsMatchCpuBitForBit) {
  std::vector<uint16_t> halves(65536);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  DeviceArray<uint16_t> d_halves(halves);
  DeviceArray<float> d_wide(halves.size());
  std::vector<float> wide(halves.size());
  ASSERT_TRUE(cuda::cast_bf16_to_fp32(d_halves.get(), d_wide.get(), halves.size(), nullptr).ok());
  cast_bf16_to_fp32(halves, wide);
  expect_same_bytes(d_wide.to_host(), wide, "bf16 → fp32");
  ASSERT_TRUE(cuda::cast_fp16_to_fp32(d_halves.get(), d_wide.get(), halves.size(), nullptr).ok());
  cast_fp16_to_fp32(halves, wide);
  expect_same_bytes(d_wide.to_host(), wide, "fp16 → fp32");

  // Every sign and exponent with the low 16 mantissa bits swept (all rounding edges), plus
  // random high bits.
  std::vector<float> values;
  std::mt19937 rng(9);
  for (uint32_t head = 0; head < 512; ++head) {
    const uint32_t high = rng() & 0x7Fu;
    for (uint32_t low = 0; low < 65536; low += 7) values.push_back(std::bit_cast<float>((head << 23) | (high << 16) | low));
  }
  DeviceArray<float> d_values(values);
  DeviceArray<uint16_t> d_narrow(values.size());
  std::vector<uint16_t> narrow(values.size());
  ASSERT_TRUE(cuda::cast_fp32_to_bf16(d_values.get(), d_narrow.get(), values.size(), nullptr).ok());
  cast_fp32_to_bf16(values, narrow);
  expect_same_bytes(d_narrow.to_host(), narrow, "fp32 → bf16");
  ASSERT_TRUE(cuda::cast_fp32_to_fp16(d_values.get(), d_narrow.get(), values.size(), nullptr).ok());
  cast_fp32_to_fp16(values, narrow);
  expect_same_bytes(d_narrow.to_host(), narrow, "fp32 → fp16");
}

TEST(OptimCuda, SumSquaresIsDeterministicAndAgreesWithCpu) {
  const std::vector<float> a = random_floats(3'000'017, 4, 2.0f);
  const std::vector<float> b = random_floats(777, 5, 0.01f);
  DeviceArray<float> d_a(a), d_b(b);
  DeviceArray<double> workspace(cuda::kCudaSumSquaresWorkspaceBytes / sizeof(double)), result(1);
  double runs[2];
  for (double& run : runs) {
    ASSERT_TRUE(cuda::sum_squares(d_a.get(), a.size(), workspace.get(), result.get(), false, nullptr).ok());
    ASSERT_TRUE(cuda::sum_squares(d_b.get(), b.size(), workspace.get(), result.get(), true, nullptr).ok());
    run = result.to_host()[0];
  }
  EXPECT_EQ(std::bit_cast<uint64_t>(runs[0]), std::bit_cast<uint64_t>(runs[1]));
  const std::vector<std::span<const float>> spans = {a, b};
  const double cpu = sum_squares(spans);
  EXPECT_NEAR(runs[0], cpu, 1e-12 * cpu);
}

}  // namespace
}  // namespace strata::kernels

int main(int argc, char** argv) {
  // Skip (77) only where there is no GPU or no driver; any other CUDA error is a failure.
  int devices = 0;
  const cudaError_t code = cudaGetDeviceCount(&devices);
  if (code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver || (code == cudaSuccess && devices == 0)) {
    std::printf("SKIP: no CUDA device here; the CUDA kernels of kernels/optim are built but not run\n");
    return 77;
  }
  if (code != cudaSuccess) {
    std::fprintf(stderr, "FAIL: cudaGetDeviceCount: %s\n", cudaGetErrorString(code));
    return 1;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
