// tests/engine/test_generate.cpp — generation's pieces: the KV-cache decode (the GPT-2
// definition's decode methods through the CPU backend) gives the logits a full-sequence forward gives, at every position,
// for a prompt of several tokens and then one token at a time; and the sampler is greedy at
// temperature 0, reproducible by seed, follows softmax(logits / T) and respects top-p.
//
// How: a random GPT-2 from the layout's initializer (std 0.2, so logits are far from flat);
// logits compared as max|a − b| / max|b| ≤ 1e-5 per position. The sampler's frequencies are
// checked over 40,000 draws against the exact probabilities (±0.01, > 6 standard deviations).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "generate/generate.h"
#include "models/model.h"
#include "models/model_layout.h"
#include "kernels/backend.h"
#include "tests/reference/gpt2_reference.h"
#include "device/device.h"

namespace strata {
namespace {

namespace gk = reference::gpt2;

struct Aligned {
  explicit Aligned(size_t bytes) : size_bytes((bytes + 63) / 64 * 64), data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {}
  ~Aligned() { std::free(data); }
  size_t size_bytes;
  float* data;
};

TEST(Decode, KvCacheLogitsMatchTheFullSequenceForward) {
  ModelConfig model;
  model.n_layer = 3;
  model.n_head = 4;
  model.n_embd = 64;
  model.vocab_size = 97;
  model.seq_len = 24;
  model.init_std = 0.2;
  const ModelLayout layout(model);
  const gk::Config kc = models::gpt2_shape_config(model);
  std::vector<std::vector<float>> weights(layout.units().size());
  for (size_t u = 0; u < weights.size(); ++u) {
    weights[u].resize(layout.units()[u].element_count);
    layout.initialize_unit(u, 7, weights[u].data());
  }
  const float* embed = weights[layout.embed_unit()].data();
  const float* ln_f = weights[layout.ln_f_unit()].data();
  const gk::HeadWeights head{ln_f, ln_f + kc.n_embd, embed};
  std::vector<int32_t> tokens(static_cast<size_t>(kc.n_ctx));
  std::mt19937 rng(3);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kc.vocab_size);

  // The reference: the whole prefix through block_forward for every length.
  const int64_t c = kc.n_embd;
  Aligned full_ws(gk::workspace_size_bytes(kc, gk::BatchShape{1, kc.n_ctx}));
  std::vector<float> a(static_cast<size_t>(kc.n_ctx * c)), b(a.size());
  auto full_logits = [&](int64_t t) {
    const gk::BatchShape shape{1, t};
    gk::embedding_forward(kc, shape, tokens.data(), embed, embed + kc.vocab_size * c, a.data());
    for (int64_t i = 0; i < kc.n_layer; ++i) {
      gk::block_forward(kc, shape, gk::bind_block(kc, static_cast<const float*>(weights[layout.block_unit(i)].data())),
                        a.data(), b.data(), gk::Workspace{full_ws.data, full_ws.size_bytes});
      std::swap(a, b);
    }
    std::vector<float> logits(static_cast<size_t>(kc.vocab_size));
    gk::head_forward(kc, shape, head, a.data(), logits.data(), gk::Workspace{full_ws.data, full_ws.size_bytes});
    return logits;
  };

