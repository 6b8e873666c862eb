// tests/lora/test_lora.cpp — proves the LoRA op (kernels/lora/lora.h) inside both models' CPU
// block kernels, and the frozen-base paths that LoRA training runs on:
// - against an independent float64 PyTorch block with PEFT's LoRA formula (lora_reference.py):
//   one GPT-2 block and one Llama block (grouped-query attention, q/k/v biases), an adapter on
//   every linear (rank 4, scale 2), without and with dropout 0.1 (the mask rebuilt in Python from
//   lora.h's integer hash): x_out, d_in, every d_A and d_B within 1e-5 relative (max|a−b|/max|b|);
// - bit for bit: a frozen base (a default BlockGrads{}) gives the full backward's d_in and adapter
//   gradients; a BlockAdapters that targets nothing gives the bits of no adapters at all; the
//   backward without recompute gives the recompute's; a frozen head (HeadGrads{}) gives the full
//   head's d_x_final;
// - each model's definition (models/, the ops the trainer runs) on the CPU backend of an
//   `emulated` device (through device buffers and its stream) gives the kernels' bits with
//   adapters, full and frozen; on CUDA within 1e-5; a frozen head through the definitions gives
//   the full head's d_x_final;
// - the dropout mask: p = 0 keeps everything, p = 0.1 keeps 90 % ± 0.5 % of 200k elements, and
//   keep() is the documented hash.
// Exit 77 (skip) for the PyTorch cases when torch is missing; the rest always runs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/reference/gpt2_reference.h"
#include "tests/reference/llama_reference.h"
#include "kernels/lora/lora.h"
#include "models/model.h"
#include "tests/backend/backend_harness.h"
#include "tests/support/reference_files.h"
#include "tests/support/temp_dir.h"

