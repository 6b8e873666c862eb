// tests/gemma/test_gemma_torch.cpp — proves the Gemma definition (models/gemma.cpp: the decoder
// composition of kernels/ops.h operations with Gemma's options) computes Hugging Face
// GemmaForCausalLM's loss and every gradient: tiny models with random weights run through the
// definition's ops on the CPU backend as the trainer streams them (forward keeps only block
// inputs, the backward recomputes each block), against the independent float64 PyTorch Gemma in
// gemma_reference.py. Shapes: multi-query attention (4 query heads over 1 k/v head, as Gemma
// 2B) with head_dim 24 apart from n_embd / n_head = 10, tied (Gemma's); 6 query heads over 3
// with head_dim 16 and n_embd 80 (not a multiple of 6), untied; a head over two row chunks
// with loss masks. Norm weights are drawn around 0 (Gemma's gain is 1 + w). A Llama case runs
// the Llama definition against the same reference file with its Gemma switch off: the control
// that the harness and the reference agree where the answer is already known. Error per tensor:
// max|a − b| / max|b| ≤ 1e-5, the loss too. A second test runs each model twice and requires
// the same bits. Exit 77 without torch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>

#include <gtest/gtest.h>

#include "device/device.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "run/train_config.h"
#include "tests/support/reference_files.h"
#include "tests/support/temp_dir.h"

namespace {

using strata::ModelConfig;
using strata::Unit;
using strata::UnitTensor;
using strata::kernels::BatchShape;
using strata::testing::read_f64;
using strata::testing::relative_error;
using strata::testing::TempDir;

constexpr double kMaxRelativeError = 1e-5;
constexpr uint32_t kSeed = 2929;

struct Case {
  const char* name;
  ModelConfig model;
  BatchShape shape;
  bool masked = false;  // loss masks: the first third of each sequence -1, every 7th row -5
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ModelConfig decoder(const char* arch, uint32_t layers, uint32_t heads, uint32_t kv_heads, uint32_t head_dim,
                    uint32_t embd, uint32_t inter, uint32_t vocab, uint32_t ctx, bool tied) {
  ModelConfig m;
  m.arch = arch;
  m.n_layer = layers;
  m.n_head = heads;
  m.n_kv_head = kv_heads;
  m.head_dim = head_dim;
  m.n_embd = embd;
  m.intermediate_size = inter;
  m.vocab_size = vocab;
  m.seq_len = ctx;
  m.rope_theta = 10000.0;
  m.norm_eps = 1e-6;  // GemmaConfig's
  m.tie_word_embeddings = tied;
  return m;
}

const Case kCases[] = {
    {"gemma_mqa_tied", decoder("gemma", 2, 4, 1, 24, 40, 56, 67, 16, true), {2, 13}},
    {"gemma_gqa_untied", decoder("gemma", 2, 6, 3, 16, 80, 112, 67, 16, false), {2, 11}},
    // 320 rows: the head's loss over two row chunks, with masked targets.
    {"gemma_masked_chunks", decoder("gemma", 1, 2, 2, 16, 32, 40, 30, 16, true), {20, 16}, true},
    {"llama_control", decoder("llama", 2, 6, 3, 16, 80, 112, 67, 16, true), {2, 13}},
};

// 64-byte aligned fp32 scratch (the backend's workspace rule).
struct Aligned {
  explicit Aligned(size_t bytes)
      : size_bytes((bytes + 63) / 64 * 64), data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t size_bytes;
  float* data;
};

// A model's weights as the trainer holds them: one packed buffer per unit of the definition.
// Random: N(0, 0.1) matrices; RMSNorm weights N(0, 0.1) for Gemma (its gain is 1 + w) and
// 1 + N(0, 0.1) for Llama, so both gains sit near 1 and a wrong offset shows.
class TinyModel {
 public:
  TinyModel(const Case& c, uint32_t seed)
      : case_(c), definition_(strata::models::make_model_definition(c.model)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    const float norm_center = c.model.arch == "gemma" ? 0.0f : 1.0f;
    for (const Unit& unit : definition_->units()) {
      std::vector<float> values(unit.element_count);
      for (const UnitTensor& t : unit.tensors) {
        const bool is_norm = t.name.ends_with("norm.weight");
        for (uint64_t i = 0; i < t.element_count; ++i)
          values[t.offset_elements + i] = (is_norm ? norm_center : 0.0f) + normal(rng);
      }
      params_.push_back(std::move(values));
    }
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.model.vocab_size - 1));
    tokens_.resize(static_cast<size_t>(c.shape.rows()));
    targets_.resize(tokens_.size());
    for (auto& v : tokens_) v = token(rng);
    for (auto& v : targets_) v = token(rng);
    for (int64_t i = 0; c.masked && i < c.shape.rows(); ++i) {
      if (i % c.shape.seq_len < c.shape.seq_len / 3) targets_[static_cast<size_t>(i)] = -1;
      if (i % 7 == 3) targets_[static_cast<size_t>(i)] = -5;
    }
  }