  // The decode path: the definition's decode methods (what generation runs) through the CPU
  // backend, a prompt of 5, then one token at a time.
  auto device = device::make_device(device::Kind::cpu, 1 << 20);
  ASSERT_TRUE(device.ok());
  auto backend = kernels::make_backend(**device, gk::BatchShape{1, 8});
  ASSERT_TRUE(backend.ok());
  const auto definition = models::make_model_definition(model);
  const int64_t prompt = 5;
  Aligned ws(definition->decode_workspace_size_bytes(device::Kind::cpu, prompt, kc.n_ctx));
  const gk::Workspace workspace{ws.data, ws.size_bytes};
  std::vector<std::vector<float>> keys(static_cast<size_t>(kc.n_layer), std::vector<float>(static_cast<size_t>(kc.n_ctx * c)));
  std::vector<std::vector<float>> values = keys;
  std::vector<float> x(static_cast<size_t>(prompt * c)), y(x.size()), logits(static_cast<size_t>(kc.vocab_size));
  auto decode = [&](int64_t past, int64_t rows) {
    ASSERT_TRUE(definition->embedding_decode(**backend, past, rows, tokens.data() + past, embed, kc.vocab_size,
                                             embed + kc.vocab_size * c, x.data()).ok());
    for (int64_t i = 0; i < kc.n_layer; ++i) {
      const gk::KvCacheBlock cache{keys[static_cast<size_t>(i)].data(), values[static_cast<size_t>(i)].data(), kc.n_ctx};
      ASSERT_TRUE(definition->block_decode(**backend, past, rows, weights[layout.block_unit(i)].data(), x.data(),
                                           y.data(), cache, workspace).ok());
      std::swap(x, y);
    }
    ASSERT_TRUE(definition->head_logits(**backend, rows, ln_f, embed, kc.vocab_size, x.data(), logits.data(),
                                        workspace).ok());
  };
  int64_t past = 0;
  for (int64_t rows : {prompt, int64_t{1}}) {
    while (past + rows <= kc.n_ctx) {
      decode(past, rows);
      past += rows;
      const std::vector<float> want = full_logits(past);
      float scale = 0.0f, diff = 0.0f;
      for (size_t v = 0; v < want.size(); ++v) {
        scale = std::max(scale, std::abs(want[v]));
        diff = std::max(diff, std::abs(want[v] - logits[v]));
      }
      ASSERT_GT(scale, 0.5f);  // logits that are not flat, so the check means something
      EXPECT_LE(diff / scale, 1e-5f) << "after " << past << " positions";
      if (rows == prompt) break;  // the prompt once, then single tokens to the end of the window
    }
  }
  EXPECT_EQ(past, kc.n_ctx);
}

// The margin gpu-check's near-tie rule reads: best minus runner-up, wherever they sit; a tie is 0.
TEST(Sampling, Top2MarginIsBestMinusRunnerUp) {
  EXPECT_FLOAT_EQ(top2_margin(std::vector<float>{1.0f, 5.0f, 3.0f}), 2.0f);
  EXPECT_FLOAT_EQ(top2_margin(std::vector<float>{5.0f, 1.0f, 4.5f}), 0.5f);
  EXPECT_FLOAT_EQ(top2_margin(std::vector<float>{-2.0f, 7.0f, 7.0f}), 0.0f);
  EXPECT_FLOAT_EQ(top2_margin(std::vector<float>{3.0f}), 0.0f);
}

TEST(Sampling, GreedySeededTemperatureAndTopP) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -1.0f, std::log(2.0f) - 30.0f};
  std::vector<std::pair<float, int32_t>> order;
  std::mt19937_64 rng(1);
  SamplingOptions greedy;
  greedy.temperature = 0.0;
  EXPECT_EQ(sample_token(logits, greedy, rng, order), 1);

  SamplingOptions warm;
  warm.temperature = 1.0;
  std::map<int32_t, int> counts;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, warm, rng, order)];
  const double z = 1.0 + 3.0 + std::exp(-1.0) + 2.0 * std::exp(-30.0);
  EXPECT_NEAR(counts[0] / double(draws), 1.0 / z, 0.01);
  EXPECT_NEAR(counts[1] / double(draws), 3.0 / z, 0.01);
  EXPECT_NEAR(counts[2] / double(draws), std::exp(-1.0) / z, 0.01);

  // top_p 0.7: only token 1 (p ≈ 0.69) and token 0 make the nucleus; 0.5: token 1 alone.
  SamplingOptions nucleus = warm;
  nucleus.top_p = 0.7;
  counts.clear();
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, nucleus, rng, order)];
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[1] / double(draws), 0.75, 0.01);
  nucleus.top_p = 0.5;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(logits, nucleus, rng, order), 1);

  // The same seed, the same tokens; another seed, others.
  auto run = [&](uint64_t seed) {
    std::mt19937_64 r(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample_token(logits, warm, r, order));
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

}  // namespace
}  // namespace strata