namespace {

namespace gk = strata::reference::gpt2;
namespace lk = strata::reference::llama;
namespace lora = strata::kernels::lora;
using strata::testing::read_f64;
using strata::testing::relative_error;
using strata::testing::TempDir;

constexpr double kMaxRelativeError = 1e-5;
constexpr int64_t kRank = 4;
constexpr float kScale = 2.0f;
constexpr uint64_t kMaskKey = 0x31'0000'0007'0003ull;  // (issue, step, block), any value will do

struct Case {
  const char* name;
  bool llama;
  float dropout;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Case kCases[] = {
    {"gpt2", false, 0.0f},
    {"gpt2_dropout", false, 0.1f},
    {"llama_gqa_bias", true, 0.0f},
    {"llama_gqa_bias_dropout", true, 0.1f},
};

gk::Config gpt2_config() { return gk::Config{1, 4, 32, 50, 16}; }
lk::Config llama_config() {
  lk::Config c;
  c.n_layer = 1;
  c.n_head = 6;
  c.n_kv_head = 3;
  c.head_dim = 8;
  c.n_embd = 40;
  c.intermediate_size = 56;
  c.vocab_size = 50;
  c.n_ctx = 16;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5;
  c.qkv_bias = true;
  return c;
}
constexpr gk::BatchShape kShape{2, 7};

// The definitions of gpt2_config() and llama_config() (`tied` for Llama's head), as the
// trainer makes them: their ops take a block's packed unit as the kernels bind it.
std::unique_ptr<const strata::models::ModelDefinition> definition(bool llama, bool tied = true) {
  strata::ModelConfig m;
  if (llama) {
    const lk::Config c = llama_config();
    m.arch = "llama";
    m.n_layer = static_cast<uint32_t>(c.n_layer);
    m.n_head = static_cast<uint32_t>(c.n_head);
    m.n_kv_head = static_cast<uint32_t>(c.n_kv_head);
    m.head_dim = static_cast<uint32_t>(c.head_dim);
    m.n_embd = static_cast<uint32_t>(c.n_embd);
    m.intermediate_size = static_cast<uint32_t>(c.intermediate_size);
    m.vocab_size = static_cast<uint32_t>(c.vocab_size);
    m.seq_len = static_cast<uint32_t>(c.n_ctx);
    m.rope_theta = c.rope_theta;
    m.norm_eps = c.norm_eps;
    m.qkv_bias = c.qkv_bias;
    m.o_proj_bias = c.o_bias;
    m.tie_word_embeddings = tied;
  } else {
    const gk::Config c = gpt2_config();
    m.arch = "gpt2";
    m.n_layer = static_cast<uint32_t>(c.n_layer);
    m.n_head = static_cast<uint32_t>(c.n_head);
    m.n_embd = static_cast<uint32_t>(c.n_embd);
    m.vocab_size = static_cast<uint32_t>(c.vocab_size);
    m.seq_len = static_cast<uint32_t>(c.n_ctx);
  }
  return strata::models::make_model_definition(m);
}

// 64-byte aligned fp32 scratch (the kernels assert it).
struct Aligned {
  explicit Aligned(size_t bytes)
      : size_bytes((bytes + 63) / 64 * 64), data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {
    std::memset(data, 0, size_bytes);
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  gk::Workspace workspace() const { return {data, size_bytes}; }
  size_t size_bytes;
  float* data;
};

std::vector<float> normal_floats(size_t count, float stddev, std::mt19937& rng, float mean = 0.0f) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Target {
  std::string name;  // the linear's HF name inside the block, as the reference keys it
  int64_t in = 0;
  int64_t out = 0;
};

struct Param {
  std::string name;
  std::vector<int64_t> dims;
  size_t offset = 0;
  size_t numel = 0;
};

// What one forward + backward of a block gives.
struct BlockRun {
  std::vector<float> x_out, d_in, grads;
  std::vector<std::vector<float>> d_a, d_b;
};

enum class Grads { full, frozen };
enum class Adapters { every_target, none_targeted, absent };

// One block of either model with an adapter on every linear, as host vectors: random base
// weights (N(0, 0.1); norm gains 1 + N(0, 0.1)), input N(0, 1), upstream gradient N(0, 0.1), A
// and B N(0, 0.2) (B nonzero, unlike PEFT's init, so every product is exercised).
class LoraBlock {
 public:
  LoraBlock(const Case& c, uint32_t seed) : case_(c) {
    std::mt19937 rng(seed);
    const int64_t n = kShape.rows();
    if (c.llama) {
      const lk::Config lc = llama_config();
      c_ = lc.n_embd;
      for (const gk::ParamSpec& spec : lk::block_param_specs(lc)) add_param(lk::block_param_name(0, spec.name_suffix), spec);
      const int64_t qw = lc.q_width(), kvw = lc.kv_width(), inter = lc.intermediate_size;
      targets_ = {{"self_attn.q_proj", c_, qw},   {"self_attn.k_proj", c_, kvw}, {"self_attn.v_proj", c_, kvw},
                  {"self_attn.o_proj", qw, c_},   {"mlp.gate_proj", c_, inter},  {"mlp.up_proj", c_, inter},
                  {"mlp.down_proj", inter, c_}};
    } else {
      const gk::Config gc = gpt2_config();
      c_ = gc.n_embd;
      for (const gk::ParamSpec& spec : gk::block_param_specs(gc)) add_param(gk::block_param_name(0, spec.name_suffix), spec);
      targets_ = {{"attn.c_attn", c_, 3 * c_}, {"attn.c_proj", c_, c_}, {"mlp.c_fc", c_, 4 * c_}, {"mlp.c_proj", 4 * c_, c_}};
    }
    params_.resize(param_floats_);
    for (const Param& p : params_info_) {
      const bool gain = p.name.ends_with("ln_1.weight") || p.name.ends_with("ln_2.weight") ||
                        p.name.ends_with("layernorm.weight");
      auto values = normal_floats(p.numel, 0.1f, rng, gain ? 1.0f : 0.0f);
      std::copy(values.begin(), values.end(), params_.begin() + static_cast<std::ptrdiff_t>(p.offset));
    }
    x_in_ = normal_floats(static_cast<size_t>(n * c_), 1.0f, rng);
    d_out_ = normal_floats(x_in_.size(), 0.1f, rng);
    for (const Target& t : targets_) {
      a_.push_back(normal_floats(static_cast<size_t>(kRank * t.in), 0.2f, rng));
      b_.push_back(normal_floats(static_cast<size_t>(t.out * kRank), 0.2f, rng));
    }
  }

  const std::vector<Target>& targets() const { return targets_; }
  lora::Spec spec() const { return lora::Spec{kRank, kScale, case_.dropout}; }
  size_t scratch_bytes() const {
    int64_t max_in = 0, max_out = 0;
    for (const Target& t : targets_) {
      max_in = std::max(max_in, t.in);
      max_out = std::max(max_out, t.out);
    }
    return lora::scratch_size_bytes(kShape.rows(), max_in, max_out, kRank, case_.dropout);
  }
  size_t workspace_bytes() const {
    return case_.llama ? lk::workspace_size_bytes(llama_config(), kShape)
                       : gk::workspace_size_bytes(gpt2_config(), kShape);
  }

