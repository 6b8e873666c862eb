// tests/engine/test_decode_bf16.cpp — decoding on bf16 weights through the model definitions
// (models/model.h's block_decode_bf16 / head_logits_bf16, what generation runs on the store's
// bf16 units): on the CPU backend, whose matmul_bf16 multiplies the bf16 matrices without
// widening a unit, they give the logits of widening the weights and running the definitions'
// fp32 decode, up to fp32 summation order.
//
// How: random fp32 weights rounded to bf16, widened exactly for the fp32 reference. GPT-2 (odd
// widths: 80 wide, so the Conv1D GEMV has column tails) and Llama (GQA: 6 query heads over 3 k/v
// heads, head_dim 16, 56 wide, so its dot products have tails), two blocks and the head each,
// decoded with their KV caches as generation does: a prompt of 6 rows (the widened-pieces path),
// then 3 rows, then one token at a time to the end of the window (the register GEMV). Logits
// compared as max|a − b| / max|b| ≤ 1e-5 at every pass. cpu_math::matmul_bf16 itself (and its
// widened-pieces path alone, which CPUs without AVX2 run) is checked against a double-precision
// product for both layouts, 1–9 rows, widths with tails, with and without accumulate.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_math.h"
#include "tests/reference/gpt2_reference.h"
#include "tests/reference/llama_reference.h"
#include "kernels/optim/cast.h"
#include "device/device.h"
#include "models/model.h"

namespace strata {
namespace {

namespace gk = reference::gpt2;
namespace lk = reference::llama;

struct Aligned {
  explicit Aligned(size_t bytes)
      : size_bytes((std::max<size_t>(bytes, 64) + 63) / 64 * 64),
        data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  gk::Workspace workspace() const { return gk::Workspace{data, size_bytes}; }
  size_t size_bytes;
  float* data;
};

// fp32 values rounded to bf16, and those bf16 values widened back (exactly).
struct Bf16Tensor {
  std::vector<uint16_t> bits;
  std::vector<float> widened;
};

Bf16Tensor random_bf16(size_t count, float scale, float offset, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(count);
  for (float& v : values) v = offset + dist(rng);
  Bf16Tensor t{std::vector<uint16_t>(count), std::vector<float>(count)};
  kernels::cast_fp32_to_bf16(values, t.bits);
  kernels::cast_bf16_to_fp32(t.bits, t.widened);
  return t;
}

float relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  float scale = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    diff = std::max(diff, std::abs(got[i] - want[i]));
  }
  return scale > 0.0f ? diff / scale : diff;
}

// The two paths of one model, each with its own KV caches and activations: the definition's
// fp32 decode on the widened weights, and its bf16 decode on the bits.
enum Path { kFp32 = 0, kBf16 = 1 };
constexpr int kPaths = 2;

struct Caches {
  Caches(int64_t layers, int64_t window, int64_t width)
      : keys(static_cast<size_t>(layers), std::vector<float>(static_cast<size_t>(window * width))),
        values(keys) {}
  gk::KvCacheBlock block(int64_t i, int64_t window) {
    return gk::KvCacheBlock{keys[static_cast<size_t>(i)].data(), values[static_cast<size_t>(i)].data(), window};
  }
  std::vector<std::vector<float>> keys, values;
};

// Runs passes of `rows` new rows (x0 random, the same for both paths) through the blocks and
// the head on each path, comparing the logits after each.
template <typename RunPass>
void decode_and_compare(int64_t window, int64_t vocab, int64_t c, const RunPass& run_pass, const char* model) {
  std::vector<int64_t> schedule = {6, 3};
  while (9 + static_cast<int64_t>(schedule.size()) - 2 < window) schedule.push_back(1);
  int64_t past = 0;
  int passes = 0;
  float worst = 0.0f;
  for (const int64_t rows : schedule) {
    const Bf16Tensor x0 = random_bf16(static_cast<size_t>(rows * c), 1.0f, 0.0f, 100 + passes);
    std::vector<std::vector<float>> logits(kPaths, std::vector<float>(static_cast<size_t>(vocab)));
    for (int path = 0; path < kPaths; ++path) run_pass(static_cast<Path>(path), past, rows, x0.widened, logits[path]);
    float scale = 0.0f;
    for (const float v : logits[kFp32]) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.5f) << model << ": logits not far from flat, so the check would mean little";
    const float error = relative_error(logits[kBf16], logits[kFp32]);
    worst = std::max(worst, error);
    EXPECT_LE(error, 1e-5f) << model << ": bf16 vs widened fp32, pass of " << rows << " rows after " << past;
    past += rows;
    ++passes;
  }
  EXPECT_EQ(past, window);
  std::printf("%s: %d passes, worst relative logit error bf16 vs fp32 %.2e\n", model, passes, worst);
}

