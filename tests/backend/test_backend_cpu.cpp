// tests/backend/test_backend_cpu.cpp — proves the seam itself adds nothing on the CPU: every
// scenario of backend_harness.h (the elementwise ops and the optimizer) run through the CPU
// backend (on a CPU device, through its buffers and its stream) gives exactly the bytes that
// kernels/optim gives when called directly on the same inputs, and `end_step` returns the sum
// of squares the kernels return, bit for bit; the backend reports its memory as host memory.
// The models' ops (their definitions over the operations) are held to the GPT-2 and Llama
// kernels by test_compose_gpt2 and test_compose_llama; here they only show that a changed
// input changes the output, that the loss comes back and that the heads refuse targets outside
// the vocabulary.
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/optim/adamw.h"
#include "kernels/optim/cast.h"
#include "tests/backend/model_scenarios.h"

namespace strata::testing {
namespace {

// The same scenario computed with the kernels directly, on host vectors.
OpOutputs run_direct(const std::string& name) {
  OpOutputs out;
  if (name == "zero_copy") {
    auto a = random_floats(1000, 1.0f, 15), z = random_floats(1000, 1.0f, 16);
    std::memcpy(z.data() + 10, a.data(), 500 * sizeof(float));
    std::fill(a.begin() + 100, a.begin() + 400, 0.0f);
    out.tensors.push_back({"zeroed", a});
    out.tensors.push_back({"copied", z});
  } else if (name == "casts") {
    std::vector<float> values = random_floats(4099, 3.0f, 17);
    values[0] = 1e-40f;
    values[1] = 65504.0f;
    out.bits.resize(values.size());
    std::vector<float> back(values.size());
    kernels::cast_fp32_to_bf16(values, out.bits);
    kernels::cast_bf16_to_fp32(out.bits, back);
    out.tensors.push_back({"widened", back});
  } else if (name == "sum_squares") {
    auto a = random_floats(100003, 1.0f, 18), z = random_floats(77, 2.0f, 19);
    out.grad_sum_squares = kernels::sum_squares(std::span<const float>(a));
    out.grad_sum_squares += kernels::sum_squares(std::span<const float>(z));
  } else if (name == "adamw" || name == "adamw_clip") {
    const size_t n = 5000;
    const bool clip = name == "adamw_clip";
    auto params = random_floats(n, 0.5f, 20), grads = random_floats(n, clip ? 3.0f : 0.01f, 21),
         m = random_floats(n, 0.01f, 22), v = random_floats(n, 0.001f, 23, 0.001f);
    kernels::AdamWStepScalars scalars{1.0f - 1e-4f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f, -3.7e-3f, 1.0f};
    if (clip) {
      out.grad_sum_squares = kernels::sum_squares(std::span<const float>(grads));
      scalars.grad_scale = kernels::clip_coefficient(std::sqrt(out.grad_sum_squares), 1.0);
      EXPECT_LT(scalars.grad_scale, 1.0f);  // the scenario really clips
    }
    out.bits.resize(n);
    kernels::adamw_step(scalars, params, grads, m, v, kernels::ComputeCopy{DType::bf16, out.bits});
    out.tensors.push_back({"params", params});
    out.tensors.push_back({"exp_avg", m});
    out.tensors.push_back({"exp_avg_sq", v});
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CpuSeam : public ::testing::TestWithParam<const char*> {};

TEST_P(CpuSeam, BitIdenticalToTheKernelsCalledDirectly) {
  auto env = BackendEnv::create(device::Kind::cpu);
  ASSERT_NE(env, nullptr);
  EXPECT_TRUE(env->backend().is_host());
  EXPECT_STREQ(env->backend().name(), "cpu");
  const OpOutputs seam = run_scenario(*env, GetParam());
  const OpOutputs direct = run_direct(GetParam());
  ASSERT_EQ(seam.tensors.size(), direct.tensors.size());
  for (size_t i = 0; i < seam.tensors.size(); ++i) {
    EXPECT_EQ(seam.tensors[i].first, direct.tensors[i].first);
    EXPECT_TRUE(same_bits(seam.tensors[i].second, direct.tensors[i].second)) << seam.tensors[i].first;
  }
  EXPECT_EQ(seam.bits, direct.bits);
  EXPECT_EQ(std::memcmp(&seam.loss, &direct.loss, sizeof(double)), 0) << seam.loss << " vs " << direct.loss;
  EXPECT_EQ(std::memcmp(&seam.grad_sum_squares, &direct.grad_sum_squares, sizeof(double)), 0)
      << seam.grad_sum_squares << " vs " << direct.grad_sum_squares;
}

INSTANTIATE_TEST_SUITE_P(Ops, CpuSeam, ::testing::ValuesIn(kScenarios),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// The scenarios must be able to fail: a changed input changes the bits the seam produces.
TEST(CpuSeamSelfCheck, ADifferentInputGivesDifferentOutputs) {
  auto env = BackendEnv::create(device::Kind::cpu);
  ASSERT_NE(env, nullptr);
  const OpOutputs forward = run_model_scenario(*env, "block_forward");
  const OpOutputs embedding = run_model_scenario(*env, "embedding_forward");
  ASSERT_EQ(forward.tensors[0].second.size(), embedding.tensors[0].second.size());
  EXPECT_FALSE(same_bits(forward.tensors[0].second, embedding.tensors[0].second));
  const OpOutputs head = run_model_scenario(*env, "head");
  EXPECT_GT(head.loss, 1.0);  // ~ln(64) for near-uniform logits: the loss did come back
}

// The model scenarios that test_backend_ops holds CUDA to, run where no GPU is: on the cpu and
// the emulated device they must give the same bits per tensor (the CPU operations either way;
// emulated only adds device buffers and stream waits), so a GPU run compares against a harness
// that is known to run whole, and a scenario that writes nothing or the wrong tensor shows.
TEST(ModelScenarios, CpuAndEmulatedGiveTheSameBits) {
  std::vector<std::string> names(std::begin(kModelScenarios), std::end(kModelScenarios));
  names.insert(names.end(), std::begin(kLlamaScenarios), std::end(kLlamaScenarios));
  for (const std::string& name : names) {
    auto cpu = BackendEnv::create(device::Kind::cpu);
    auto emulated = BackendEnv::create(device::Kind::emulated);
    ASSERT_NE(cpu, nullptr);
    ASSERT_NE(emulated, nullptr);
    const bool llama = name.starts_with("llama_");
    const OpOutputs want = llama ? run_llama_scenario(*cpu, name) : run_model_scenario(*cpu, name);
    const OpOutputs got = llama ? run_llama_scenario(*emulated, name) : run_model_scenario(*emulated, name);
    ASSERT_FALSE(want.tensors.empty()) << name;
    ASSERT_EQ(got.tensors.size(), want.tensors.size()) << name;
    for (size_t i = 0; i < want.tensors.size(); ++i)
      EXPECT_TRUE(same_bits(got.tensors[i].second, want.tensors[i].second)) << name << ": " << want.tensors[i].first;
    EXPECT_EQ(std::memcmp(&got.loss, &want.loss, sizeof(double)), 0) << name << ": loss";
    EXPECT_EQ(std::memcmp(&got.grad_sum_squares, &want.grad_sum_squares, sizeof(double)), 0) << name;
    // A head's loss came back (every row masked: exactly zero); nothing else sets one.
    if (name.find("head") != std::string::npos && !name.ends_with("all_masked"))
      EXPECT_GT(want.loss, 0.5) << name;
    else
      EXPECT_EQ(want.loss, 0.0) << name;
  }
}

// Without clipping, end_step's sum of squares is exactly zero (cleared by begin_step).
TEST(CpuSeamSelfCheck, BeginStepClearsTheScalars) {
  auto env = BackendEnv::create(device::Kind::cpu);
  ASSERT_NE(env, nullptr);
  const OpOutputs first = run_scenario(*env, "sum_squares");
  EXPECT_GT(first.grad_sum_squares, 0.0);
  const OpOutputs second = run_scenario(*env, "zero_copy");
  EXPECT_EQ(second.grad_sum_squares, 0.0);
  EXPECT_EQ(second.loss, 0.0);
}

// Proves the CPU backend's cross-entropy refuses a target past the vocabulary — one past the
// end and far past it, on both heads — with an error naming the token id and the vocabulary
// size, where the kernel alone would read past the logits row (its check is an assert); and
// that a negative target (a loss mask) is accepted.
TEST(CpuSeamSelfCheck, HeadRefusesTargetsOutsideTheVocabulary) {
  const int64_t vocab = small_config().vocab_size;
  // Past the end, by one and by far; a negative target is a loss mask, not an error.
  for (const int32_t bad : {static_cast<int32_t>(vocab), static_cast<int32_t>(vocab) + 100000}) {
    auto env = BackendEnv::create(device::Kind::cpu);
    ASSERT_NE(env, nullptr);
    const auto [gpt2, llama] = heads_with_target(*env, bad);
    for (const Status& status : {gpt2, llama}) {
      ASSERT_FALSE(status.ok()) << "target " << bad << " accepted";
      EXPECT_EQ(status.error().kind, ErrorKind::invalid_argument);
      EXPECT_NE(status.error().message.find("target token id " + std::to_string(bad)), std::string::npos)
          << status.error().message;
      EXPECT_NE(status.error().message.find("vocabulary of " + std::to_string(vocab)), std::string::npos)
          << status.error().message;
    }
  }
  // The last valid id still trains.
  auto env = BackendEnv::create(device::Kind::cpu);
  ASSERT_NE(env, nullptr);
  const auto [gpt2, llama] = heads_with_target(*env, static_cast<int32_t>(vocab - 1));
  EXPECT_TRUE(gpt2.ok()) << gpt2.to_string();
  EXPECT_TRUE(llama.ok()) << llama.to_string();
  for (const int32_t mask : {-1, -100, INT32_MIN}) {
    auto masked_env = BackendEnv::create(device::Kind::cpu);
    ASSERT_NE(masked_env, nullptr);
    const auto [gpt2_masked, llama_masked] = heads_with_target(*masked_env, mask);
    EXPECT_TRUE(gpt2_masked.ok()) << gpt2_masked.to_string();
    EXPECT_TRUE(llama_masked.ok()) << llama_masked.to_string();
  }
}

// Proves decoding does not reserve training's attention scratch: at an 8B-like shape (32 heads,
// 4096-token prompt and window) the decode workspace the definitions size for every kind
// (generation's sizes) stays below one H·T·T fp32 buffer — training's probabilities alone are
// two — and doubling the prompt at most doubles it (it grows with the prompt's rows, never
// their square).
TEST(DecodeWorkspace, GrowsLinearlyWithThePrompt) {
  constexpr int64_t kRows = 4096, kHeads = 32;
  ModelConfig gpt2_model;
  gpt2_model.arch = "gpt2";
  gpt2_model.n_layer = 32;
  gpt2_model.n_head = kHeads;
  gpt2_model.n_embd = 4096;
  gpt2_model.vocab_size = 50257;
  gpt2_model.seq_len = kRows;
  ModelConfig llama_model;
  llama_model.arch = "llama";
  llama_model.n_layer = 32;
  llama_model.n_head = kHeads;
  llama_model.n_kv_head = 8;
  llama_model.head_dim = 128;
  llama_model.n_embd = 4096;
  llama_model.intermediate_size = 14336;
  llama_model.vocab_size = 128256;
  llama_model.seq_len = kRows;
  const auto gpt2 = models::make_model_definition(gpt2_model);
  const auto llama = models::make_model_definition(llama_model);
  const double square_bytes = static_cast<double>(kHeads) * kRows * kRows * 4;
  for (const device::Kind kind : {device::Kind::cpu, device::Kind::emulated, device::Kind::cuda}) {
    const size_t gpt2_bytes = gpt2->decode_workspace_size_bytes(kind, kRows, kRows);
    const size_t llama_bytes = llama->decode_workspace_size_bytes(kind, kRows, kRows);
    EXPECT_LT(static_cast<double>(gpt2_bytes), square_bytes) << device::kind_name(kind);
    EXPECT_LT(static_cast<double>(llama_bytes), square_bytes) << device::kind_name(kind);
    const size_t gpt2_half = gpt2->decode_workspace_size_bytes(kind, kRows / 2, kRows);
    const size_t llama_half = llama->decode_workspace_size_bytes(kind, kRows / 2, kRows);
    EXPECT_LE(static_cast<double>(gpt2_bytes), 2.05 * static_cast<double>(gpt2_half)) << device::kind_name(kind);
    EXPECT_LE(static_cast<double>(llama_bytes), 2.05 * static_cast<double>(llama_half)) << device::kind_name(kind);
    std::printf("%-8s decode workspace at %lld rows: gpt2 %.2f GB, llama %.2f GB (H·T·T·4 = %.2f GB)\n",
                device::kind_name(kind), static_cast<long long>(kRows), gpt2_bytes / 1e9, llama_bytes / 1e9,
                square_bytes / 1e9);
  }
}

}  // namespace
}  // namespace strata::testing