  const strata::models::ModelDefinition& definition() const { return *definition_; }

  // One step through the definition's ops on a CPU backend; returns the loss and fills `grads`
  // (one buffer per unit, the params' layout).
  float run(std::vector<std::vector<float>>& grads) const {
    const BatchShape shape = case_.shape;
    const int64_t n = shape.rows();
    const int64_t c = case_.model.n_embd;
    auto device = strata::device::make_device(strata::device::Kind::cpu, uint64_t{64} << 20);
    EXPECT_TRUE(device.ok());
    auto made = strata::kernels::make_backend(**device, shape);
    EXPECT_TRUE(made.ok());
    strata::kernels::ComputeBackend& backend = **made;
    EXPECT_TRUE(backend.is_host());
    const strata::models::ModelDefinition& d = *definition_;
    Aligned ws_storage(d.workspace_size_bytes(backend, shape));
    const strata::kernels::Workspace ws{ws_storage.data, ws_storage.size_bytes};
    grads.clear();
    for (const auto& unit : params_) grads.emplace_back(unit.size(), 0.0f);
    const size_t last = d.final_unit();
    std::vector<std::vector<float>> acts(static_cast<size_t>(d.n_layer() + 1), std::vector<float>(size_t(n * c)));
    std::vector<float> d_x(static_cast<size_t>(n * c));
    EXPECT_TRUE(backend.begin_step({tokens_.data(), targets_.data(), n}).ok());
    EXPECT_TRUE(d.embedding_forward(backend, shape, params_[0].data(), acts[0].data()).ok());
    for (int64_t i = 0; i < d.n_layer(); ++i)
      EXPECT_TRUE(d.block_forward(backend, shape, params_[d.block_unit(i)].data(), acts[size_t(i)].data(),
                                  acts[size_t(i) + 1].data(), ws)
                      .ok());
    EXPECT_TRUE(d.head_forward_backward(backend, shape, params_[last].data(), params_[0].data(), acts.back().data(),
                                        d_x.data(), grads[last].data(), grads[0].data(), ws)
                    .ok());
    for (int64_t i = d.n_layer(); i-- > 0;)
      EXPECT_TRUE(d.block_backward(backend, shape, params_[d.block_unit(i)].data(), acts[size_t(i)].data(),
                                   d_x.data(), d_x.data(), grads[d.block_unit(i)].data(), ws, /*recompute=*/true)
                      .ok());
    EXPECT_TRUE(d.embedding_backward(backend, shape, d_x.data(), grads[0].data()).ok());
    auto scalars = backend.end_step();
    EXPECT_TRUE(scalars.ok());
    return scalars.ok() ? static_cast<float>(scalars->loss) : NAN;
  }

  void write(const std::filesystem::path& folder) const {
    const ModelConfig& m = case_.model;
    std::filesystem::create_directories(folder);
    std::ofstream cfg(folder / "config.txt");
    cfg.precision(17);
    cfg << "n_layer " << m.n_layer << "\nn_head " << m.n_head << "\nn_kv_head " << m.kv_heads() << "\nhead_dim "
        << m.head_size() << "\nn_embd " << m.n_embd << "\nvocab_size " << m.vocab_size << "\nbatch "
        << case_.shape.batch << "\nseq_len " << case_.shape.seq_len << "\nrope_theta " << m.rope_theta
        << "\nnorm_eps " << m.norm_eps << "\ntied " << (m.tie_word_embeddings ? 1 : 0) << "\ngemma "
        << (m.arch == "gemma" ? 1 : 0) << "\n";
    std::ofstream list(folder / "tensors.txt");
    const auto& units = definition_->units();
    for (size_t u = 0; u < units.size(); ++u) {
      for (const UnitTensor& t : units[u].tensors) {
        list << t.name;
        for (int64_t extent : t.shape) list << ' ' << extent;
        list << '\n';
        strata::testing::write_raw((folder / (t.name + ".f32")).string(), params_[u].data() + t.offset_elements,
                                   t.element_count);
      }
    }
    strata::testing::write_raw((folder / "tokens.i32").string(), tokens_.data(), tokens_.size());
    strata::testing::write_raw((folder / "targets.i32").string(), targets_.data(), targets_.size());
  }

 private:
  Case case_;
  std::unique_ptr<const strata::models::ModelDefinition> definition_;
  std::vector<std::vector<float>> params_;
  std::vector<int32_t> tokens_, targets_;
};