// One model's blocks (random, their norm gains set by `gain_of` near 1), final norm and
// output projection, decoded on both paths through its definition on the CPU backend.
void check_decode(const ModelConfig& model, const std::vector<int64_t>& block_tensor_sizes,
                  const std::vector<bool>& is_norm_gain, float (*gain_of)(int64_t), const Bf16Tensor& final_norm,
                  const Bf16Tensor& projection, const char* what) {
  const auto def = models::make_model_definition(model);
  const int64_t c = model.n_embd;
  const int64_t vocab = model.vocab_size;
  const int64_t window = model.seq_len;
  int64_t block_elements = 0;
  for (const int64_t n : block_tensor_sizes) block_elements += n;
  std::vector<Bf16Tensor> blocks;
  for (uint32_t i = 0; i < model.n_layer; ++i) {
    Bf16Tensor block = random_bf16(static_cast<size_t>(block_elements), 0.25f, 0.0f, 7 + i);
    int64_t offset = 0;
    for (size_t s = 0; s < block_tensor_sizes.size(); ++s) {
      if (is_norm_gain[s])
        for (int64_t j = 0; j < c; ++j) {
          block.bits[offset + j] = kernels::fp32_to_bf16_bits(gain_of(j));
          block.widened[offset + j] = kernels::bf16_bits_to_fp32(block.bits[offset + j]);
        }
      offset += block_tensor_sizes[s];
    }
    blocks.push_back(std::move(block));
  }

  auto device = device::make_device(device::Kind::cpu, 1 << 20);
  ASSERT_TRUE(device.ok());
  auto made = kernels::make_backend(**device, gk::BatchShape{1, 8});
  ASSERT_TRUE(made.ok());
  kernels::ComputeBackend& backend = **made;
  Aligned workspace(def->decode_workspace_size_bytes(device::Kind::cpu, 6, window));
  Aligned scratch(def->decode_bf16_scratch_bytes(device::Kind::cpu));
  std::vector<Caches> caches(kPaths, Caches(model.n_layer, window, def->kv_cache_width()));
  std::vector<float> x(static_cast<size_t>(6 * c)), y(x.size());

  auto run_pass = [&](Path path, int64_t past, int64_t rows, const std::vector<float>& x0, std::vector<float>& logits) {
    std::copy(x0.begin(), x0.end(), x.begin());
    for (uint32_t i = 0; i < model.n_layer; ++i) {
      const Bf16Tensor& w = blocks[i];
      const gk::KvCacheBlock cache = caches[path].block(i, window);
      const Status status =
          path == kFp32
              ? def->block_decode(backend, past, rows, w.widened.data(), x.data(), y.data(), cache,
                                  workspace.workspace())
              : def->block_decode_bf16(backend, past, rows, w.bits.data(), x.data(), y.data(), cache,
                                       workspace.workspace(), scratch.workspace());
      ASSERT_TRUE(status.ok()) << status.to_string();
      std::swap(x, y);
    }
    const Status status =
        path == kFp32 ? def->head_logits(backend, rows, final_norm.widened.data(), projection.widened.data(), vocab,
                                         x.data(), logits.data(), workspace.workspace())
                      : def->head_logits_bf16(backend, rows, final_norm.bits.data(), projection.bits.data(), x.data(),
                                              logits.data(), workspace.workspace(), scratch.workspace());
    ASSERT_TRUE(status.ok()) << status.to_string();
  };
  decode_and_compare(window, vocab, c, run_pass, what);
}

TEST(DecodeBf16, Gpt2MatchesWidenedFp32) {
  ModelConfig model;
  model.arch = "gpt2";
  model.n_layer = 2;
  model.n_head = 4;
  model.n_embd = 80;
  model.vocab_size = 97;
  model.seq_len = 20;
  const gk::Config kc = models::gpt2_shape_config(model);
  const auto specs = gk::block_param_specs(kc);
  std::vector<int64_t> sizes;
  std::vector<bool> gains;
  for (int s = 0; s < gk::kBlockParamCount; ++s) {
    sizes.push_back(specs[s].numel());
    gains.push_back(s == 0 || s == 6);  // ln_1.weight, ln_2.weight
  }
  const Bf16Tensor ln_f = random_bf16(static_cast<size_t>(2 * kc.n_embd), 0.1f, 0.5f, 21);  // gain, bias
  const Bf16Tensor wte = random_bf16(static_cast<size_t>(kc.vocab_size * kc.n_embd), 0.3f, 0.0f, 22);
  check_decode(model, sizes, gains, [](int64_t j) { return 1.0f + 0.01f * static_cast<float>(j % 7); }, ln_f, wte,
               "gpt2");
}

