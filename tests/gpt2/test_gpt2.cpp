// tests/gpt2/test_gpt2.cpp — proves the GPT-2 kernels' contract beyond the math (which
// test_gpt2_torch checks against PyTorch): the streaming path (block_backward recomputing each
// block from its input) gives bit-for-bit the gradients of a pass that kept every block's
// activations; results are bit-identical run after run and across TBB and OpenBLAS thread
// counts; gradients accumulate (+=) while d_in is overwritten; d_in may alias d_out; the
// embedding backward sums repeated tokens; and the loss-only head agrees with the training head.
#include <cmath>
#include <cstring>
#include <vector>

#include <cblas.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include "tests/gpt2/gpt2_test_model.h"

namespace {

using strata::testing::AlignedFloats;
using strata::testing::BackwardMode;
using strata::testing::TinyGpt2;
namespace g2 = strata::reference::gpt2;

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Big enough that every product spans several 256×512 GEMM tiles (320 rows, 4C = 768,
// vocab 600) and every TBB loop has many tasks.
const g2::Config kMediumConfig{2, 4, 192, 600, 80};
const g2::BatchShape kMediumShape{4, 80};

TEST(Gpt2Streaming, RecomputeMatchesSavedActivationsBitForBit) {
  const TinyGpt2 model(kMediumConfig, kMediumShape, 7);
  std::vector<float> streamed;
  std::vector<float> saved;
  const float loss_streamed = model.loss_and_grads(BackwardMode::recompute_streaming, streamed);
  const float loss_saved = model.loss_and_grads(BackwardMode::saved_per_block, saved);
  EXPECT_EQ(std::memcmp(&loss_streamed, &loss_saved, sizeof(float)), 0);
  EXPECT_TRUE(bit_identical(streamed, saved));
  // And the gradients are not trivially zero.
  double norm = 0.0;
  for (float g : streamed) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 1e-6);
}

// The kernels split GEMMs into fixed tiles and run OpenBLAS single-threaded (resetting a
// caller's openblas_set_num_threads), so neither thread count may change a bit.
TEST(Gpt2Determinism, BitIdenticalAcrossRunsAndThreadCounts) {
  const TinyGpt2 model(kMediumConfig, kMediumShape, 11);
  std::vector<float> reference;
  const float reference_loss = model.loss_and_grads(BackwardMode::recompute_streaming, reference);
  for (int blas_threads : {1, 2}) {
    for (size_t tbb_threads : {size_t{1}, size_t{2}, size_t{3}}) {
      openblas_set_num_threads(blas_threads);
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, tbb_threads);
      std::vector<float> grads;
      const float loss = model.loss_and_grads(BackwardMode::recompute_streaming, grads);
      EXPECT_EQ(std::memcmp(&loss, &reference_loss, sizeof(float)), 0)
          << "blas threads asked " << blas_threads << ", tbb threads " << tbb_threads;
      EXPECT_TRUE(bit_identical(grads, reference))
          << "blas threads asked " << blas_threads << ", tbb threads " << tbb_threads;
      EXPECT_EQ(openblas_get_num_threads(), 1);
    }
  }
}

