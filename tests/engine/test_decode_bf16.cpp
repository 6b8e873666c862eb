// tests/engine/test_decode_bf16.cpp — decoding on bf16 weights (kernels/backend.h, "generation on
// bf16 weights"): the CPU backend's fused ops, which multiply the bf16 matrices without widening a
// unit, give the logits of widening the weights and running the fp32 ops, up to fp32 summation
// order; and the base class's default (what CUDA runs: widen into the scratch, then the fp32 op)
// gives them bit for bit.
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
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/gpt2/gpt2.h"
#include "kernels/llama/llama.h"
#include "kernels/optim/cast.h"
#include "device/device.h"

namespace strata {
namespace {

namespace gk = kernels::gpt2;
namespace lk = kernels::llama;

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

// The three paths of one model, each with its own KV caches and activations.
enum Path { kFp32 = 0, kFused = 1, kWidenDefault = 2 };
constexpr int kPaths = 3;

struct Caches {
  Caches(int64_t layers, int64_t window, int64_t width)
      : keys(static_cast<size_t>(layers), std::vector<float>(static_cast<size_t>(window * width))),
        values(keys) {}
  gk::KvCacheBlock block(int64_t i, int64_t window) {
    return gk::KvCacheBlock{keys[static_cast<size_t>(i)].data(), values[static_cast<size_t>(i)].data(), window};
  }
  std::vector<std::vector<float>> keys, values;
};

// Runs passes of `rows` new rows (x0 random, the same for every path) through the blocks and
// the head on each path, comparing the logits after each.
template <typename RunPass>
void decode_and_compare(int64_t window, int64_t c, int64_t vocab, const RunPass& run_pass, const char* model) {
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
    const float error = relative_error(logits[kFused], logits[kFp32]);
    worst = std::max(worst, error);
    EXPECT_LE(error, 1e-5f) << model << ": fused bf16 vs widened fp32, pass of " << rows << " rows after " << past;
    EXPECT_EQ(logits[kWidenDefault], logits[kFp32])
        << model << ": the base class's widen-then-fp32 default, pass of " << rows << " rows after " << past;
    past += rows;
    ++passes;
  }
  EXPECT_EQ(past, window);
  std::printf("%s: %d passes, worst relative logit error fused vs fp32 %.2e\n", model, passes, worst);
}

TEST(DecodeBf16, Gpt2FusedMatchesWidenedFp32) {
  const gk::Config kc{2, 4, 80, 97, 20};
  const int64_t c = kc.n_embd;
  const int64_t window = kc.n_ctx;
  const auto specs = gk::block_param_specs(kc);
  std::vector<Bf16Tensor> blocks;
  for (int64_t i = 0; i < kc.n_layer; ++i) {
    Bf16Tensor block = random_bf16(static_cast<size_t>(gk::block_param_count(kc)), 0.25f, 0.0f, 7 + i);
    // LayerNorm gains near 1 (offsets of specs 0 and 6: ln_1.weight, ln_2.weight).
    int64_t offset = 0;
    for (int s = 0; s < gk::kBlockParamCount; ++s) {
      if (s == 0 || s == 6)
        for (int64_t j = 0; j < c; ++j) {
          block.bits[offset + j] = kernels::fp32_to_bf16_bits(1.0f + 0.01f * static_cast<float>(j % 7));
          block.widened[offset + j] = kernels::bf16_bits_to_fp32(block.bits[offset + j]);
        }
      offset += specs[s].numel();
    }
    blocks.push_back(std::move(block));
  }
  const Bf16Tensor ln_f = random_bf16(static_cast<size_t>(2 * c), 0.1f, 0.5f, 21);
  const Bf16Tensor wte = random_bf16(static_cast<size_t>(kc.vocab_size * c), 0.3f, 0.0f, 22);

  auto device = device::make_device(device::Kind::cpu, 1 << 20);
  ASSERT_TRUE(device.ok());
  auto made = kernels::make_backend(**device, gk::BatchShape{1, 8});
  ASSERT_TRUE(made.ok());
  kernels::ComputeBackend& backend = **made;
  EXPECT_EQ(kernels::decode_bf16_scratch_bytes(device::Kind::cpu, kc), backend.decode_bf16_scratch_bytes(kc));
  Aligned workspace(backend.decode_workspace_size_bytes(kc, 6, window));
  Aligned fused_scratch(backend.decode_bf16_scratch_bytes(kc));
  Aligned default_scratch(backend.ComputeBackend::decode_bf16_scratch_bytes(kc));
  std::vector<Caches> caches(kPaths, Caches(kc.n_layer, window, c));
  std::vector<float> x(static_cast<size_t>(6 * c)), y(x.size());

  auto run_pass = [&](Path path, int64_t past, int64_t rows, const std::vector<float>& x0, std::vector<float>& logits) {
    std::copy(x0.begin(), x0.end(), x.begin());
    for (int64_t i = 0; i < kc.n_layer; ++i) {
      const Bf16Tensor& w = blocks[static_cast<size_t>(i)];
      const gk::KvCacheBlock cache = caches[path].block(i, window);
      Status status;
      if (path == kFp32)
        status = backend.block_decode(kc, past, rows, gk::bind_block(kc, static_cast<const float*>(w.widened.data())),
                                      x.data(), y.data(), cache, workspace.workspace());
      else if (path == kFused)
        status = backend.block_decode_bf16(kc, past, rows, gk::bind_block(kc, static_cast<const uint16_t*>(w.bits.data())),
                                           x.data(), y.data(), cache, workspace.workspace(), fused_scratch.workspace());
      else
        status = backend.ComputeBackend::block_decode_bf16(
            kc, past, rows, gk::bind_block(kc, static_cast<const uint16_t*>(w.bits.data())), x.data(), y.data(), cache,
            workspace.workspace(), default_scratch.workspace());
      ASSERT_TRUE(status.ok()) << status.to_string();
      std::swap(x, y);
    }
    Status status;
    if (path == kFp32)
      status = backend.head_logits(kc, rows, gk::HeadWeights{ln_f.widened.data(), ln_f.widened.data() + c, wte.widened.data()},
                                   x.data(), logits.data(), workspace.workspace());
    else if (path == kFused)
      status = backend.head_logits_bf16(kc, rows, gk::HeadWeightsBf16{ln_f.bits.data(), ln_f.bits.data() + c, wte.bits.data()},
                                        x.data(), logits.data(), workspace.workspace(), fused_scratch.workspace());
    else
      status = backend.ComputeBackend::head_logits_bf16(
          kc, rows, gk::HeadWeightsBf16{ln_f.bits.data(), ln_f.bits.data() + c, wte.bits.data()}, x.data(),
          logits.data(), workspace.workspace(), default_scratch.workspace());
    ASSERT_TRUE(status.ok()) << status.to_string();
  };
  decode_and_compare(window, c, kc.vocab_size, run_pass, "gpt2");
}

// The Llama checks, with or without the attention biases (Qwen 2's q/k/v; HF Llama's
// attention_bias adds o_proj's), which the bf16 paths widen apart from the matrices.
void check_llama_decode(bool qkv_bias, bool o_bias, const char* what) {
  lk::Config kc;
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
  kc.rope_theta = 10000.0;
  kc.tie_word_embeddings = false;
  const int64_t c = kc.n_embd;
  const int64_t window = kc.n_ctx;
  const auto specs = lk::block_param_specs(kc);
  std::vector<Bf16Tensor> blocks;
  for (int64_t i = 0; i < kc.n_layer; ++i) {
    Bf16Tensor block = random_bf16(static_cast<size_t>(lk::block_param_count(kc)), 0.25f, 0.0f, 31 + i);
    int64_t offset = 0;
    for (size_t s = 0; s < specs.size(); ++s) {  // RMSNorm gains near 1; biases stay random
      if (specs[s].name_suffix.find("layernorm") != std::string_view::npos)
        for (int64_t j = 0; j < c; ++j) {
          block.bits[offset + j] = kernels::fp32_to_bf16_bits(1.0f - 0.01f * static_cast<float>(j % 5));
          block.widened[offset + j] = kernels::bf16_bits_to_fp32(block.bits[offset + j]);
        }
      offset += specs[s].numel();
    }
    blocks.push_back(std::move(block));
  }
  const Bf16Tensor norm = random_bf16(static_cast<size_t>(c), 0.1f, 1.0f, 41);
  const Bf16Tensor lm_head = random_bf16(static_cast<size_t>(kc.vocab_size * c), 0.3f, 0.0f, 42);

  auto device = device::make_device(device::Kind::cpu, 1 << 20);
  ASSERT_TRUE(device.ok());
  auto made = kernels::make_backend(**device, gk::BatchShape{1, 8});
  ASSERT_TRUE(made.ok());
  kernels::ComputeBackend& backend = **made;
  EXPECT_EQ(kernels::decode_bf16_scratch_bytes(device::Kind::cpu, kc), backend.llama_decode_bf16_scratch_bytes(kc));
  Aligned workspace(backend.llama_decode_workspace_size_bytes(kc, 6, window));
  Aligned fused_scratch(backend.llama_decode_bf16_scratch_bytes(kc));
  Aligned default_scratch(backend.ComputeBackend::llama_decode_bf16_scratch_bytes(kc));
  std::vector<Caches> caches(kPaths, Caches(kc.n_layer, window, kc.kv_width()));
  std::vector<float> x(static_cast<size_t>(6 * c)), y(x.size());

  auto run_pass = [&](Path path, int64_t past, int64_t rows, const std::vector<float>& x0, std::vector<float>& logits) {
    std::copy(x0.begin(), x0.end(), x.begin());
    for (int64_t i = 0; i < kc.n_layer; ++i) {
      const Bf16Tensor& w = blocks[static_cast<size_t>(i)];
      const gk::KvCacheBlock cache = caches[path].block(i, window);
      Status status;
      if (path == kFp32)
        status = backend.llama_block_decode(kc, past, rows, lk::bind_block(kc, static_cast<const float*>(w.widened.data())),
                                            x.data(), y.data(), cache, workspace.workspace());
      else if (path == kFused)
        status = backend.llama_block_decode_bf16(kc, past, rows,
                                                 lk::bind_block(kc, static_cast<const uint16_t*>(w.bits.data())),
                                                 x.data(), y.data(), cache, workspace.workspace(),
                                                 fused_scratch.workspace());
      else
        status = backend.ComputeBackend::llama_block_decode_bf16(
            kc, past, rows, lk::bind_block(kc, static_cast<const uint16_t*>(w.bits.data())), x.data(), y.data(), cache,
            workspace.workspace(), default_scratch.workspace());
      ASSERT_TRUE(status.ok()) << status.to_string();
      std::swap(x, y);
    }
    Status status;
    if (path == kFp32)
      status = backend.llama_head_logits(kc, rows, lk::HeadWeights{norm.widened.data(), lm_head.widened.data()}, x.data(),
                                         logits.data(), workspace.workspace());
    else if (path == kFused)
      status = backend.llama_head_logits_bf16(kc, rows, lk::HeadWeightsBf16{norm.bits.data(), lm_head.bits.data()},
                                              x.data(), logits.data(), workspace.workspace(), fused_scratch.workspace());
    else
      status = backend.ComputeBackend::llama_head_logits_bf16(
          kc, rows, lk::HeadWeightsBf16{norm.bits.data(), lm_head.bits.data()}, x.data(), logits.data(),
          workspace.workspace(), default_scratch.workspace());
    ASSERT_TRUE(status.ok()) << status.to_string();
  };
  decode_and_compare(window, c, kc.vocab_size, run_pass, what);
}

TEST(DecodeBf16, LlamaGqaFusedMatchesWidenedFp32) { check_llama_decode(false, false, "llama"); }
TEST(DecodeBf16, Qwen2BiasesFusedMatchWidenedFp32) { check_llama_decode(true, false, "qwen2 q/k/v biases"); }
TEST(DecodeBf16, LlamaAttentionBiasFusedMatchesWidenedFp32) { check_llama_decode(true, true, "llama attention_bias"); }

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