  // Forward, then backward with recompute (the streaming trainer's path) — or without, on the
  // forward's activations.
  BlockRun run(Grads grads_kind, Adapters adapters_kind, bool recompute = true) const {
    Aligned ws(workspace_bytes()), scratch(scratch_bytes());
    BlockRun out;
    out.x_out.assign(x_in_.size(), 0.0f);
    out.d_in.assign(x_in_.size(), 0.0f);
    out.grads.assign(param_floats_, 0.0f);
    lora::BlockAdapters adapters;
    adapters.spec = spec();
    adapters.mask_key = kMaskKey;
    adapters.scratch = scratch.workspace();
    for (size_t i = 0; i < targets_.size(); ++i) {
      out.d_a.emplace_back(a_[i].size(), 0.0f);
      out.d_b.emplace_back(b_[i].size(), 0.0f);
      if (adapters_kind != Adapters::every_target) continue;
      adapters.adapters[i] = {a_[i].data(), b_[i].data()};
      adapters.grads[i] = {out.d_a[i].data(), out.d_b[i].data()};
    }
    const lora::BlockAdapters* ad = adapters_kind == Adapters::absent ? nullptr : &adapters;
    const float* w = params_.data();
    float* g = grads_kind == Grads::full ? out.grads.data() : nullptr;
    if (case_.llama) {
      const lk::Config lc = llama_config();
      const lk::BlockWeights weights = lk::bind_block(lc, w);
      const lk::BlockGrads grads = g == nullptr ? lk::BlockGrads{} : lk::bind_block(lc, g);
      if (adapters_kind == Adapters::absent) {  // the call as it was before adapters existed
        lk::block_forward(lc, kShape, weights, x_in_.data(), out.x_out.data(), ws.workspace());
        lk::block_backward(lc, kShape, weights, x_in_.data(), d_out_.data(), out.d_in.data(), grads, ws.workspace(),
                           recompute);
      } else {
        lk::block_forward(lc, kShape, weights, x_in_.data(), out.x_out.data(), ws.workspace(), {}, ad);
        lk::block_backward(lc, kShape, weights, x_in_.data(), d_out_.data(), out.d_in.data(), grads, ws.workspace(),
                           recompute, {}, ad);
      }
    } else {
      const gk::Config gc = gpt2_config();
      const gk::BlockWeights weights = gk::bind_block(gc, w);
      const gk::BlockGrads grads = g == nullptr ? gk::BlockGrads{} : gk::bind_block(gc, g);
      if (adapters_kind == Adapters::absent) {
        gk::block_forward(gc, kShape, weights, x_in_.data(), out.x_out.data(), ws.workspace());
        gk::block_backward(gc, kShape, weights, x_in_.data(), d_out_.data(), out.d_in.data(), grads, ws.workspace(),
                           recompute);
      } else {
        gk::block_forward(gc, kShape, weights, x_in_.data(), out.x_out.data(), ws.workspace(), {}, ad);
        gk::block_backward(gc, kShape, weights, x_in_.data(), d_out_.data(), out.d_in.data(), grads, ws.workspace(),
                           recompute, {}, ad);
      }
    }
    return out;
  }

  // The same through the model's definition on a backend (its device buffers and stream).
  BlockRun run_on(strata::testing::BackendEnv& env, Grads grads_kind) const {
    auto& backend = env.backend();
    const auto def = definition(case_.llama);
    float* w = env.upload(params_);
    float* x_in = env.upload(x_in_);
    float* d_out = env.upload(d_out_);
    float* x_out = env.zeros<float>(x_in_.size());
    float* d_in = env.zeros<float>(x_in_.size());
    float* g = grads_kind == Grads::full ? env.zeros<float>(param_floats_) : nullptr;
    const gk::Workspace ws = env.workspace_for(def->workspace_size_bytes(backend, kShape));
    lora::BlockAdapters adapters;
    adapters.spec = spec();
    adapters.mask_key = kMaskKey;
    adapters.scratch = env.workspace_for(scratch_bytes());
    std::vector<float*> d_a, d_b;
    for (size_t i = 0; i < targets_.size(); ++i) {
      d_a.push_back(env.zeros<float>(a_[i].size()));
      d_b.push_back(env.zeros<float>(b_[i].size()));
      adapters.adapters[i] = {env.upload(a_[i]), env.upload(b_[i])};
      adapters.grads[i] = {d_a[i], d_b[i]};
    }
    // g null: a frozen base (the definition's null block grads).
    EXPECT_TRUE(def->block_forward(backend, kShape, w, x_in, x_out, ws, &adapters).ok());
    EXPECT_TRUE(def->block_backward(backend, kShape, w, x_in, d_out, d_in, g, ws, true, &adapters).ok());
    BlockRun out;
    out.x_out = env.download(x_out, x_in_.size());
    out.d_in = env.download(d_in, x_in_.size());
    out.grads = g == nullptr ? std::vector<float>(param_floats_, 0.0f) : env.download(g, param_floats_);
    for (size_t i = 0; i < targets_.size(); ++i) {
      out.d_a.push_back(env.download(d_a[i], a_[i].size()));
      out.d_b.push_back(env.download(d_b[i], b_[i].size()));
    }
    return out;
  }

