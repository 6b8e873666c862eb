// tests/backend/test_backend_ops.cpp — op parity (ggml's test-backend-ops is the model): every
// scenario of backend_harness.h and model_scenarios.h (GPT-2's and Llama's embedding, whole
// blocks and heads through their model definitions) runs on the CUDA backend and on the CPU
// backend from the same inputs, and each output must agree within the op's tolerance below, stated as
// max|cuda − cpu| / max|cpu| per tensor; and generation's decode ops (GPT-2 and Llama, fp32 and
// bf16 weights), a prompt pass then single-token passes, logits and KV cache. The packed_ and
// llama_packed_ scenarios run the embedding and block ops on a packed batch (StepBatch's
// positions and segments: per-example positions, block-diagonal attention), so CUDA's packed
// kernels are held to the CPU's. The NF4/int8 dequantisation (kernels/quant) must give the
// CPU's bits. Exits 77 (skip) when no CUDA device is visible — as on any machine without a GPU,
// or a build without nvcc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/backend/model_scenarios.h"

namespace strata::testing {
namespace {

// Why each tolerance (a packed_ scenario is held to its op's): the casts, zero/copy, the
// embedding gather and AdamW are elementwise with the same rounding on both (elementwise.h), so
// they must be exact. GPT-2's blocks and head (its definition over the
// CUDA operations) use cuBLAS and other reduction orders: fp32 rounding, the 1e-5 that
// test_gpt2_cuda holds them to.
// The embedding gradient adds repeated tokens in another order. The sum of squares is double
// on both, in another order. The clipped AdamW inherits the sum's last-bit difference through
// the clip factor.
const std::map<std::string, double> kTolerance = {
    {"embedding_forward", 0.0}, {"embedding_backward", 1e-6}, {"block_forward", 1e-5}, {"block_backward", 1e-5},
    {"head", 1e-5},             {"zero_copy", 0.0},           {"casts", 0.0},          {"sum_squares", 1e-12},
    {"adamw", 0.0},             {"adamw_clip", 1e-6},
    // Loss masks: the head's tolerance; masked rows are exactly zero on both (the harness checks).
    {"head_masked", 1e-5},      {"head_masked_normalizer", 1e-5}, {"head_all_masked", 0.0},
};

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

double scalar_error(double got, double want) {
  return want != 0 ? std::fabs(got - want) / std::fabs(want) : std::fabs(got);
}

// The model scenarios (model_scenarios.h) and the seam's own (backend_harness.h), one list.
std::vector<const char*> all_scenarios() {
  std::vector<const char*> names(std::begin(kModelScenarios), std::end(kModelScenarios));
  names.insert(names.end(), std::begin(kScenarios), std::end(kScenarios));
  return names;
}
OpOutputs run_any_scenario(BackendEnv& env, const std::string& name) {
  for (const char* model_name : kModelScenarios)
    if (name == model_name) return run_model_scenario(env, name);
  return run_scenario(env, name);
}

class OpParity : public ::testing::TestWithParam<const char*> {};

TEST_P(OpParity, CudaMatchesCpu) {
  const std::string name = GetParam();
  const double tolerance = kTolerance.at(unpacked_scenario(name));  // packed: the op's own
  auto cpu = BackendEnv::create(device::Kind::cpu);
  auto cuda = BackendEnv::create(device::Kind::cuda);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(cuda, nullptr);
  EXPECT_FALSE(cuda->backend().is_host());
  const OpOutputs want = run_any_scenario(*cpu, name);
  const OpOutputs got = run_any_scenario(*cuda, name);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const double error = relative_error(got.tensors[i].second, want.tensors[i].second);
    EXPECT_LE(error, tolerance) << name << ": " << want.tensors[i].first;
    std::printf("%-20s %-12s max rel error %.3g (tolerance %.0e)\n", name.c_str(), want.tensors[i].first.c_str(),
                error, tolerance);
  }
  if (tolerance == 0.0) {
    EXPECT_EQ(got.bits, want.bits) << name;
  } else {
    ASSERT_EQ(got.bits.size(), want.bits.size());
    size_t differing = 0;  // 16-bit copies of values that differ by an ulp may round apart
    for (size_t i = 0; i < got.bits.size(); ++i) differing += got.bits[i] != want.bits[i];
    EXPECT_LE(differing, got.bits.size() / 100) << name;
  }
  EXPECT_LE(scalar_error(got.loss, want.loss), std::max(tolerance, 1e-6)) << name << ": loss";
  EXPECT_LE(scalar_error(got.grad_sum_squares, want.grad_sum_squares), std::max(tolerance, 1e-12))
      << name << ": sum of squares";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpParity, ::testing::ValuesIn(all_scenarios()),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Llama's definition (models/decoder.h over the CUDA and the CPU operations): cuBLAS and other reduction orders, fp32 rounding — the
// 1e-5 the CPU kernels hold against float64 torch; the embedding exact but for repeated tokens'
// order (1e-6).
class LlamaOpParity : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaOpParity, CudaMatchesCpu) {
  const std::string name = GetParam();
  const double tolerance = name == "llama_embedding" ? 1e-6 : 1e-5;
  auto cpu = BackendEnv::create(device::Kind::cpu);
  auto cuda = BackendEnv::create(device::Kind::cuda);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(cuda, nullptr);
  const OpOutputs want = run_llama_scenario(*cpu, name);
  const OpOutputs got = run_llama_scenario(*cuda, name);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const double error = relative_error(got.tensors[i].second, want.tensors[i].second);
    EXPECT_LE(error, tolerance) << name << ": " << want.tensors[i].first;
    std::printf("%-20s %-12s max rel error %.3g (tolerance %.0e)\n", name.c_str(), want.tensors[i].first.c_str(),
                error, tolerance);
  }
  EXPECT_LE(scalar_error(got.loss, want.loss), 1e-6) << name << ": loss";
  EXPECT_LE(scalar_error(got.grad_sum_squares, want.grad_sum_squares), tolerance) << name << ": sum of squares";
}

