// tests/backend/test_packed_rows.cpp — proves packed rows (StepBatch's positions and segments,
// kernels/backend.h) on the CPU backend, for GPT-2 and Llama (grouped-query attention, llama3
// RoPE scaling; Qwen 2's q/k/v biases): small models with random weights run one training step
// through their model definitions (models/model.h: the embedding, streamed blocks with
// recompute, head, backward — the ops the trainer runs) on the CPU backend on a batch whose
// rows each hold several examples, among them one of a single token.
// - Against PyTorch: loss and every gradient equal a float64 reference that applies an explicit
//   causal same-segment mask and per-example positions (gpt2_reference.py, llama_reference.py),
//   within 1e-5 relative per tensor — the bound the unpacked kernels are held to.
// - Against the examples run alone (no torch needed): each example's final activations equal
//   its rows of the packed run; the packed gradients equal the sum over examples of each alone
//   example's gradients weighted by its share of the tokens (the packed loss is the mean over
//   all tokens, each alone loss the mean over its own), and so do the loss and the gradient that
//   reaches the embedding — so a packed batch trains to the weights the examples would unpacked.
// - Arrays that say "one example per row, positions 0..T−1" give the same bits as null ones.
// - Positions outside [0, seq_len) and segment ids that decrease along a row are refused with
//   invalid_argument before any kernel runs.
// The torch test skips (77 from the script) without torch; the rest always run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/reference/gpt2_reference.h"
#include "tests/reference/llama_reference.h"
#include "device/device.h"
#include "models/model.h"
#include "tests/support/reference_files.h"
#include "tests/support/temp_dir.h"

namespace strata::testing {
namespace {

namespace gk = reference::gpt2;
namespace lk = reference::llama;

constexpr double kTorchTolerance = 1e-5;
// Packed against alone: the same fp32 kernels on other row counts (other GEMM tile shapes) and
// sums of per-example gradients in another order — fp32 rounding, held to the torch bound.
constexpr double kAloneTolerance = 1e-5;

// max|a − b| / max|b| between two fp32 vectors.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// A packed batch: per row, the lengths of its examples (summing to seq_len) and the id of each.
struct Example {
  int64_t first_row = 0;  // flat index of its first token in the [B·T] batch
  int64_t length = 0;
};
struct Packing {
  std::vector<int32_t> positions, segments;
  std::vector<Example> examples;
};
Packing pack(const gk::BatchShape& shape, const std::vector<std::vector<int64_t>>& lengths,
             const std::vector<std::vector<int32_t>>& ids) {
  Packing p;
  for (int64_t b = 0; b < shape.batch; ++b) {
    int64_t t = 0;
    for (size_t e = 0; e < lengths[b].size(); ++e) {
      p.examples.push_back({b * shape.seq_len + t, lengths[b][e]});
      for (int64_t i = 0; i < lengths[b][e]; ++i) {
        p.positions.push_back(static_cast<int32_t>(i));
        p.segments.push_back(ids[b][e]);
      }
      t += lengths[b][e];
    }
    EXPECT_EQ(t, shape.seq_len) << "row " << b << " of the packing does not fill the row";
  }
  return p;
}

struct NamedTensor {
  std::string name;
  std::vector<int64_t> dims;
  size_t offset = 0;
  size_t numel = 1;
};

// What one training step through the backend gives back.
struct StepResult {
  double loss = 0.0;
  std::vector<float> grads;    // the model's packed layout
  std::vector<float> x_final;  // the last block's output [B·T, C]
  std::vector<float> d_x0;     // dLoss/dx0, what reaches the embedding [B·T, C]
};

std::unique_ptr<float, decltype(&std::free)> aligned_floats(size_t size_bytes) {
  const size_t rounded = (size_bytes + 63) / 64 * 64;
  return {static_cast<float*>(std::aligned_alloc(64, rounded)), &std::free};
}

// A small model of either kind with random weights, run through the CPU backend.
class TestModel {
 public:
  virtual ~TestModel() = default;
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  size_t param_count() const { return params_.size(); }
  virtual int64_t n_embd() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual size_t workspace_bytes(kernels::ComputeBackend& b, const gk::BatchShape& s) const = 0;
  virtual StepResult step(kernels::ComputeBackend& b, const gk::BatchShape& s, const kernels::StepBatch& batch,
                          const gk::Workspace& ws) const = 0;
  // The reference script's files; the packing arrays only when given.
  virtual void write_config(std::ofstream& out, const gk::BatchShape& s) const = 0;
  virtual std::string reference_script() const = 0;
  void write(const std::filesystem::path& folder, const gk::BatchShape& s, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets, const Packing& packing) const {
    std::filesystem::create_directories(folder);
    std::ofstream config(folder / "config.txt");
    config.precision(17);
    write_config(config, s);
    std::ofstream list(folder / "tensors.txt");
    for (const NamedTensor& t : tensors_) {
      list << t.name;
      for (int64_t d : t.dims) list << ' ' << d;
      if (gpt2_style_list_ && t.dims.size() == 1) list << " 1";
      list << '\n';
      write_raw((folder / (t.name + ".f32")).string(), params_.data() + t.offset, t.numel);
    }
    write_raw((folder / "tokens.i32").string(), tokens.data(), tokens.size());
    write_raw((folder / "targets.i32").string(), targets.data(), targets.size());
    write_raw((folder / "positions.i32").string(), packing.positions.data(), packing.positions.size());
    write_raw((folder / "segments.i32").string(), packing.segments.data(), packing.segments.size());
  }