  void write(const std::filesystem::path& folder) const {
    std::filesystem::create_directories(folder);
    std::ofstream cfg(folder / "config.txt");
    cfg.precision(9);
    const lk::Config lc = llama_config();
    const gk::Config gc = gpt2_config();
    cfg << "model " << (case_.llama ? "llama" : "gpt2") << "\nn_head " << (case_.llama ? lc.n_head : gc.n_head)
        << "\nn_kv_head " << lc.n_kv_head << "\nhead_dim " << lc.head_dim << "\nn_embd " << c_ << "\nbatch "
        << kShape.batch << "\nseq_len " << kShape.seq_len << "\nrope_theta " << lc.rope_theta << "\nnorm_eps "
        << lc.norm_eps << "\nrank " << kRank << "\nscale " << kScale << "\ndropout " << case_.dropout
        << "\nmask_key " << kMaskKey << "\n";
    std::ofstream list(folder / "tensors.txt");
    for (const Param& p : params_info_) {
      list << p.name;
      for (int64_t d : p.dims) list << ' ' << d;
      list << '\n';
      strata::testing::write_raw((folder / (p.name + ".f32")).string(), params_.data() + p.offset, p.numel);
    }
    std::ofstream adapters(folder / "lora.txt");
    for (size_t i = 0; i < targets_.size(); ++i) {
      adapters << i << ' ' << targets_[i].name << ' ' << targets_[i].in << ' ' << targets_[i].out << '\n';
      const std::string stem = "lora." + std::to_string(i);
      strata::testing::write_raw((folder / (stem + ".A.f32")).string(), a_[i].data(), a_[i].size());
      strata::testing::write_raw((folder / (stem + ".B.f32")).string(), b_[i].data(), b_[i].size());
    }
    strata::testing::write_raw((folder / "x_in.f32").string(), x_in_.data(), x_in_.size());
    strata::testing::write_raw((folder / "d_out.f32").string(), d_out_.data(), d_out_.size());
  }

 private:
  void add_param(std::string name, const gk::ParamSpec& spec) {
    Param p{std::move(name), {spec.shape[0]}, param_floats_, static_cast<size_t>(spec.numel())};
    if (spec.rank == 2) p.dims.push_back(spec.shape[1]);
    param_floats_ += p.numel;
    params_info_.push_back(std::move(p));
  }

