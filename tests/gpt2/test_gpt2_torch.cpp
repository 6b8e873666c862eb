// tests/gpt2/test_gpt2_torch.cpp — proves the CPU GPT-2 kernels compute Hugging Face GPT-2's
// loss and every gradient: a small model with random weights and tokens is run through the
// per-block API (streaming: block_backward recomputes each block), and the loss, all 4 + 12·L
// gradients and the last-position logits are compared with a float64 PyTorch reference
// (gpt2_reference.py, run by Debian's /usr/bin/python3). Error metric, per tensor:
// max|a − b| / max|b| with a = ours (fp32), b = reference; it must be ≤ 1e-5. Two cases mask
// targets (negative = not trained) and one divides by a caller's token count N.
// Exits 77 (skip) with a message when /usr/bin/python3 cannot import torch.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/gpt2/gpt2_test_model.h"
#include "tests/support/reference_files.h"
#include "tests/support/temp_dir.h"

namespace {

using strata::testing::BackwardMode;
using strata::testing::read_f64;
using strata::testing::relative_error;
using strata::testing::write_raw;
using strata::testing::TempDir;
using strata::testing::TinyGpt2;
namespace g2 = strata::reference::gpt2;

constexpr double kMaxRelativeError = 1e-5;

struct Case {
  const char* name;
  g2::Config config;
  g2::BatchShape shape;
  strata::testing::Masks masks = strata::testing::Masks::none;
  int64_t loss_normalizer_tokens = 0;  // N (kernels/ops.h, "Loss masks"); 0 = the trained count
};

const Case kCases[] = {
    // The acceptance model: 2 layers, 4 heads, 64 wide, vocab 97, seq 16, batch 3.
    {"acceptance", {2, 4, 64, 97, 16}, {3, 16}},
    // Ragged sizes: head_dim 12 and T 13 (vector tails), seq_len < n_ctx, 3 layers.
    {"ragged", {3, 4, 48, 61, 20}, {2, 13}},
    // 320 rows > kHeadChunkRows: the head works in two chunks.
    {"head_chunks", {1, 2, 32, 50, 16}, {20, 16}},
    // Products bigger than one 256×512 GEMM tile in both M and N (288 rows; 4C = 640,
    // vocab 600), so every tile offset, transposed or not, is exercised.
    {"gemm_tiles", {1, 4, 160, 600, 96}, {3, 96}},
    // Loss masks: a masked prompt and scattered negatives, over two head chunks; the loss is
    // torch's cross_entropy(ignore_index, reduction='sum') / (trained count).
    {"masked", {2, 4, 64, 97, 16}, {20, 16}, strata::testing::Masks::prompt, 0},
    // The same divided by a caller's N, as one micro-batch of an accumulated update.
    {"masked_normalizer", {2, 4, 64, 97, 16}, {3, 16}, strata::testing::Masks::prompt, 101},
};

constexpr uint32_t kSeed = 1234;

// Writes one model's weights, tokens and targets into `folder` for the reference script.
void write_model(const TinyGpt2& model, const std::filesystem::path& folder) {
  std::filesystem::create_directories(folder);
  const g2::Config& cfg = model.config();
  std::ofstream config(folder / "config.txt");
  config << cfg.n_layer << ' ' << cfg.n_head << ' ' << cfg.n_embd << ' ' << cfg.vocab_size << ' '
         << cfg.n_ctx << ' ' << model.shape().batch << ' ' << model.shape().seq_len << '\n';
  std::ofstream list(folder / "tensors.txt");
  for (const auto& t : model.tensors()) {
    list << t.name << ' ' << t.rows << ' ' << t.cols << '\n';
    write_raw((folder / (t.name + ".f32")).string(), model.params().data() + t.offset,
              static_cast<size_t>(t.numel()));
  }
  write_raw((folder / "tokens.i32").string(), model.tokens().data(), model.tokens().size());
  write_raw((folder / "targets.i32").string(), model.targets().data(), model.targets().size());
  std::ofstream(folder / "normalizer.txt") << model.loss_normalizer_tokens() << '\n';
}

TinyGpt2 make_model(const Case& c) {
  TinyGpt2 model(c.config, c.shape, kSeed);
  model.set_masks(c.masks, c.loss_normalizer_tokens);
  return model;
}

class Gpt2MatchesTorch : public ::testing::TestWithParam<Case> {
 protected:
  // One Python start-up (importing torch dominates) computes the reference for every case.
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string command = std::string(STRATA_PYTHON3) + " " + STRATA_GPT2_REFERENCE;
    for (const Case& c : kCases) {
      write_model(make_model(c), dir_->path() / c.name);
      command += " " + (dir_->path() / c.name).string();
    }
    reference_rc_ = std::system(command.c_str());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
  static int reference_rc_;
};

TempDir* Gpt2MatchesTorch::dir_ = nullptr;
int Gpt2MatchesTorch::reference_rc_ = -1;

TEST_P(Gpt2MatchesTorch, LossGradientsAndLogits) {
  ASSERT_EQ(reference_rc_, 0) << "the PyTorch reference script failed";
  const Case& c = GetParam();
  const TinyGpt2 model = make_model(c);
  const std::string out = (dir_->path() / c.name / "out").string();

  std::vector<float> grads;
  const float loss = model.loss_and_grads(BackwardMode::recompute_streaming, grads);
  const double ref_loss = read_f64(out + "/loss.f64", 1)[0];
  const double loss_error = std::abs(loss - ref_loss) / std::abs(ref_loss);
  std::printf("loss ours %.8f reference %.8f relative error %.2e\n", loss, ref_loss, loss_error);
  EXPECT_LE(loss_error, kMaxRelativeError);

  double worst = 0.0;
  std::string worst_name;
  for (const auto& t : model.tensors()) {
    const std::vector<double> ref =
        read_f64(out + "/" + t.name + ".grad.f64", static_cast<size_t>(t.numel()));
    const double error = relative_error(grads.data() + t.offset, ref);
    EXPECT_LE(error, kMaxRelativeError) << "gradient of " << t.name;
    if (error >= worst) {
      worst = error;
      worst_name = t.name;
    }
  }
  std::printf("%zu gradients checked, worst relative error %.2e (%s)\n", model.tensors().size(),
              worst, worst_name.c_str());

  const std::vector<float> logits = model.last_logits();
  const double logits_error = relative_error(
      logits.data(), read_f64(out + "/logits_last.f64", logits.size()));
  std::printf("last-position logits relative error %.2e\n", logits_error);
  EXPECT_LE(logits_error, kMaxRelativeError);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Gpt2MatchesTorch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace

int main(int argc, char** argv) {
  // Skip the whole binary (exit 77) when the reference cannot run, saying why.
  const std::string probe = std::string(STRATA_PYTHON3) + " -c 'import torch' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    std::fprintf(stderr,
                 "SKIP: %s cannot import torch; install Debian's python3-torch to run the "
                 "GPT-2 reference checks\n",
                 STRATA_PYTHON3);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