// One block's backward twice into the same gradients: the gradients double exactly (they
// accumulate) and d_in is the same both times (it is overwritten), aliased or not.
TEST(Gpt2Block, GradientsAccumulateAndDInIsOverwritten) {
  const g2::Config cfg{1, 4, 64, 97, 16};
  const g2::BatchShape shape{3, 16};
  const TinyGpt2 model(cfg, shape, 3);
  const int64_t act = shape.rows() * cfg.n_embd;
  std::vector<float> x(static_cast<size_t>(act));
  std::vector<float> d_out(static_cast<size_t>(act));
  for (int64_t i = 0; i < act; ++i) {
    x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
    d_out[static_cast<size_t>(i)] = 1e-2f * std::cos(0.11f * static_cast<float>(i));
  }
  const g2::BlockWeights weights =
      g2::bind_block(cfg, model.params().data() + model.offset_of("h.0.ln_1.weight"));
  AlignedFloats ws(g2::block_workspace_size_bytes(cfg, shape) / sizeof(float));
  const g2::Workspace workspace{ws.data(), ws.size() * sizeof(float)};

  std::vector<float> once(static_cast<size_t>(g2::block_param_count(cfg)), 0.0f);
  std::vector<float> twice = once;
  std::vector<float> d_in_once(static_cast<size_t>(act), 0.0f);
  std::vector<float> d_in_twice(static_cast<size_t>(act), 123.0f);  // garbage: must be ignored
  g2::block_backward(cfg, shape, weights, x.data(), d_out.data(), d_in_once.data(),
                     g2::bind_block(cfg, once.data()), workspace);
  for (int pass = 0; pass < 2; ++pass) {
    g2::block_backward(cfg, shape, weights, x.data(), d_out.data(), d_in_twice.data(),
                       g2::bind_block(cfg, twice.data()), workspace);
  }
  EXPECT_TRUE(bit_identical(d_in_once, d_in_twice));
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_EQ(twice[i], 2.0f * once[i]) << "gradient element " << i;
  }
  // d_in aliasing d_out gives the same d_in.
  std::vector<float> in_place = d_out;
  std::vector<float> scratch(once.size(), 0.0f);
  g2::block_backward(cfg, shape, weights, x.data(), in_place.data(), in_place.data(),
                     g2::bind_block(cfg, scratch.data()), workspace);
  EXPECT_TRUE(bit_identical(in_place, d_in_once));

  // recompute = false after block_forward on the same input gives the same result.
  std::vector<float> x_out(static_cast<size_t>(act));
  std::vector<float> saved(once.size(), 0.0f);
  std::vector<float> d_in_saved(static_cast<size_t>(act));
  g2::block_forward(cfg, shape, weights, x.data(), x_out.data(), workspace);
  g2::block_backward(cfg, shape, weights, x.data(), d_out.data(), d_in_saved.data(),
                     g2::bind_block(cfg, saved.data()), workspace, /*recompute=*/false);
  EXPECT_TRUE(bit_identical(saved, once));
  EXPECT_TRUE(bit_identical(d_in_saved, d_in_once));
}

// Repeated tokens and positions must all land in the gradient: compare with a naive sum.
TEST(Gpt2Embedding, BackwardSumsRepeatedTokensAndPositions) {
  const g2::Config cfg{1, 2, 40, 5, 8};  // C = 40: a full 16-column block and a ragged one
  const g2::BatchShape shape{6, 7};
  const int64_t c = cfg.n_embd;
  std::vector<int32_t> tokens(static_cast<size_t>(shape.rows()));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 3);
  std::vector<float> d_x0(static_cast<size_t>(shape.rows() * c));
  for (size_t i = 0; i < d_x0.size(); ++i) d_x0[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;
  std::vector<float> d_wte(static_cast<size_t>(cfg.vocab_size * c), 1.0f);
  std::vector<float> d_wpe(static_cast<size_t>(cfg.n_ctx * c), -1.0f);
  g2::embedding_backward(cfg, shape, tokens.data(), d_x0.data(), d_wte.data(), d_wpe.data());
  std::vector<double> want_wte(d_wte.size(), 1.0);
  std::vector<double> want_wpe(d_wpe.size(), -1.0);
  for (int64_t r = 0; r < shape.rows(); ++r) {
    for (int64_t j = 0; j < c; ++j) {
      want_wte[static_cast<size_t>(tokens[static_cast<size_t>(r)] * c + j)] +=
          d_x0[static_cast<size_t>(r * c + j)];
      want_wpe[static_cast<size_t>((r % shape.seq_len) * c + j)] +=
          d_x0[static_cast<size_t>(r * c + j)];
    }
  }
  // Quarter-steps sum exactly in float, so the match is exact.
  for (size_t i = 0; i < d_wte.size(); ++i) ASSERT_EQ(d_wte[i], want_wte[i]) << i;
  for (size_t i = 0; i < d_wpe.size(); ++i) ASSERT_EQ(d_wpe[i], want_wpe[i]) << i;
  // Positions past seq_len were never touched.
  EXPECT_EQ(d_wpe[static_cast<size_t>(7 * c)], -1.0f);
}