class GemmaMatchesTorch : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string command = std::string(STRATA_PYTHON3) + " " + STRATA_GEMMA_REFERENCE;
    for (const Case& c : kCases) {
      TinyModel(c, kSeed).write(dir_->path() / c.name);
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

TempDir* GemmaMatchesTorch::dir_ = nullptr;
int GemmaMatchesTorch::reference_rc_ = -1;

TEST_P(GemmaMatchesTorch, LossAndEveryGradient) {
  if (WIFEXITED(reference_rc_) && WEXITSTATUS(reference_rc_) == 77) GTEST_SKIP() << "PyTorch is not importable";
  ASSERT_EQ(reference_rc_, 0) << "the PyTorch reference script failed";
  const Case& c = GetParam();
  const TinyModel model(c, kSeed);
  ASSERT_STREQ(model.definition().arch(), c.model.arch.c_str());
  const std::string out = (dir_->path() / c.name / "out").string();
  std::vector<std::vector<float>> grads;
  const float loss = model.run(grads);
  const double ref_loss = read_f64(out + "/loss.f64", 1)[0];
  const double loss_error = std::abs(loss - ref_loss) / std::abs(ref_loss);
  std::printf("%s: loss ours %.8f reference %.8f relative error %.2e\n", c.name, loss, ref_loss, loss_error);
  EXPECT_LE(loss_error, kMaxRelativeError);
  double worst = 0.0;
  size_t checked = 0;
  const auto& units = model.definition().units();
  for (size_t u = 0; u < units.size(); ++u) {
    for (const UnitTensor& t : units[u].tensors) {
      const std::vector<double> reference = read_f64(out + "/" + t.name + ".grad.f64", t.element_count);
      const double error = relative_error(grads[u].data() + t.offset_elements, reference);
      std::printf("  %-45s relative error %.2e\n", t.name.c_str(), error);
      EXPECT_LE(error, kMaxRelativeError) << "gradient of " << t.name;
      worst = std::max(worst, error);
      ++checked;
    }
  }
  std::printf("%s: %zu gradients checked, worst relative error %.2e\n", c.name, checked, worst);
}

// Two runs, same bits: every reduction of every op has one fixed order.
TEST_P(GemmaMatchesTorch, Deterministic) {
  const TinyModel model(GetParam(), kSeed);
  std::vector<std::vector<float>> a, b;
  const float loss_a = model.run(a);
  const float loss_b = model.run(b);
  EXPECT_EQ(std::memcmp(&loss_a, &loss_b, sizeof loss_a), 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t u = 0; u < a.size(); ++u)
    EXPECT_EQ(std::memcmp(a[u].data(), b[u].data(), a[u].size() * 4), 0) << "unit " << u;
}

INSTANTIATE_TEST_SUITE_P(Models, GemmaMatchesTorch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The definition itself: Llama's names and shapes (a checkpoint is a name lookup), Gemma's init
// (RMSNorm weights 0: the gain 1 + w starts at 1, as GemmaPreTrainedModel; matrices and the
// embedding normal(init_std)), no biases, tied or not, and it decodes (generation takes it).
TEST(GemmaDefinition, UnitsNamesAndInit) {
  ModelConfig gemma = decoder("gemma", 2, 4, 1, 24, 40, 56, 67, 16, true);
  ModelConfig llama = gemma;
  llama.arch = "llama";
  const auto g = strata::models::make_model_definition(gemma);
  const auto l = strata::models::make_model_definition(llama);
  EXPECT_STREQ(g->arch(), "gemma");
  ASSERT_EQ(g->units().size(), l->units().size());
  for (size_t u = 0; u < g->units().size(); ++u) {
    const Unit& gu = g->units()[u];
    const Unit& lu = l->units()[u];
    EXPECT_EQ(gu.name, lu.name);
    ASSERT_EQ(gu.tensors.size(), lu.tensors.size()) << gu.name;
    for (size_t t = 0; t < gu.tensors.size(); ++t) {
      const UnitTensor& gt = gu.tensors[t];
      EXPECT_EQ(gt.name, lu.tensors[t].name);
      EXPECT_EQ(gt.shape, lu.tensors[t].shape) << gt.name;
      EXPECT_EQ(gt.weight_decay, lu.tensors[t].weight_decay) << gt.name;
      if (gt.name.ends_with("norm.weight")) {
        EXPECT_EQ(gt.init_std, 0.0) << gt.name;
        EXPECT_EQ(gt.init_value, 0.0f) << gt.name;
      } else {
        EXPECT_EQ(gt.init_std, gemma.init_std) << gt.name;
      }
    }
  }
  EXPECT_TRUE(g->head_tied());
  EXPECT_EQ(g->units().back().tensors.size(), 1u);  // model.norm.weight only: the head is the embedding
  ModelConfig untied = gemma;
  untied.tie_word_embeddings = false;
  EXPECT_EQ(strata::models::make_model_definition(untied)->units().back().tensors.back().name, "lm_head.weight");
  EXPECT_EQ(g->block_linears().size(), 7u);  // q, k, v, o, gate, up, down: LoRA's targets as Llama's
}

}  // namespace