// The Llama checks, with or without the attention biases (Qwen 2's q/k/v; HF Llama's
// attention_bias adds o_proj's), which the bf16 path widens apart from the matrices.
void check_llama_decode(bool qkv_bias, bool o_bias, const char* what) {
  ModelConfig model;
  model.arch = "llama";
  model.qkv_bias = qkv_bias;
  model.o_proj_bias = o_bias;
  model.n_layer = 2;
  model.n_head = 6;
  model.n_kv_head = 3;
  model.head_dim = 16;
  model.n_embd = 56;
  model.intermediate_size = 88;
  model.vocab_size = 101;
  model.seq_len = 20;
  model.rope_theta = 10000.0;
  model.tie_word_embeddings = false;
  lk::Config kc;  // for the block's tensor sizes only: the same shape as `model`
  kc.qkv_bias = qkv_bias;
  kc.o_bias = o_bias;
  kc.n_layer = 2;
  kc.n_head = 6;
  kc.n_kv_head = 3;
  kc.head_dim = 16;
  kc.n_embd = 56;
  kc.intermediate_size = 88;
  kc.vocab_size = 101;
  kc.n_ctx = 20;
  std::vector<int64_t> sizes;
  std::vector<bool> gains;
  for (const auto& spec : lk::block_param_specs(kc)) {  // RMSNorm gains near 1; biases stay random
    sizes.push_back(spec.numel());
    gains.push_back(spec.name_suffix.find("layernorm") != std::string_view::npos);
  }
  const Bf16Tensor norm = random_bf16(static_cast<size_t>(kc.n_embd), 0.1f, 1.0f, 41);
  const Bf16Tensor lm_head = random_bf16(static_cast<size_t>(kc.vocab_size * kc.n_embd), 0.3f, 0.0f, 42);
  check_decode(model, sizes, gains, [](int64_t j) { return 1.0f - 0.01f * static_cast<float>(j % 5); }, norm, lm_head,
               what);
}

TEST(DecodeBf16, LlamaGqaMatchesWidenedFp32) { check_llama_decode(false, false, "llama"); }
TEST(DecodeBf16, Qwen2BiasesMatchWidenedFp32) { check_llama_decode(true, false, "qwen2 q/k/v biases"); }
TEST(DecodeBf16, LlamaAttentionBiasMatchesWidenedFp32) { check_llama_decode(true, true, "llama attention_bias"); }

// The product itself against a double-precision reference: both layouts, rows on both sides
// of kBf16GemvRows, widths with and without tails, y overwritten and accumulated.
TEST(DecodeBf16, MatmulBf16MatchesDoubleReference) {
  kernels::cpu_math::pin_blas_to_one_thread();
  std::vector<float> pieces(static_cast<size_t>(kernels::cpu_math::kBf16PiecesFloats));
  for (const bool out_major : {false, true}) {
    for (const int64_t rows : {1, 2, 3, 4, 5, 9}) {
      for (const auto& [in, out] : std::vector<std::pair<int64_t, int64_t>>{{37, 70}, {200, 600}, {64, 1100}}) {
        for (const bool accumulate : {false, true}) {
          const Bf16Tensor w = random_bf16(static_cast<size_t>(in * out), 0.5f, 0.0f, 51);
          const Bf16Tensor x = random_bf16(static_cast<size_t>(rows * in), 1.0f, 0.0f, 52);
          const Bf16Tensor y0 = random_bf16(static_cast<size_t>(rows * out), 1.0f, 0.0f, 53);
          std::vector<float> y = y0.widened;
          kernels::cpu_math::matmul_bf16(out_major, rows, in, out, x.widened.data(), w.bits.data(), accumulate,
                                         y.data(), pieces.data());
          // The pieces path alone too (what a CPU without AVX2 runs for every row count).
          std::vector<float> y_pieces = y0.widened;
          kernels::cpu_math::matmul_bf16_pieces(out_major, rows, in, out, x.widened.data(), w.bits.data(), accumulate,
                                                y_pieces.data(), pieces.data());
          std::vector<float> want(y.size());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < out; ++j) {
              double sum = accumulate ? y0.widened[r * out + j] : 0.0;
              for (int64_t k = 0; k < in; ++k)
                sum += double(x.widened[r * in + k]) *
                       double(w.widened[out_major ? j * in + k : k * out + j]);
              want[r * out + j] = static_cast<float>(sum);
            }
          EXPECT_LE(relative_error(y, want), 2e-6f) << (out_major ? "[out, in]" : "[in, out]") << " rows " << rows
                                                    << " in " << in << " out " << out << " accumulate " << accumulate;
          EXPECT_LE(relative_error(y_pieces, want), 2e-6f)
              << "pieces " << (out_major ? "[out, in]" : "[in, out]") << " rows " << rows << " in " << in << " out "
              << out << " accumulate " << accumulate;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