INSTANTIATE_TEST_SUITE_P(Ops, LlamaOpParity, ::testing::ValuesIn(kLlamaScenarios),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Generation's decoding through the definitions (model_scenarios.h's run_decode_scenario): a
// prompt pass, then two single-token passes, CUDA against CPU — each pass's block output and logits and the KV cache.
// Tolerance 1e-5 per tensor: fp32 rounding (cuBLAS vs OpenBLAS order, the attention's sums in
// another order), what the CPU decode holds against the full-sequence forward; the bf16
// scenarios read the same bf16 bits on both (matmul_bf16: the CPU multiplies them fused, CUDA
// widens slices first), so they are held to the same bound.
class DecodeParity : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeParity, CudaMatchesCpu) {
  const std::string name = GetParam();
  constexpr double kDecodeTolerance = 1e-5;
  auto cpu = BackendEnv::create(device::Kind::cpu);
  auto cuda = BackendEnv::create(device::Kind::cuda);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(cuda, nullptr);
  const OpOutputs want = run_decode_scenario(*cpu, name);
  const OpOutputs got = run_decode_scenario(*cuda, name);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const double error = relative_error(got.tensors[i].second, want.tensors[i].second);
    EXPECT_LE(error, kDecodeTolerance) << name << ": " << want.tensors[i].first;
    std::printf("%-20s %-12s max rel error %.3g (tolerance %.0e)\n", name.c_str(), want.tensors[i].first.c_str(),
                error, kDecodeTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, DecodeParity, ::testing::ValuesIn(kDecodeScenarios),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Proves the CUDA backend's cross-entropy refuses a target outside the vocabulary on both heads
// with the same error as the CPU's (kernels::check_targets), instead of indexing past the row.
TEST(CrossEntropy, CudaRefusesTargetsOutsideTheVocabulary) {
  const int64_t vocab = small_config().vocab_size;
  // Past the end, by one and by far; a negative target is a loss mask, not an error.
  for (const int32_t bad : {static_cast<int32_t>(vocab), static_cast<int32_t>(vocab) + 100000}) {
    auto cuda = BackendEnv::create(device::Kind::cuda);
    ASSERT_NE(cuda, nullptr);
    const auto [gpt2, llama] = heads_with_target(*cuda, bad);
    for (const Status& status : {gpt2, llama}) {
      ASSERT_FALSE(status.ok()) << "target " << bad << " accepted";
      EXPECT_NE(status.error().message.find("target token id " + std::to_string(bad)), std::string::npos)
          << status.error().message;
    }
  }
}

// Proves the CUDA dequantisation (kernels/quant/quant_cuda.h) gives the CPU's bits for NF4 and
// int8, with and without double quantisation, on a unit with raw tensors, odd sizes, a block of
// zeros and more than one absmax group.
TEST(Dequantize, CudaMatchesCpuBitForBit) {
  namespace q = kernels::quant;
  const std::vector<q::TensorPlan> plans = {{96, false}, {64 * 700 + 5, true}, {33, false}, {64 * 257 * 3, true}};
  for (const q::Kind kind : {q::Kind::nf4, q::Kind::int8}) {
    for (const bool double_quant : {false, true}) {
      const q::UnitLayout layout = q::make_unit_layout(kind, plans, double_quant);
      std::vector<float> unit = random_floats(layout.element_count, 0.05f, 41);
      std::fill(unit.begin() + 96 + 128, unit.begin() + 96 + 192, 0.0f);  // a block of zeros
      // quantise into 64-byte aligned host memory, then hand the same bytes to both backends
      std::vector<std::byte> storage(layout.size_bytes + q::kPieceAlignmentBytes);
      std::byte* aligned = storage.data() + (q::kPieceAlignmentBytes - reinterpret_cast<uintptr_t>(storage.data()) %
                                                                            q::kPieceAlignmentBytes) %
                                                q::kPieceAlignmentBytes;
      q::quantize_unit(layout, unit.data(), aligned);
      const std::vector<std::byte> bytes(aligned, aligned + layout.size_bytes);
      std::vector<std::vector<float>> results;
      for (const device::Kind device_kind : {device::Kind::cpu, device::Kind::cuda}) {
        auto env = BackendEnv::create(device_kind);
        ASSERT_NE(env, nullptr);
        const std::byte* src = env->upload(bytes);
        float* dst = env->zeros<float>(layout.element_count);
        ASSERT_TRUE(env->backend().dequantize_unit(layout, src, dst).ok());
        results.push_back(env->download(dst, layout.element_count));
      }
      ASSERT_EQ(std::memcmp(results[0].data(), results[1].data(), layout.element_count * sizeof(float)), 0)
          << q::kind_name(kind) << (double_quant ? " +dq" : "") << ": CUDA differs from the CPU";
    }
  }
}

}  // namespace
}  // namespace strata::testing

int main(int argc, char** argv) {
  // Skip (77) only where there is no GPU or no driver; any other CUDA error is a failure.
  strata::Result<int> devices = strata::device::cuda_device_count_or_error();
  if (!devices.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", devices.error().to_string().c_str());
    return 1;
  }
  if (*devices == 0) {
    std::printf("no CUDA device visible: op parity skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