 protected:
  void add(std::string name, std::vector<int64_t> dims) {
    NamedTensor t{std::move(name), std::move(dims), params_.size(), 1};
    for (int64_t d : t.dims) t.numel *= static_cast<size_t>(d);
    tensors_.push_back(t);
    params_.resize(params_.size() + t.numel);
  }
  // N(0, 0.1) everywhere, 1 + N(0, 0.1) for the norm gains (names ending in `gain_suffix`s).
  void randomize(uint32_t seed, const std::vector<std::string>& gain_suffixes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (const NamedTensor& t : tensors_) {
      bool gain = false;
      for (const std::string& suffix : gain_suffixes) gain = gain || t.name.ends_with(suffix);
      for (size_t i = 0; i < t.numel; ++i) params_[t.offset + i] = (gain ? 1.0f : 0.0f) + normal(rng);
    }
  }
  size_t offset_of(const std::string& name) const {
    for (const NamedTensor& t : tensors_)
      if (t.name == name) return t.offset;
    ADD_FAILURE() << "no tensor " << name;
    return 0;
  }

  std::vector<NamedTensor> tensors_;
  std::vector<float> params_;
  bool gpt2_style_list_ = false;  // gpt2_reference.py lists 1-D tensors as "name rows 1"
};

void expect_ok(const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); }

class Gpt2Model final : public TestModel {
 public:
  Gpt2Model(const gk::Config& config, uint32_t seed) : config_(config), definition_(definition_of(config)) {
    gpt2_style_list_ = true;
    add("wte.weight", {config.vocab_size, config.n_embd});
    add("wpe.weight", {config.n_ctx, config.n_embd});
    for (int64_t layer = 0; layer < config.n_layer; ++layer)
      for (const gk::ParamSpec& spec : gk::block_param_specs(config))
        add(gk::block_param_name(layer, spec.name_suffix),
            spec.rank == 1 ? std::vector<int64_t>{spec.shape[0]} : std::vector<int64_t>{spec.shape[0], spec.shape[1]});
    add("ln_f.weight", {config.n_embd});
    add("ln_f.bias", {config.n_embd});
    randomize(seed, {"ln_1.weight", "ln_2.weight", "ln_f.weight"});
  }
  int64_t n_embd() const override { return config_.n_embd; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  size_t workspace_bytes(kernels::ComputeBackend& b, const gk::BatchShape& s) const override {
    return definition_->workspace_size_bytes(b, s);
  }
  StepResult step(kernels::ComputeBackend& b, const gk::BatchShape& s, const kernels::StepBatch& batch,
                  const gk::Workspace& ws) const override {
    const auto act = static_cast<size_t>(s.rows() * config_.n_embd);
    const float* p = params_.data();
    StepResult r;
    r.grads.assign(params_.size(), 0.0f);
    float* g = r.grads.data();
    // The list is the definition's units back to back: wte and wpe (the embedding unit), each
    // block, ln_f's weight and bias (the final unit).
    const size_t embed = offset_of("wte.weight"), ln_f = offset_of("ln_f.weight");
    auto block = [&](int64_t layer) { return offset_of(gk::block_param_name(layer, "ln_1.weight")); };
    const models::ModelDefinition& d = *definition_;
    expect_ok(b.begin_step(batch));
    std::vector<std::vector<float>> acts(static_cast<size_t>(config_.n_layer + 1), std::vector<float>(act));
    expect_ok(d.embedding_forward(b, s, p + embed, acts[0].data()));
    for (int64_t l = 0; l < config_.n_layer; ++l)
      expect_ok(d.block_forward(b, s, p + block(l), acts[l].data(), acts[l + 1].data(), ws));
    std::vector<float> d_x(act);
    expect_ok(d.head_forward_backward(b, s, p + ln_f, p + embed, acts.back().data(), d_x.data(), g + ln_f, g + embed,
                                      ws));
    for (int64_t l = config_.n_layer; l-- > 0;)
      expect_ok(d.block_backward(b, s, p + block(l), acts[l].data(), d_x.data(), d_x.data(), g + block(l), ws,
                                 /*recompute=*/true));
    expect_ok(d.embedding_backward(b, s, d_x.data(), g + embed));
    auto scalars = b.end_step();
    EXPECT_TRUE(scalars.ok());
    r.loss = scalars.ok() ? scalars->loss : 0.0;
    r.x_final = acts.back();
    r.d_x0 = d_x;
    return r;
  }
  void write_config(std::ofstream& out, const gk::BatchShape& s) const override {
    out << config_.n_layer << ' ' << config_.n_head << ' ' << config_.n_embd << ' ' << config_.vocab_size << ' '
        << config_.n_ctx << ' ' << s.batch << ' ' << s.seq_len << '\n';
  }
  std::string reference_script() const override { return STRATA_GPT2_REFERENCE; }
  // The definition the step runs (the refusal test calls its embedding alone).
  const models::ModelDefinition& definition() const { return *definition_; }

 private:
  static std::unique_ptr<const models::ModelDefinition> definition_of(const gk::Config& c) {
    ModelConfig m;
    m.arch = "gpt2";
    m.n_layer = static_cast<uint32_t>(c.n_layer);
    m.n_head = static_cast<uint32_t>(c.n_head);
    m.n_embd = static_cast<uint32_t>(c.n_embd);
    m.vocab_size = static_cast<uint32_t>(c.vocab_size);
    m.seq_len = static_cast<uint32_t>(c.n_ctx);
    return models::make_model_definition(m);
  }
  gk::Config config_;
  std::unique_ptr<const models::ModelDefinition> definition_;
};

class LlamaModel final : public TestModel {
 public:
  LlamaModel(const lk::Config& config, uint32_t seed) : config_(config), definition_(definition_of(config)) {
    add("model.embed_tokens.weight", {config.vocab_size, config.n_embd});
    for (int64_t layer = 0; layer < config.n_layer; ++layer)
      for (const auto& spec : lk::block_param_specs(config))
        add(lk::block_param_name(layer, spec.name_suffix),
            spec.rank == 1 ? std::vector<int64_t>{spec.shape[0]} : std::vector<int64_t>{spec.shape[0], spec.shape[1]});
    add("model.norm.weight", {config.n_embd});
    if (!config.tie_word_embeddings) add("lm_head.weight", {config.vocab_size, config.n_embd});
    randomize(seed, {"norm.weight", "layernorm.weight"});
  }
  int64_t n_embd() const override { return config_.n_embd; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  size_t workspace_bytes(kernels::ComputeBackend& b, const gk::BatchShape& s) const override {
    return definition_->workspace_size_bytes(b, s);
  }
  StepResult step(kernels::ComputeBackend& b, const gk::BatchShape& s, const kernels::StepBatch& batch,
                  const gk::Workspace& ws) const override {
    const auto act = static_cast<size_t>(s.rows() * config_.n_embd);
    const float* p = params_.data();
    StepResult r;
    r.grads.assign(params_.size(), 0.0f);
    float* g = r.grads.data();
    // The list is the definition's units back to back: embed_tokens, each block, the final
    // unit (the norm, then lm_head when untied).
    const size_t embed = 0, norm = offset_of("model.norm.weight");
    auto block = [&](int64_t layer) { return tensors_[1 + static_cast<size_t>(layer) * block_tensors()].offset; };
    const models::ModelDefinition& d = *definition_;
    expect_ok(b.begin_step(batch));
    std::vector<std::vector<float>> acts(static_cast<size_t>(config_.n_layer + 1), std::vector<float>(act));
    expect_ok(d.embedding_forward(b, s, p + embed, acts[0].data()));
    for (int64_t l = 0; l < config_.n_layer; ++l)
      expect_ok(d.block_forward(b, s, p + block(l), acts[l].data(), acts[l + 1].data(), ws));
    std::vector<float> d_x(act);
    expect_ok(d.head_forward_backward(b, s, p + norm, p + embed, acts.back().data(), d_x.data(), g + norm, g + embed,
                                      ws));
    for (int64_t l = config_.n_layer; l-- > 0;)
      expect_ok(d.block_backward(b, s, p + block(l), acts[l].data(), d_x.data(), d_x.data(), g + block(l), ws,
                                 /*recompute=*/true));
    expect_ok(d.embedding_backward(b, s, d_x.data(), g + embed));
    auto scalars = b.end_step();
    EXPECT_TRUE(scalars.ok());
    r.loss = scalars.ok() ? scalars->loss : 0.0;
    r.x_final = acts.back();
    r.d_x0 = d_x;
    return r;
  }
  void write_config(std::ofstream& out, const gk::BatchShape& s) const override {
    out << "n_layer " << config_.n_layer << "\nn_head " << config_.n_head << "\nn_kv_head " << config_.n_kv_head
        << "\nhead_dim " << config_.head_dim << "\nvocab_size " << config_.vocab_size << "\nbatch " << s.batch
        << "\nseq_len " << s.seq_len << "\nrope_theta " << config_.rope_theta << "\nrope_factor "
        << config_.rope_factor << "\nrope_low " << config_.rope_low_freq_factor << "\nrope_high "
        << config_.rope_high_freq_factor << "\nrope_original " << config_.rope_original_max_positions
        << "\nnorm_eps " << config_.norm_eps << "\ntied " << (config_.tie_word_embeddings ? 1 : 0) << "\n";
  }
  std::string reference_script() const override { return STRATA_LLAMA_REFERENCE; }

 private:
  static std::unique_ptr<const models::ModelDefinition> definition_of(const lk::Config& c) {
    ModelConfig m;
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
    if (c.rope_factor > 0.0) {
      m.rope_scaling.type = "llama3";
      m.rope_scaling.factor = c.rope_factor;
      m.rope_scaling.low_freq_factor = c.rope_low_freq_factor;
      m.rope_scaling.high_freq_factor = c.rope_high_freq_factor;
      m.rope_scaling.original_max_position_embeddings = static_cast<uint32_t>(c.rope_original_max_positions);
    }
    m.norm_eps = c.norm_eps;
    m.tie_word_embeddings = c.tie_word_embeddings;
    m.qkv_bias = c.qkv_bias;
    m.o_proj_bias = c.o_bias;
    return models::make_model_definition(m);
  }
  size_t block_tensors() const { return lk::block_param_specs(config_).size(); }
  lk::Config config_;
  std::unique_ptr<const models::ModelDefinition> definition_;
};

lk::Config llama_config(bool qwen) {
  lk::Config c;
  c.n_layer = 2;
  c.n_head = 6;
  c.n_kv_head = 3;
  c.head_dim = 16;
  c.n_embd = 80;
  c.intermediate_size = 112;
  c.vocab_size = 67;
  c.n_ctx = 24;
  c.norm_eps = qwen ? 1e-6 : 1e-5;
  c.rope_theta = qwen ? 1.0e6 : 10000.0;
  c.tie_word_embeddings = qwen;
  c.qkv_bias = qwen;
  if (!qwen) {  // llama3 scaling with a short original context: every branch of the frequencies
    c.rope_factor = 8.0;
    c.rope_original_max_positions = 16.0;
  }
  return c;
}

// The cases: two rows of 13 tokens, row 0 two examples, row 1 four (one of a single token);
// ids only need to be non-decreasing in a row, and id 3 in both rows shows rows stay apart.
const gk::BatchShape kShape{2, 13};
const std::vector<std::vector<int64_t>> kLengths = {{5, 8}, {1, 3, 5, 4}};
const std::vector<std::vector<int32_t>> kIds = {{3, 4}, {3, 5, 7, 9}};

const char* const kCases[] = {"gpt2", "llama_gqa", "qwen2_gqa_bias"};

std::unique_ptr<TestModel> make_model(const std::string& name) {
  if (name == "gpt2") return std::make_unique<Gpt2Model>(gk::Config{2, 4, 48, 61, 20}, 77);
  return std::make_unique<LlamaModel>(llama_config(name == "qwen2_gqa_bias"), 78);
}

// A CPU device and its backend sized for kShape, with a workspace for `model`.
struct CpuRig {
  std::unique_ptr<device::Device> device;
  std::unique_ptr<kernels::ComputeBackend> backend;
  std::unique_ptr<float, decltype(&std::free)> ws_storage{nullptr, &std::free};
  gk::Workspace ws;

