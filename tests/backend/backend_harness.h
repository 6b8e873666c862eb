// tests/backend/backend_harness.h — runs backend ops (kernels/backend.h) on one device from
// host inputs and brings their outputs back, so the same scenario can run on the CPU backend,
// on the CUDA backend and against the kernels called directly. A model's training ops run
// through its definition (tests/backend/model_scenarios.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "models/gpt2_shape.h"
#include "models/llama_shape.h"
#include "device/device.h"

namespace strata::testing {

namespace gk = models::gpt2;

// A small GPT-2 shape: every code path of the kernels (several heads, several rows per batch,
// a head that works in more than one chunk is not needed at this size) at a size that runs in
// milliseconds.
inline gk::Config small_config() { return gk::Config{1, 2, 32, 64, 16}; }
inline gk::BatchShape small_shape() { return gk::BatchShape{2, 8}; }

inline std::vector<float> random_floats(size_t count, float scale, uint32_t seed, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(count);
  for (float& v : values) v = offset + dist(rng);
  return values;
}

inline std::vector<int32_t> random_tokens(size_t count, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> values(count);
  for (int32_t& v : values) v = dist(rng);
  return values;
}

// small_shape's batch packed (kernels::StepBatch's positions and segments): row 0 holds
// examples of 3 and 5 tokens, row 1 of 1, 4 and 3 (ids non-decreasing along each row).
struct SmallPacking {
  std::vector<int32_t> positions, segments;
};
inline SmallPacking small_packing() {
  const std::vector<std::vector<int>> lengths = {{3, 5}, {1, 4, 3}};
  const std::vector<std::vector<int32_t>> ids = {{0, 1}, {1, 4, 6}};
  SmallPacking p;
  for (size_t row = 0; row < lengths.size(); ++row)
    for (size_t e = 0; e < lengths[row].size(); ++e)
      for (int i = 0; i < lengths[row][e]; ++i) {
        p.positions.push_back(i);
        p.segments.push_back(ids[row][e]);
      }
  return p;
}
// "packed_X" / "llama_packed_X": scenario X on the packed batch. The op behind a name.
inline bool is_packed_scenario(const std::string& name) {
  return name.rfind("packed_", 0) == 0 || name.rfind("llama_packed_", 0) == 0;
}
inline std::string unpacked_scenario(const std::string& name) {
  if (name.rfind("packed_", 0) == 0) return name.substr(7);
  if (name.rfind("llama_packed_", 0) == 0) return "llama_" + name.substr(13);
  return name;
}

// The shape, element counts and token batch every scenario shares, so that the direct run and
// each backend's run draw the same inputs.
struct Scenario {
  gk::Config c;
  gk::BatchShape s;
  size_t rows, act, wte_n, wpe_n, block_n;
  std::vector<int32_t> tokens, targets;
};
inline Scenario make_scenario() {
  const gk::Config c = small_config();
  const gk::BatchShape s = small_shape();
  const auto rows = static_cast<size_t>(s.rows());
  return Scenario{c,
                  s,
                  rows,
                  rows * static_cast<size_t>(c.n_embd),
                  static_cast<size_t>(c.vocab_size * c.n_embd),
                  static_cast<size_t>(c.n_ctx * c.n_embd),
                  static_cast<size_t>(gk::block_param_count(c)),
                  random_tokens(rows, static_cast<int32_t>(c.vocab_size), 11),
                  random_tokens(rows, static_cast<int32_t>(c.vocab_size), 12)};
}

// Loss masks for the head scenarios "<head>_masked", "<head>_masked_normalizer" and
// "<head>_all_masked" (kernels/ops.h, "Loss masks"): every third row -1 and row 5 -7 (any negative
// is a mask), or every row -1. Returns the scenario's N (StepBatch::loss_normalizer_tokens):
// 40 for "_masked_normalizer" (as one micro-batch of an accumulated update), else 0.
inline int64_t apply_masks(const std::string& name, std::vector<int32_t>& targets) {
  const bool all = name.ends_with("_all_masked");
  const bool some = name.ends_with("_masked") || name.ends_with("_masked_normalizer");
  for (size_t i = 0; i < targets.size(); ++i) {
    if (all || (some && i % 3 == 0)) targets[i] = -1;
    if (some && !all && i == 5) targets[i] = -7;
  }
  return name.ends_with("_masked_normalizer") ? 40 : 0;
}

// Masked rows give exactly zero to d_x_final: nothing of a masked token reaches the model.
inline void expect_masked_rows_zero(const std::vector<int32_t>& targets, const std::vector<float>& d_x_final,
                                    int64_t width) {
  for (size_t row = 0; row < targets.size(); ++row) {
    if (targets[row] >= 0) continue;
    for (int64_t j = 0; j < width; ++j)
      ASSERT_EQ(d_x_final[row * static_cast<size_t>(width) + static_cast<size_t>(j)], 0.0f) << "masked row " << row;
  }
}

// One block's weights: LayerNorm gains near 1, everything else small.
inline std::vector<float> block_weights(const gk::Config& config, uint32_t seed) {
  std::vector<float> values = random_floats(static_cast<size_t>(gk::block_param_count(config)), 0.05f, seed);
  const auto specs = gk::block_param_specs(config);
  size_t offset = 0;
  for (int i = 0; i < gk::kBlockParamCount; ++i) {
    const auto n = static_cast<size_t>(specs[i].numel());
    if (specs[i].name_suffix == "ln_1.weight" || specs[i].name_suffix == "ln_2.weight")
      for (size_t j = 0; j < n; ++j) values[offset + j] += 1.0f;
    offset += n;
  }
  return values;
}

// A device of `kind` with its backend, and buffers made from host vectors.
class BackendEnv {
 public:
  static std::unique_ptr<BackendEnv> create(device::Kind kind, uint64_t budget_bytes = uint64_t{64} << 20) {
    auto env = std::unique_ptr<BackendEnv>(new BackendEnv());
    auto device = device::make_device(kind, budget_bytes);
    if (!device.ok()) {
      ADD_FAILURE() << device.error().to_string();
      return nullptr;
    }
    env->device_ = std::move(device).value();
    auto backend = kernels::make_backend(*env->device_, small_shape());
    if (!backend.ok()) {
      ADD_FAILURE() << backend.error().to_string();
      return nullptr;
    }
    env->backend_ = std::move(backend).value();
    return env;
  }
  ~BackendEnv() {
    if (backend_) (void)backend_->synchronize();
    held_.clear();
    backend_.reset();
  }