  Case case_;
  int64_t c_ = 0;
  std::vector<Param> params_info_;
  size_t param_floats_ = 0;
  std::vector<float> params_, x_in_, d_out_;
  std::vector<Target> targets_;
  std::vector<std::vector<float>> a_, b_;
};

constexpr uint32_t kSeed = 31;

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

// --- against float64 PyTorch ---

class LoraMatchesTorch : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string command = std::string(STRATA_PYTHON3) + " " + STRATA_LORA_REFERENCE;
    for (const Case& c : kCases) {
      LoraBlock(c, kSeed).write(dir_->path() / c.name);
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

TempDir* LoraMatchesTorch::dir_ = nullptr;
int LoraMatchesTorch::reference_rc_ = -1;

TEST_P(LoraMatchesTorch, OutputInputGradientAndAdapterGradients) {
  // 77: the script found no torch; 127: no python3 at all (a bare GPU machine) — torch is missing either way.
  if (WEXITSTATUS(reference_rc_) == 77 || WEXITSTATUS(reference_rc_) == 127) GTEST_SKIP() << "PyTorch is not importable";
  ASSERT_EQ(reference_rc_, 0) << "the PyTorch reference script failed";
  const Case& c = GetParam();
  const LoraBlock block(c, kSeed);
  const BlockRun run = block.run(Grads::full, Adapters::every_target);
  const std::string out = (dir_->path() / c.name / "out").string();
  const double x_error = relative_error(run.x_out.data(), read_f64(out + "/x_out.f64", run.x_out.size()));
  const double d_in_error = relative_error(run.d_in.data(), read_f64(out + "/d_in.f64", run.d_in.size()));
  EXPECT_LE(x_error, kMaxRelativeError) << "x_out";
  EXPECT_LE(d_in_error, kMaxRelativeError) << "d_in";
  double worst = 0.0;
  for (size_t i = 0; i < block.targets().size(); ++i) {
    const std::string stem = out + "/lora." + std::to_string(i);
    const double a_error = relative_error(run.d_a[i].data(), read_f64(stem + ".dA.f64", run.d_a[i].size()));
    const double b_error = relative_error(run.d_b[i].data(), read_f64(stem + ".dB.f64", run.d_b[i].size()));
    EXPECT_LE(a_error, kMaxRelativeError) << "d_A of " << block.targets()[i].name;
    EXPECT_LE(b_error, kMaxRelativeError) << "d_B of " << block.targets()[i].name;
    worst = std::max({worst, a_error, b_error});
  }
  std::printf("%s: x_out %.2e, d_in %.2e, worst adapter gradient %.2e (relative errors)\n", c.name, x_error,
              d_in_error, worst);
}

INSTANTIATE_TEST_SUITE_P(Blocks, LoraMatchesTorch, ::testing::ValuesIn(kCases), case_name);

// --- bit for bit on the CPU kernels ---

class LoraBits : public ::testing::TestWithParam<Case> {};

// A frozen base skips only the base's weight gradients: d_in and the adapters' grads are the
// full backward's bits, and two runs agree bit for bit.
TEST_P(LoraBits, FrozenBaseGivesTheFullBackwardsBits) {
  const LoraBlock block(GetParam(), kSeed);
  const BlockRun full = block.run(Grads::full, Adapters::every_target);
  const BlockRun frozen = block.run(Grads::frozen, Adapters::every_target);
  const BlockRun again = block.run(Grads::full, Adapters::every_target);
  EXPECT_TRUE(same_bits(full.x_out, frozen.x_out));
  EXPECT_TRUE(same_bits(full.d_in, frozen.d_in)) << "d_in";
  for (size_t i = 0; i < block.targets().size(); ++i) {
    EXPECT_TRUE(same_bits(full.d_a[i], frozen.d_a[i])) << "d_A of " << block.targets()[i].name;
    EXPECT_TRUE(same_bits(full.d_b[i], frozen.d_b[i])) << "d_B of " << block.targets()[i].name;
    EXPECT_TRUE(same_bits(full.d_a[i], again.d_a[i]) && same_bits(full.d_b[i], again.d_b[i]));
  }
  EXPECT_TRUE(same_bits(full.d_in, again.d_in) && same_bits(full.grads, again.grads));
  // The full run did form base gradients (the frozen one's stay all zero: never written).
  EXPECT_TRUE(std::any_of(full.grads.begin(), full.grads.end(), [](float v) { return v != 0.0f; }));
}

// Adapters that target nothing, and no adapters at all, are the same bits; the adapters really
// change the block (so the comparison could fail).
TEST_P(LoraBits, AdaptersThatTargetNothingChangeNoBit) {
  const LoraBlock block(GetParam(), kSeed);
  const BlockRun absent = block.run(Grads::full, Adapters::absent);
  const BlockRun none = block.run(Grads::full, Adapters::none_targeted);
  EXPECT_TRUE(same_bits(absent.x_out, none.x_out));
  EXPECT_TRUE(same_bits(absent.d_in, none.d_in));
  EXPECT_TRUE(same_bits(absent.grads, none.grads));
  const BlockRun adapted = block.run(Grads::full, Adapters::every_target);
  EXPECT_FALSE(same_bits(absent.x_out, adapted.x_out));
  EXPECT_FALSE(same_bits(absent.d_in, adapted.d_in));
}

// block_backward without recompute reads the forward's activations, which include the adapters'
// terms: the same bits as recomputing them (same mask key, same mask).
TEST_P(LoraBits, BackwardWithoutRecomputeGivesTheSameBits) {
  const LoraBlock block(GetParam(), kSeed);
  const BlockRun recomputed = block.run(Grads::full, Adapters::every_target, true);
  const BlockRun kept = block.run(Grads::full, Adapters::every_target, false);
  EXPECT_TRUE(same_bits(recomputed.d_in, kept.d_in));
  EXPECT_TRUE(same_bits(recomputed.grads, kept.grads));
  for (size_t i = 0; i < block.targets().size(); ++i) {
    EXPECT_TRUE(same_bits(recomputed.d_a[i], kept.d_a[i]) && same_bits(recomputed.d_b[i], kept.d_b[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, LoraBits, ::testing::ValuesIn(kCases), case_name);

// --- the CPU backend on an emulated device ---

class LoraBackend : public ::testing::TestWithParam<Case> {};

TEST_P(LoraBackend, EmulatedCpuBackendGivesTheKernelsBits) {  // through the definition
  const LoraBlock block(GetParam(), kSeed);
  for (const Grads grads : {Grads::full, Grads::frozen}) {
    auto env = strata::testing::BackendEnv::create(strata::device::Kind::emulated);
    ASSERT_NE(env, nullptr);
    const BlockRun direct = block.run(grads, Adapters::every_target);
    const BlockRun seam = block.run_on(*env, grads);
    const char* label = grads == Grads::full ? "full" : "frozen";
    EXPECT_TRUE(same_bits(direct.x_out, seam.x_out)) << label;
    EXPECT_TRUE(same_bits(direct.d_in, seam.d_in)) << label;
    EXPECT_TRUE(same_bits(direct.grads, seam.grads)) << label;
    for (size_t i = 0; i < block.targets().size(); ++i) {
      EXPECT_TRUE(same_bits(direct.d_a[i], seam.d_a[i])) << label << " d_A of " << block.targets()[i].name;
      EXPECT_TRUE(same_bits(direct.d_b[i], seam.d_b[i])) << label << " d_B of " << block.targets()[i].name;
    }
  }
}

// CUDA (lora_cuda.h and the CUDA operations under the definitions) against the CPU kernels, within 1e-5 relative per
// tensor (cuBLAS vs OpenBLAS summation order; the mask is the same bits); and on CUDA too, the
// frozen base's d_in is the full backward's bit for bit. Skipped where no GPU is visible.
TEST_P(LoraBackend, CudaAgreesWithTheCpuKernels) {
  strata::Result<int> devices = strata::device::cuda_device_count_or_error();
  ASSERT_TRUE(devices.ok()) << devices.error().to_string();
  if (*devices == 0) GTEST_SKIP() << "no CUDA device visible";
  const LoraBlock block(GetParam(), kSeed);
  std::vector<float> full_d_in;
  for (const Grads grads : {Grads::full, Grads::frozen}) {
    auto env = strata::testing::BackendEnv::create(strata::device::Kind::cuda);
    ASSERT_NE(env, nullptr);
    const BlockRun cpu = block.run(grads, Adapters::every_target);
    const BlockRun gpu = block.run_on(*env, grads);
    const char* label = grads == Grads::full ? "full" : "frozen";
    auto expect_close = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
      const std::vector<double> reference(want.begin(), want.end());
      const double error = relative_error(got.data(), reference);
      EXPECT_LE(error, kMaxRelativeError) << label << " " << what;
      std::printf("%s %s %-24s cuda vs cpu %.2e\n", GetParam().name, label, what.c_str(), error);
    };
    expect_close(gpu.x_out, cpu.x_out, "x_out");
    expect_close(gpu.d_in, cpu.d_in, "d_in");
    if (grads == Grads::full) expect_close(gpu.grads, cpu.grads, "base grads");
    for (size_t i = 0; i < block.targets().size(); ++i) {
      expect_close(gpu.d_a[i], cpu.d_a[i], "d_A " + block.targets()[i].name);
      expect_close(gpu.d_b[i], cpu.d_b[i], "d_B " + block.targets()[i].name);
    }
    if (grads == Grads::full) full_d_in = gpu.d_in;
    else EXPECT_TRUE(same_bits(full_d_in, gpu.d_in)) << "CUDA frozen d_in";
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, LoraBackend, ::testing::ValuesIn(kCases), case_name);

// --- frozen heads ---

// The head with every gradient pointer null writes d_x_final alone: the full head's bits (and the
// same loss). Two row chunks (300 rows > kHeadChunkRows), so the chunk loop is covered.
TEST(LoraHead, FrozenHeadGivesTheFullHeadsDxFinal) {
  const gk::BatchShape shape{3, 100};
  std::mt19937 rng(7);
  const int64_t n = shape.rows();
  std::vector<int32_t> targets(static_cast<size_t>(n));
  std::uniform_int_distribution<int32_t> token(0, 49);
  for (int32_t& t : targets) t = token(rng);
  targets[5] = -1;  // a masked row
  {
    gk::Config gc = gpt2_config();
    gc.n_ctx = 100;
    const int64_t c = gc.n_embd;
    auto ln_f = normal_floats(static_cast<size_t>(2 * c), 0.1f, rng, 0.5f);
    auto wte = normal_floats(static_cast<size_t>(gc.vocab_size * c), 0.1f, rng);
    auto x = normal_floats(static_cast<size_t>(n * c), 1.0f, rng);
    Aligned ws(gk::workspace_size_bytes(gc, shape));
    std::vector<float> d_full(x.size()), d_frozen(x.size()), g_ln(static_cast<size_t>(2 * c)), g_wte(wte.size());
    const gk::HeadWeights w{ln_f.data(), ln_f.data() + c, wte.data()};
    const float loss_full = gk::head_forward_backward(gc, shape, w, x.data(), targets.data(), d_full.data(),
                                                      {g_ln.data(), g_ln.data() + c, g_wte.data()}, ws.workspace());
    const float loss_frozen =
        gk::head_forward_backward(gc, shape, w, x.data(), targets.data(), d_frozen.data(), {}, ws.workspace());
    EXPECT_TRUE(same_bits(d_full, d_frozen)) << "GPT-2";
    EXPECT_EQ(loss_full, loss_frozen);
    EXPECT_TRUE(std::any_of(g_wte.begin(), g_wte.end(), [](float v) { return v != 0.0f; }));
  }
  {
    lk::Config lc = llama_config();
    lc.n_ctx = 100;
    lc.tie_word_embeddings = false;
    const int64_t c = lc.n_embd;
    auto norm = normal_floats(static_cast<size_t>(c), 0.1f, rng, 1.0f);
    auto head = normal_floats(static_cast<size_t>(lc.vocab_size * c), 0.1f, rng);
    auto x = normal_floats(static_cast<size_t>(n * c), 1.0f, rng);
    Aligned ws(lk::workspace_size_bytes(lc, shape));
    std::vector<float> d_full(x.size()), d_frozen(x.size()), g_norm(static_cast<size_t>(c)), g_head(head.size());
    const lk::HeadWeights w{norm.data(), head.data()};
    const float loss_full = lk::head_forward_backward(lc, shape, w, x.data(), targets.data(), d_full.data(),
                                                      {g_norm.data(), g_head.data()}, ws.workspace());
    const float loss_frozen =
        lk::head_forward_backward(lc, shape, w, x.data(), targets.data(), d_frozen.data(), {}, ws.workspace());
    EXPECT_TRUE(same_bits(d_full, d_frozen)) << "Llama";
    EXPECT_EQ(loss_full, loss_frozen);
  }
}

// The same through the models' definitions (their heads composed of the backend's operations):
// the emulated device's CPU backend, and CUDA where a GPU is visible.
TEST(LoraHead, BackendsFrozenHeadGivesTheFullHeadsDxFinal) {
  strata::Result<int> devices = strata::device::cuda_device_count_or_error();
  ASSERT_TRUE(devices.ok()) << devices.error().to_string();
  for (const auto kind : {strata::device::Kind::emulated, strata::device::Kind::cuda}) {
    if (kind == strata::device::Kind::cuda && *devices == 0) continue;
    auto env = strata::testing::BackendEnv::create(kind);
    ASSERT_NE(env, nullptr);
    auto& backend = env->backend();
    const int64_t n = kShape.rows();
    const auto tokens = strata::testing::random_tokens(static_cast<size_t>(n), 50, 41);
    auto targets = strata::testing::random_tokens(static_cast<size_t>(n), 50, 42);
    targets[3] = -1;
    ASSERT_TRUE(backend.begin_step({tokens.data(), targets.data(), n}).ok());
    {
      const gk::Config gc = gpt2_config();
      const auto def = definition(false);
      const int64_t c = gc.n_embd;
      const auto act = static_cast<size_t>(n * c);
      // The embedding unit: wte, then wpe (which the tied head does not read).
      const auto embed_n = static_cast<size_t>((gc.vocab_size + gc.n_ctx) * c);
      const gk::Workspace ws = env->workspace_for(def->workspace_size_bytes(backend, kShape));
      float* ln_f = env->upload(strata::testing::random_floats(static_cast<size_t>(2 * c), 0.1f, 43, 0.5f));
      float* embed = env->upload(strata::testing::random_floats(embed_n, 0.1f, 44));
      float* x = env->upload(strata::testing::random_floats(act, 1.0f, 45));
      float* d_full = env->zeros<float>(act);
      float* d_frozen = env->zeros<float>(act);
      float* g_ln = env->zeros<float>(static_cast<size_t>(2 * c));
      float* g_embed = env->zeros<float>(embed_n);
      ASSERT_TRUE(def->head_forward_backward(backend, kShape, ln_f, embed, x, d_full, g_ln, g_embed, ws).ok());
      ASSERT_TRUE(def->head_forward_backward(backend, kShape, ln_f, embed, x, d_frozen, nullptr, nullptr, ws).ok());
      EXPECT_TRUE(same_bits(env->download(d_full, act), env->download(d_frozen, act))) << "GPT-2 on " << backend.name();
    }
    {
      const lk::Config lc = llama_config();
      const auto def = definition(true, /*tied=*/false);
      const int64_t c = lc.n_embd;
      const auto act = static_cast<size_t>(n * c);
      const auto table = static_cast<size_t>(lc.vocab_size * c);
      const gk::Workspace ws = env->workspace_for(def->workspace_size_bytes(backend, kShape));
      // The untied final unit: the norm, then lm_head.
      std::vector<float> final_unit = strata::testing::random_floats(static_cast<size_t>(c), 0.1f, 46, 1.0f);
      const std::vector<float> head = strata::testing::random_floats(table, 0.1f, 47);
      final_unit.insert(final_unit.end(), head.begin(), head.end());
      float* final_weights = env->upload(final_unit);
      float* embed = env->upload(strata::testing::random_floats(table, 0.1f, 49));
      float* x = env->upload(strata::testing::random_floats(act, 1.0f, 48));
      float* d_full = env->zeros<float>(act);
      float* d_frozen = env->zeros<float>(act);
      float* g_final = env->zeros<float>(final_unit.size());
      float* g_embed = env->zeros<float>(table);
      ASSERT_TRUE(
          def->head_forward_backward(backend, kShape, final_weights, embed, x, d_full, g_final, g_embed, ws).ok());
      ASSERT_TRUE(
          def->head_forward_backward(backend, kShape, final_weights, embed, x, d_frozen, nullptr, nullptr, ws).ok());
      EXPECT_TRUE(same_bits(env->download(d_full, act), env->download(d_frozen, act))) << "Llama on " << backend.name();
    }
  }
}

// --- the mask ---

TEST(LoraMask, KeepsOneMinusPAndNothingIsDroppedAtZero) {
  int64_t kept = 0;
  const int64_t rows = 400, cols = 500;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t hash = lora::row_hash(kMaskKey, 3, r);
    const uint32_t threshold = lora::drop_threshold(0.1f);
    for (int64_t c = 0; c < cols; ++c) {
      const bool k = lora::keep(kMaskKey, 3, r, c, 0.1f);
      EXPECT_EQ(k, lora::keep_element(hash, c, threshold));
      kept += k ? 1 : 0;
      ASSERT_TRUE(lora::keep(kMaskKey, 3, r, c, 0.0f));
    }
  }
  const double fraction = static_cast<double>(kept) / static_cast<double>(rows * cols);
  std::printf("kept %.4f of %lld elements at p = 0.1\n", fraction, static_cast<long long>(rows * cols));
  EXPECT_NEAR(fraction, 0.9, 0.005);
  // Another key or target draws another mask — also where key + target would coincide (a
  // caller numbering its blocks base + i must not hand block i+1 block i's masks).
  int64_t differ = 0, differ_shifted = 0;
  for (int64_t c = 0; c < cols; ++c) {
    differ += lora::keep(kMaskKey, 3, 0, c, 0.5f) != lora::keep(kMaskKey + 1, 3, 0, c, 0.5f) ? 1 : 0;
    differ += lora::keep(kMaskKey, 3, 0, c, 0.5f) != lora::keep(kMaskKey, 4, 0, c, 0.5f) ? 1 : 0;
    differ_shifted += lora::keep(kMaskKey, 4, 0, c, 0.5f) != lora::keep(kMaskKey + 1, 3, 0, c, 0.5f) ? 1 : 0;
  }
  EXPECT_GT(differ, cols / 2);  // two comparisons per column, each differing half the time
  EXPECT_GT(differ_shifted, cols / 4);
}

}  // namespace