TEST(Gpt2Head, LossOnlyAgreesWithTrainingHead) {
  const g2::Config cfg{1, 2, 32, 50, 16};
  const g2::BatchShape shape{20, 16};  // 320 rows: more than one head chunk
  const TinyGpt2 model(cfg, shape, 5);
  const int64_t act = shape.rows() * cfg.n_embd;
  std::vector<float> x(static_cast<size_t>(act));
  for (int64_t i = 0; i < act; ++i) x[static_cast<size_t>(i)] = std::sin(0.013f * i * i);
  const float* params = model.params().data();
  const g2::HeadWeights head{params + model.offset_of("ln_f.weight"),
                             params + model.offset_of("ln_f.bias"),
                             params + model.offset_of("wte.weight")};
  AlignedFloats ws(g2::head_workspace_size_bytes(cfg, shape) / sizeof(float));
  const g2::Workspace workspace{ws.data(), ws.size() * sizeof(float)};
  std::vector<float> grads(model.params().size(), 0.0f);
  std::vector<float> d_x(static_cast<size_t>(act));
  const float train_loss = g2::head_forward_backward(
      cfg, shape, head, x.data(), model.targets().data(), d_x.data(),
      {grads.data() + model.offset_of("ln_f.weight"), grads.data() + model.offset_of("ln_f.bias"),
       grads.data() + model.offset_of("wte.weight")},
      workspace);
  const float eval_loss = g2::head_loss(cfg, shape, head, x.data(), model.targets().data(),
                                        workspace);
  EXPECT_EQ(train_loss, eval_loss);
  // Uniform-ish logits on random inputs: the loss is near ln(vocab), not 0 or inf.
  EXPECT_GT(train_loss, 0.5f * std::log(50.0f));
  EXPECT_LT(train_loss, 3.0f * std::log(50.0f));
}

// Proves a batch with no trained token (every target negative) gives loss 0 and gradients of
// exact zeros through the whole model — no 0/0 — and that a caller's N divides a masked
// batch's loss: the same batch with N = 2·count has exactly half the loss and the gradients of
// N = count (1/N is a power of two apart, so the halving is exact).
TEST(Gpt2Head, MaskedTargetsTrainNothingAndDivideByN) {
  const g2::Config cfg{2, 2, 32, 50, 16};
  const g2::BatchShape shape{3, 16};
  TinyGpt2 all_masked(cfg, shape, 9);
  all_masked.set_masks(strata::testing::Masks::all, 0);
  std::vector<float> grads;
  EXPECT_EQ(all_masked.loss_and_grads(BackwardMode::recompute_streaming, grads), 0.0f);
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], 0.0f) << i;

  TinyGpt2 masked(cfg, shape, 9);
  masked.set_masks(strata::testing::Masks::prompt, 0);
  const int64_t count = strata::kernels::count_trained_targets(masked.targets().data(), shape.rows());
  ASSERT_GT(count, 0);
  ASSERT_LT(count, shape.rows());
  std::vector<float> grads_count, grads_double;
  const float loss_count = masked.loss_and_grads(BackwardMode::recompute_streaming, grads_count);
  TinyGpt2 halved(cfg, shape, 9);
  halved.set_masks(strata::testing::Masks::prompt, 2 * count);
  const float loss_double = halved.loss_and_grads(BackwardMode::recompute_streaming, grads_double);
  // Every op of the backward is linear in the head's gradient, so halving it halves every
  // gradient exactly (no value here is near underflow).
  EXPECT_EQ(loss_double, 0.5f * loss_count);
  for (size_t i = 0; i < grads_count.size(); ++i) ASSERT_EQ(2.0f * grads_double[i], grads_count[i]) << i;
}

TEST(Gpt2Layout, ParameterSpecsMatchGpt2Small) {
  const g2::Config small{12, 12, 768, 50257, 1024};
  EXPECT_EQ(g2::model_param_count(small), 124439808);  // GPT-2 small, tied head
  const auto specs = g2::block_param_specs(small);
  EXPECT_EQ(specs[2].name_suffix, "attn.c_attn.weight");
  EXPECT_EQ(specs[2].shape[0], 768);
  EXPECT_EQ(specs[2].shape[1], 2304);
  EXPECT_TRUE(specs[2].weight_decay);
  EXPECT_FALSE(specs[3].weight_decay);
  EXPECT_FALSE(specs[0].weight_decay);
  EXPECT_EQ(g2::block_param_name(3, specs[10].name_suffix), "h.3.mlp.c_proj.weight");
  EXPECT_TRUE(g2::outer_param_specs(small)[0].weight_decay);   // wte
  EXPECT_FALSE(g2::outer_param_specs(small)[2].weight_decay);  // ln_f.weight
  // bind_block walks the packed layout in canonical order.
  std::vector<float> packed(static_cast<size_t>(g2::block_param_count(small)));
  const g2::BlockGrads bound = g2::bind_block(small, packed.data());
  EXPECT_EQ(bound.ln_1_weight, packed.data());
  EXPECT_EQ(bound.attn_c_attn_weight, packed.data() + 2 * 768);
  EXPECT_EQ(bound.mlp_c_proj_bias + 768, packed.data() + packed.size());
}

}  // namespace