  kernels::ComputeBackend& backend() { return *backend_; }
  device::Device& device() { return *device_; }

  template <typename T>
  T* upload(const std::vector<T>& values) {
    auto buffer = device_->allocate(std::max<uint64_t>(values.size() * sizeof(T), 1));
    EXPECT_TRUE(buffer.ok());
    if (!buffer.ok()) return nullptr;
    T* data = static_cast<T*>(buffer->data());
    held_.push_back(std::move(buffer).value());
    EXPECT_TRUE(device_->copy_to_device(backend_->compute_stream(), data, values.data(), values.size() * sizeof(T)).ok());
    EXPECT_TRUE(device_->synchronize(backend_->compute_stream()).ok());
    return data;
  }
  template <typename T>
  T* zeros(size_t count) {
    return upload(std::vector<T>(count));
  }
  template <typename T>
  std::vector<T> download(const T* data, size_t count) {
    std::vector<T> values(count);
    EXPECT_TRUE(backend_->synchronize().ok());
    EXPECT_TRUE(device_->copy_to_host(backend_->compute_stream(), values.data(), data, count * sizeof(T)).ok());
    EXPECT_TRUE(device_->synchronize(backend_->compute_stream()).ok());
    return values;
  }
  // A workspace of `size_bytes` in the device's memory (zeroed).
  gk::Workspace workspace_for(size_t size_bytes) {
    float* data = zeros<float>(size_bytes / 4 + 1);
    return gk::Workspace{data, size_bytes};
  }

 private:
  BackendEnv() = default;
  std::unique_ptr<device::Device> device_;
  std::unique_ptr<kernels::ComputeBackend> backend_;
  std::vector<device::DeviceBuffer> held_;
};

// The named outputs of one op scenario, as host values.
struct OpOutputs {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  std::vector<uint16_t> bits;  // 16-bit outputs (casts, the compute copy)
  double loss = 0.0;
  double grad_sum_squares = 0.0;
};

// Each scenario: fixed inputs from fixed seeds, one op (or a short chain) through the backend,
// outputs back. Scenario names are what the parity tests print. These are the seam's own ops
// (elementwise and the optimizer); a model's ops run through its definition
// (tests/backend/model_scenarios.h).
inline const char* const kScenarios[] = {"zero_copy", "casts", "sum_squares", "adamw", "adamw_clip"};

inline OpOutputs run_scenario(BackendEnv& env, const std::string& name) {
  Scenario scenario = make_scenario();
  kernels::ComputeBackend& b = env.backend();
  EXPECT_TRUE(b.begin_step({scenario.tokens.data(), scenario.targets.data(), scenario.s.rows()}).ok());
  OpOutputs out;
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };

  if (name == "zero_copy") {
    float* a = env.upload(random_floats(1000, 1.0f, 15));
    float* z = env.upload(random_floats(1000, 1.0f, 16));
    expect_ok(b.copy(z + 10, a, 500 * sizeof(float)));
    expect_ok(b.zero(a + 100, 300));
    out.tensors.push_back({"zeroed", env.download(a, 1000)});
    out.tensors.push_back({"copied", env.download(z, 1000)});
  } else if (name == "casts") {
    std::vector<float> values = random_floats(4099, 3.0f, 17);
    values[0] = 1e-40f;  // a subnormal
    values[1] = 65504.0f;
    float* src = env.upload(values);
    uint16_t* bits = env.zeros<uint16_t>(values.size());
    float* back = env.zeros<float>(values.size());
    expect_ok(b.cast_fp32_to_bf16(src, bits, values.size()));
    expect_ok(b.cast_bf16_to_fp32(bits, back, values.size()));
    out.bits = env.download(bits, values.size());
    out.tensors.push_back({"widened", env.download(back, values.size())});
  } else if (name == "sum_squares") {
    float* a = env.upload(random_floats(100003, 1.0f, 18));
    float* z = env.upload(random_floats(77, 2.0f, 19));
    expect_ok(b.sum_squares(a, 100003));
    expect_ok(b.sum_squares(z, 77));
  } else if (name == "adamw" || name == "adamw_clip") {
    const size_t n = 5000;
    const bool clip = name == "adamw_clip";
    float* params = env.upload(random_floats(n, 0.5f, 20));
    float* grads = env.upload(random_floats(n, clip ? 3.0f : 0.01f, 21));
    float* m = env.upload(random_floats(n, 0.01f, 22));
    float* v = env.upload(random_floats(n, 0.001f, 23, 0.001f));
    uint16_t* copy = env.zeros<uint16_t>(n);
    kernels::AdamWChunk chunk;
    chunk.scalars = kernels::detail::AdamWStepScalars{};
    // adamw_step_scalars(AdamWConfig{1e-3, 0.9, 0.95, 1e-8, 0.1}, 3) rounded by hand would
    // restate adamw.h; the values only need to be ordinary, so set them directly.
    chunk.scalars = {1.0f - 1e-4f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f, -3.7e-3f, 1.0f};
    chunk.params = params;
    chunk.grads = grads;
    chunk.exp_avg = m;
    chunk.exp_avg_sq = v;
    chunk.count = n;
    chunk.copy_dtype = DType::bf16;
    chunk.copy = copy;
    if (clip) {
      expect_ok(b.sum_squares(grads, n));
      expect_ok(b.clip_coefficient(1.0));
      chunk.use_clip_scale = true;
    }
    expect_ok(b.adamw(chunk));
    out.tensors.push_back({"params", env.download(params, n)});
    out.tensors.push_back({"exp_avg", env.download(m, n)});
    out.tensors.push_back({"exp_avg_sq", env.download(v, n)});
    out.bits = env.download(copy, n);
  } else {
    ADD_FAILURE() << "unknown scenario " << name;
  }
  auto scalars = b.end_step();
  EXPECT_TRUE(scalars.ok());
  if (scalars.ok()) {
    out.loss = scalars->loss;
    out.grad_sum_squares = scalars->grad_sum_squares;
  }
  return out;
}

// --- Llama's shape (model_scenarios.h's Llama model and decode scenarios) ---
// 4 query heads over 2 k/v heads, head_dim 8 (≠ n_embd / n_head), llama3 rope scaling, untied.
inline models::llama::Config small_llama_config() {
  models::llama::Config c;
  c.n_layer = 1;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 8;
  c.n_embd = 24;
  c.intermediate_size = 40;
  c.vocab_size = 64;
  c.n_ctx = 16;
  c.rope_factor = 8.0;
  c.rope_original_max_positions = 16.0;
  c.tie_word_embeddings = false;
  return c;
}

// The bf16 bit patterns of fp32 values (their upper halves): the same bf16 weights for every
// backend and for the kernels called directly.
inline std::vector<uint16_t> upper_halves(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t word = 0;
    std::memcpy(&word, &values[i], sizeof word);
    bits[i] = static_cast<uint16_t>(word >> 16);
  }
  return bits;
}

}  // namespace strata::testing