  explicit CpuRig(const TestModel& model) {
    auto made = device::make_device(device::Kind::cpu, uint64_t{256} << 20);
    EXPECT_TRUE(made.ok());
    device = std::move(made).value();
    auto b = kernels::make_backend(*device, kShape);
    EXPECT_TRUE(b.ok());
    backend = std::move(b).value();
    const size_t bytes = model.workspace_bytes(*backend, kShape);
    ws_storage = aligned_floats(bytes);
    ws = gk::Workspace{ws_storage.get(), bytes};
  }
};

struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(const TestModel& model) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.vocab_size() - 1));
  Batch batch;
  for (int64_t i = 0; i < kShape.rows(); ++i) {
    batch.tokens.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  return batch;
}

class PackedRows : public ::testing::TestWithParam<const char*> {};

// The packed step against the float64 torch reference with its explicit mask and positions.
TEST_P(PackedRows, MatchesTorchWithBlockDiagonalMask) {
  const std::string name = GetParam();
  const auto model = make_model(name);
  const Batch batch = make_batch(*model);
  const Packing packing = pack(kShape, kLengths, kIds);
  TempDir dir;
  model->write(dir.path() / name, kShape, batch.tokens, batch.targets, packing);
  const std::string command = std::string(STRATA_PYTHON3) + " " + model->reference_script() + " " +
                              (dir.path() / name).string();
  const int rc = std::system(command.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "PyTorch is not importable";
  ASSERT_EQ(rc, 0) << "the PyTorch reference script failed";

  CpuRig rig(*model);
  const StepResult packed = model->step(*rig.backend, kShape,
                                        {batch.tokens.data(), batch.targets.data(), kShape.rows(),
                                         packing.positions.data(), packing.segments.data()},
                                        rig.ws);
  const std::string out = (dir.path() / name / "out").string();
  const double ref_loss = read_f64(out + "/loss.f64", 1)[0];
  const double loss_error = std::fabs(packed.loss - ref_loss) / std::fabs(ref_loss);
  std::printf("%s: loss %.8f reference %.8f relative error %.2e\n", name.c_str(), packed.loss, ref_loss, loss_error);
  EXPECT_LE(loss_error, kTorchTolerance);
  double worst = 0.0;
  for (const NamedTensor& t : model->tensors()) {
    const std::vector<double> reference = read_f64(out + "/" + t.name + ".grad.f64", t.numel);
    const double error = strata::testing::relative_error(packed.grads.data() + t.offset, reference);
    EXPECT_LE(error, kTorchTolerance) << "gradient of " << t.name;
    worst = std::max(worst, error);
  }
  std::printf("%s: %zu gradients, worst relative error %.2e\n", name.c_str(), model->tensors().size(), worst);
}

// The packed step against each example run alone (shape {1, length}, no packing arrays).
TEST_P(PackedRows, EqualsTheExamplesRunAlone) {
  const std::string name = GetParam();
  const auto model = make_model(name);
  const Batch batch = make_batch(*model);
  const Packing packing = pack(kShape, kLengths, kIds);
  CpuRig rig(*model);
  const StepResult packed = model->step(*rig.backend, kShape,
                                        {batch.tokens.data(), batch.targets.data(), kShape.rows(),
                                         packing.positions.data(), packing.segments.data()},
                                        rig.ws);
  const auto c = static_cast<size_t>(model->n_embd());
  const auto tokens_total = static_cast<double>(kShape.rows());
  std::vector<double> summed_grads(model->param_count(), 0.0);
  double summed_loss = 0.0;
  double worst_activation = 0.0, worst_d_x0 = 0.0;
  for (const Example& e : packing.examples) {
    const auto first = static_cast<size_t>(e.first_row);
    const auto length = static_cast<size_t>(e.length);
    const auto begin = static_cast<std::ptrdiff_t>(first), end = static_cast<std::ptrdiff_t>(first + length);
    const std::vector<int32_t> tokens(batch.tokens.begin() + begin, batch.tokens.begin() + end);
    const std::vector<int32_t> targets(batch.targets.begin() + begin, batch.targets.begin() + end);
    const StepResult alone =
        model->step(*rig.backend, gk::BatchShape{1, e.length}, {tokens.data(), targets.data(), e.length}, rig.ws);
    const double share = static_cast<double>(e.length) / tokens_total;  // its weight in the packed mean
    // Forward: the example's rows of the packed output are its output alone.
    const std::vector<float> packed_rows(packed.x_final.begin() + static_cast<std::ptrdiff_t>(first * c),
                                         packed.x_final.begin() + static_cast<std::ptrdiff_t>((first + length) * c));
    const double activation_error = relative_error(packed_rows, alone.x_final);
    EXPECT_LE(activation_error, kAloneTolerance) << name << ": final activations of the example at " << first;
    worst_activation = std::max(worst_activation, activation_error);
    // Backward: what reaches the embedding, scaled by the example's share of the mean.
    std::vector<float> scaled(alone.d_x0.size());
    for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = static_cast<float>(share * alone.d_x0[i]);
    const std::vector<float> packed_d(packed.d_x0.begin() + static_cast<std::ptrdiff_t>(first * c),
                                      packed.d_x0.begin() + static_cast<std::ptrdiff_t>((first + length) * c));
    const double d_error = relative_error(packed_d, scaled);
    EXPECT_LE(d_error, kAloneTolerance) << name << ": dLoss/dx0 of the example at " << first;
    worst_d_x0 = std::max(worst_d_x0, d_error);
    for (size_t i = 0; i < summed_grads.size(); ++i) summed_grads[i] += share * alone.grads[i];
    summed_loss += share * alone.loss;
  }
  EXPECT_LE(std::fabs(packed.loss - summed_loss) / std::fabs(summed_loss), kAloneTolerance) << name << ": loss";
  double worst_grad = 0.0;
  for (const NamedTensor& t : model->tensors()) {
    const std::vector<double> want(summed_grads.begin() + static_cast<std::ptrdiff_t>(t.offset),
                                   summed_grads.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
    const double error = strata::testing::relative_error(packed.grads.data() + t.offset, want);
    EXPECT_LE(error, kAloneTolerance) << name << ": gradient of " << t.name;
    worst_grad = std::max(worst_grad, error);
  }
  std::printf("%s: %zu examples; worst relative error: activations %.2e, dLoss/dx0 %.2e, gradients %.2e\n",
              name.c_str(), packing.examples.size(), worst_activation, worst_d_x0, worst_grad);
}

// One example per row at positions 0..T−1, given as arrays, is the unpacked batch: same bits.
TEST_P(PackedRows, TrivialArraysGiveTheUnpackedBits) {
  const std::string name = GetParam();
  const auto model = make_model(name);
  const Batch batch = make_batch(*model);
  std::vector<int32_t> positions, segments;
  for (int64_t r = 0; r < kShape.rows(); ++r) {
    positions.push_back(static_cast<int32_t>(r % kShape.seq_len));
    segments.push_back(static_cast<int32_t>(r / kShape.seq_len));
  }
  CpuRig rig(*model);
  const StepResult plain = model->step(*rig.backend, kShape, {batch.tokens.data(), batch.targets.data(), kShape.rows()},
                                       rig.ws);
  const StepResult arrays = model->step(
      *rig.backend, kShape,
      {batch.tokens.data(), batch.targets.data(), kShape.rows(), positions.data(), segments.data()}, rig.ws);
  EXPECT_EQ(plain.loss, arrays.loss);
  EXPECT_EQ(plain.grads, arrays.grads);
  EXPECT_EQ(plain.x_final, arrays.x_final);
  // And packing changes the result (the arrays are read at all).
  const Packing packing = pack(kShape, kLengths, kIds);
  const StepResult packed = model->step(*rig.backend, kShape,
                                        {batch.tokens.data(), batch.targets.data(), kShape.rows(),
                                         packing.positions.data(), packing.segments.data()},
                                        rig.ws);
  EXPECT_NE(plain.loss, packed.loss);
}

INSTANTIATE_TEST_SUITE_P(Models, PackedRows, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// Bad packing arrays are refused by the ops that read them, with the value and where it is.
TEST(PackedRowsRefusal, PositionsOutsideTheRowAndDecreasingSegments) {
  const gk::Config config{2, 4, 48, 61, 20};
  const Gpt2Model model(config, 77);
  const Batch batch = make_batch(model);
  CpuRig rig(model);
  const Packing good = pack(kShape, kLengths, kIds);
  // GPT-2's embedding unit: wte then wpe.
  std::vector<float> embed(static_cast<size_t>((config.vocab_size + config.n_ctx) * config.n_embd));
  std::vector<float> x0(static_cast<size_t>(kShape.rows() * config.n_embd));
  struct Bad {
    int64_t index;
    bool position;
    int32_t value;
    std::string expect;
  };
  for (const Bad& bad : {Bad{17, true, 13, "packed position 13 (batch row 1, token 4)"},
                         Bad{2, true, -1, "packed position -1 (batch row 0, token 2)"},
                         Bad{20, false, 6, "packed segment id 6 (batch row 1, token 7) follows id 7"}}) {
    Packing p = good;
    (bad.position ? p.positions : p.segments)[static_cast<size_t>(bad.index)] = bad.value;
    ASSERT_TRUE(rig.backend
                    ->begin_step({batch.tokens.data(), batch.targets.data(), kShape.rows(), p.positions.data(),
                                  p.segments.data()})
                    .ok());
    const Status status = model.definition().embedding_forward(*rig.backend, kShape, embed.data(), x0.data());
    ASSERT_FALSE(status.ok()) << bad.expect;
    EXPECT_EQ(status.error().kind, ErrorKind::invalid_argument);
    EXPECT_NE(status.error().message.find(bad.expect), std::string::npos) << status.error().message;
    ASSERT_TRUE(rig.backend->end_step().ok());
  }
  // The same function the CUDA backend calls, directly: null arrays and a good packing pass.
  EXPECT_TRUE(kernels::check_packing(nullptr, nullptr, kShape).ok());
  EXPECT_TRUE(kernels::check_packing(good.positions.data(), good.segments.data(), kShape).ok());
}

}  // namespace
}  // namespace strata::testing
