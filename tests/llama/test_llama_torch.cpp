// tests/llama/test_llama_torch.cpp — proves the CPU Llama kernels compute Hugging Face Llama's
// loss, every gradient and the last-position logits: small models with random weights (odd
// shapes: 6 query heads over 3 k/v heads, head_dim 16 with n_embd 80, MLP 112; multi-query
// attention with llama3 rope scaling and a tied head; a head spread over two row chunks; Qwen 2's
// q/k/v biases on the odd shape; Llama's attention_bias, q/k/v and o_proj biases) run
// through the per-block API as the trainer streams it (forward keeps only block inputs,
// backward recomputes each block), against the independent float64 PyTorch implementation in
// llama_reference.py. Error per tensor (the bias gradients too): max|a − b| / max|b| ≤ 1e-5. A
// second test runs the same model twice and requires the same bits (determinism). Decode with a
// KV cache is checked without and with biases. Exit 77 without torch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/reference/llama_reference.h"
#include "tests/support/reference_files.h"
#include "tests/support/temp_dir.h"

namespace {

namespace lk = strata::reference::llama;
using strata::testing::read_f64;
using strata::testing::relative_error;
using strata::testing::TempDir;

constexpr double kMaxRelativeError = 1e-5;

struct Case {
  const char* name;
  lk::Config config;
  lk::BatchShape shape;
  int64_t greedy = 0;  // > 0: the reference also writes this many greedy tokens after the first sequence
  bool masked = false;  // loss masks: the first third of each sequence -1, every 7th row -5
  int64_t loss_normalizer_tokens = 0;  // N (kernels/ops.h, "Loss masks"); 0 = the trained count
};

lk::Config make_config(int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t embd, int64_t inter,
                       int64_t vocab, int64_t ctx, bool tied, double rope_factor, bool qkv_bias = false,
                       bool o_bias = false) {
  lk::Config c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.head_dim = head_dim;
  c.n_embd = embd;
  c.intermediate_size = inter;
  c.vocab_size = vocab;
  c.n_ctx = ctx;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.qkv_bias = qkv_bias;
  c.o_bias = o_bias;
  if (rope_factor > 0) {
    // A short original context, so the head_dim-8 frequencies hit all three llama3 branches.
    c.rope_factor = rope_factor;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_positions = 16.0;
  }
  return c;
}

// Qwen2.5's numbers on a small odd shape: q/k/v biases, rope_theta 1e6, rms_norm_eps 1e-6.
lk::Config qwen_config(int64_t ctx, bool tied) {
  lk::Config c = make_config(2, 6, 3, 16, 80, 112, 67, ctx, tied, 0.0, true);
  c.rope_theta = 1.0e6;
  c.norm_eps = 1e-6;
  return c;
}

const Case kCases[] = {
    {"gqa_odd", make_config(2, 6, 3, 16, 80, 112, 67, 16, false, 0.0), {2, 13}},
    {"mqa_llama3_tied", make_config(1, 4, 1, 8, 48, 64, 50, 24, true, 8.0), {2, 20}},
    {"head_chunks", make_config(1, 2, 2, 16, 32, 40, 30, 16, false, 0.0), {20, 16}},
    // Qwen 2, tied like Qwen2.5-0.5B.
    {"qwen2_gqa_odd", qwen_config(16, true), {2, 13}},
    // Llama's attention_bias: q/k/v and o_proj biases, untied, llama3 scaling.
    {"llama_attention_bias", make_config(2, 6, 3, 16, 80, 112, 67, 24, false, 8.0, true, true), {2, 11}},
    // Loss masks (torch: cross_entropy(ignore_index, reduction='sum') / N), over two head chunks,
    // then with a caller's N as one micro-batch of an accumulated update.
    {"masked", make_config(1, 2, 2, 16, 32, 40, 30, 16, false, 0.0), {20, 16}, 0, true, 0},
    {"masked_normalizer", make_config(2, 6, 3, 16, 80, 112, 67, 16, true, 0.0), {2, 13}, 0, true, 37},
};

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  size_t numel = 0;
};

// A model's weights laid out as the trainer packs them: embed, each block (canonical order),
// norm (+ lm_head when untied). Random: N(0, 0.1) matrices and biases (nonzero, so a bias that
// is dropped or misplaced shows), norm weights 1 + N(0, 0.1).
class TinyLlama {
 public:
  TinyLlama(const lk::Config& config, const lk::BatchShape& shape, uint32_t seed, int64_t greedy = 0,
            bool masked = false, int64_t loss_normalizer_tokens = 0)
      : config_(config), shape_(shape), greedy_(greedy), loss_normalizer_tokens_(loss_normalizer_tokens) {
    auto add = [&](std::string name, std::vector<int64_t> dims) {
      Tensor t{std::move(name), std::move(dims), total_, 1};
      for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
      total_ += t.numel;
      tensors_.push_back(t);
    };
    add("model.embed_tokens.weight", {config.vocab_size, config.n_embd});
    for (int64_t layer = 0; layer < config.n_layer; ++layer) {
      for (const auto& spec : lk::block_param_specs(config)) {
        std::vector<int64_t> dims = {spec.shape[0]};
        if (spec.rank == 2) dims.push_back(spec.shape[1]);
        add(lk::block_param_name(layer, spec.name_suffix), dims);
      }
    }
    add("model.norm.weight", {config.n_embd});
    if (!config.tie_word_embeddings) add("lm_head.weight", {config.vocab_size, config.n_embd});
    params_.resize(total_);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (const Tensor& t : tensors_) {
      const bool is_norm = t.name.ends_with("norm.weight");
      for (size_t i = 0; i < t.numel; ++i) params_[t.offset + i] = (is_norm ? 1.0f : 0.0f) + normal(rng);
    }
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
    tokens_.resize(static_cast<size_t>(shape.rows()));
    targets_.resize(tokens_.size());
    for (auto& v : tokens_) v = token(rng);
    for (auto& v : targets_) v = token(rng);
    for (int64_t i = 0; masked && i < shape.rows(); ++i) {
      if (i % shape.seq_len < shape.seq_len / 3) targets_[static_cast<size_t>(i)] = -1;
      if (i % 7 == 3) targets_[static_cast<size_t>(i)] = -5;
    }
  }

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<float>& params() const { return params_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& targets() const { return targets_; }
  size_t block_offset(int64_t layer) const { return tensors_[1 + layer * block_tensors()].offset; }
  size_t norm_offset() const { return tensors_[1 + config_.n_layer * block_tensors()].offset; }
  int64_t block_tensors() const { return static_cast<int64_t>(lk::block_param_specs(config_).size()); }

  // Streaming forward (block inputs only) and backward with recompute; returns the loss and
  // fills `grads` (the packed layout) and the last-position logits.
  float run(std::vector<float>& grads, std::vector<float>& logits) const {
    const int64_t n = shape_.rows();
    const int64_t c = config_.n_embd;
    const size_t ws_bytes = (lk::workspace_size_bytes(config_, shape_) + 63) / 64 * 64;
    std::unique_ptr<float, decltype(&std::free)> ws_storage(static_cast<float*>(std::aligned_alloc(64, ws_bytes)),
                                                            &std::free);
    const lk::Workspace ws{ws_storage.get(), ws_bytes};
    grads.assign(total_, 0.0f);
    std::vector<std::vector<float>> acts(static_cast<size_t>(config_.n_layer + 1),
                                         std::vector<float>(static_cast<size_t>(n * c)));
    const float* p = params_.data();
    lk::embedding_forward(config_, shape_, tokens_.data(), p, acts[0].data());
    for (int64_t i = 0; i < config_.n_layer; ++i)
      lk::block_forward(config_, shape_, lk::bind_block(config_, p + block_offset(i)), acts[i].data(),
                        acts[i + 1].data(), ws);
    const float* norm = p + norm_offset();
    const float* head = config_.tie_word_embeddings ? p : norm + c;
    float* g_norm = grads.data() + norm_offset();
    float* g_head = config_.tie_word_embeddings ? grads.data() : g_norm + c;
    std::vector<float> d_x(static_cast<size_t>(n * c));
    const float loss = lk::head_forward_backward(config_, shape_, {norm, head}, acts.back().data(), targets_.data(),
                                                 d_x.data(), {g_norm, g_head}, ws, loss_normalizer_tokens_);
    for (int64_t i = config_.n_layer; i-- > 0;)
      lk::block_backward(config_, shape_, lk::bind_block(config_, p + block_offset(i)), acts[i].data(), d_x.data(),
                         d_x.data(), lk::bind_block(config_, grads.data() + block_offset(i)), ws, true);
    lk::embedding_backward(config_, shape_, tokens_.data(), d_x.data(), grads.data());
    logits.assign(static_cast<size_t>(shape_.batch * config_.vocab_size), 0.0f);
    lk::head_forward(config_, shape_, {norm, head}, acts.back().data(), logits.data(), ws);
    return loss;
  }

  void write(const std::filesystem::path& folder) const {
    std::filesystem::create_directories(folder);
    std::ofstream cfg(folder / "config.txt");
    cfg.precision(17);
    cfg << "n_layer " << config_.n_layer << "\nn_head " << config_.n_head << "\nn_kv_head " << config_.n_kv_head
        << "\nhead_dim " << config_.head_dim << "\nvocab_size " << config_.vocab_size << "\nbatch " << shape_.batch
        << "\nseq_len " << shape_.seq_len << "\nrope_theta " << config_.rope_theta << "\nrope_factor "
        << config_.rope_factor << "\nrope_low " << config_.rope_low_freq_factor << "\nrope_high "
        << config_.rope_high_freq_factor << "\nrope_original " << config_.rope_original_max_positions
        << "\nnorm_eps " << config_.norm_eps << "\ntied " << (config_.tie_word_embeddings ? 1 : 0) << "\ngreedy "
        << greedy_ << "\nnormalizer " << loss_normalizer_tokens_ << "\n";
    std::ofstream list(folder / "tensors.txt");
    for (const Tensor& t : tensors_) {
      list << t.name;
      for (int64_t d : t.shape) list << ' ' << d;
      list << '\n';
      strata::testing::write_raw((folder / (t.name + ".f32")).string(), params_.data() + t.offset, t.numel);
    }
    strata::testing::write_raw((folder / "tokens.i32").string(), tokens_.data(), tokens_.size());
    strata::testing::write_raw((folder / "targets.i32").string(), targets_.data(), targets_.size());
  }

 private:
  lk::Config config_;
  lk::BatchShape shape_;
  int64_t greedy_ = 0;
  int64_t loss_normalizer_tokens_ = 0;
  std::vector<Tensor> tensors_;
  size_t total_ = 0;
  std::vector<float> params_;
  std::vector<int32_t> tokens_, targets_;
};

constexpr uint32_t kSeed = 4242;

class LlamaMatchesTorch : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string command = std::string(STRATA_PYTHON3) + " " + STRATA_LLAMA_REFERENCE;
    for (const Case& c : kCases) {
      TinyLlama(c.config, c.shape, kSeed, 0, c.masked, c.loss_normalizer_tokens).write(dir_->path() / c.name);
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

TempDir* LlamaMatchesTorch::dir_ = nullptr;
int LlamaMatchesTorch::reference_rc_ = -1;

TEST_P(LlamaMatchesTorch, LossGradientsAndLogits) {
  ASSERT_EQ(reference_rc_, 0) << "the PyTorch reference script failed";
  const Case& c = GetParam();
  const TinyLlama model(c.config, c.shape, kSeed, 0, c.masked, c.loss_normalizer_tokens);
  const std::string out = (dir_->path() / c.name / "out").string();
  std::vector<float> grads, logits;
  const float loss = model.run(grads, logits);
  const double ref_loss = read_f64(out + "/loss.f64", 1)[0];
  const double loss_error = std::abs(loss - ref_loss) / std::abs(ref_loss);
  std::printf("loss ours %.8f reference %.8f relative error %.2e\n", loss, ref_loss, loss_error);
  EXPECT_LE(loss_error, kMaxRelativeError);
  double worst = 0.0;
  std::string worst_name;
  for (const Tensor& t : model.tensors()) {
    const double error = relative_error(grads.data() + t.offset, read_f64(out + "/" + t.name + ".grad.f64", t.numel));
    EXPECT_LE(error, kMaxRelativeError) << "gradient of " << t.name;
    if (error >= worst) {
      worst = error;
      worst_name = t.name;
    }
  }
  std::printf("%zu gradients checked, worst relative error %.2e (%s)\n", model.tensors().size(), worst,
              worst_name.c_str());
  const double logits_error = relative_error(logits.data(), read_f64(out + "/logits_last.f64", logits.size()));
  std::printf("last-position logits relative error %.2e\n", logits_error);
  EXPECT_LE(logits_error, kMaxRelativeError);
}

// Two runs, same bits: every reduction has one fixed order.
TEST_P(LlamaMatchesTorch, Deterministic) {
  const Case& c = GetParam();
  const TinyLlama model(c.config, c.shape, kSeed, 0, c.masked, c.loss_normalizer_tokens);
  std::vector<float> grads_a, grads_b, logits_a, logits_b;
  const float loss_a = model.run(grads_a, logits_a);
  const float loss_b = model.run(grads_b, logits_b);
  EXPECT_EQ(std::memcmp(&loss_a, &loss_b, sizeof loss_a), 0);
  ASSERT_EQ(grads_a.size(), grads_b.size());
  EXPECT_EQ(std::memcmp(grads_a.data(), grads_b.data(), grads_a.size() * 4), 0);
}

// Aligned fp32 scratch for the kernels.
struct Aligned {
  explicit Aligned(size_t bytes)
      : size_bytes((bytes + 63) / 64 * 64), data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t size_bytes;
  float* data;
};

// Generation's decode with a KV cache (llama_reference.h: embedding_decode, block_decode, head_decode):
// a 5-token prompt in one call then greedy tokens one at a time to the end of the window, and
// the same sequence again one token at a time from position 0; the logits at every position
// must equal the full-sequence forward's over that prefix (≤ 1e-5), and the greedy tokens a
// float64 PyTorch Llama's, which recomputes everything for each token. Odd shape: 6 query heads
// over 3 k/v heads (groups of 2), head_dim 16 — with llama3 rope scaling and an untied head, and
// again with Qwen 2's biases, and with Llama's attention_bias.
void check_decode(const lk::Config& config) {
  constexpr int64_t kPrompt = 5;
  const int64_t window = config.n_ctx;
  const int64_t greedy = window - kPrompt;
  const TinyLlama model(config, lk::BatchShape{1, kPrompt}, kSeed, greedy);
  const float* p = model.params().data();
  const int64_t c = config.n_embd;
  const int64_t vocab = config.vocab_size;
  const float* norm = p + model.norm_offset();
  const lk::HeadWeights head{norm, config.tie_word_embeddings ? p : norm + c};

  Aligned workspace(lk::decode_workspace_size_bytes(config, kPrompt, window));
  const lk::Workspace ws{workspace.data, workspace.size_bytes};
  std::vector<std::vector<float>> keys(static_cast<size_t>(config.n_layer)), values(keys.size());
  std::vector<lk::KvCacheBlock> cache;
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i].assign(static_cast<size_t>(window * config.kv_width()), 0.0f);
    values[i].assign(keys[i].size(), 0.0f);
    cache.push_back({keys[i].data(), values[i].data(), window});
  }
  std::vector<float> x_a(static_cast<size_t>(kPrompt * c)), x_b(x_a.size());
  // One decode pass for `rows` tokens at positions past…; the logits of the last one.
  auto pass = [&](const int32_t* tokens, int64_t past, int64_t rows) {
    lk::embedding_decode(config, rows, tokens, p, x_a.data());
    for (int64_t i = 0; i < config.n_layer; ++i) {
      lk::block_decode(config, past, rows, lk::bind_block(config, p + model.block_offset(i)), x_a.data(), x_b.data(),
                       cache[static_cast<size_t>(i)], ws);
      std::swap(x_a, x_b);
    }
    std::vector<float> logits(static_cast<size_t>(vocab));
    lk::head_decode(config, rows, head, x_a.data(), logits.data(), ws);
    return logits;
  };
  // The reference of one position: the whole prefix through block_forward.
  auto full = [&](const std::vector<int32_t>& sequence, int64_t length) {
    const lk::BatchShape shape{1, length};
    Aligned full_ws(lk::workspace_size_bytes(config, shape));
    std::vector<float> a(static_cast<size_t>(length * c)), b(a.size()), logits(static_cast<size_t>(vocab));
    lk::embedding_forward(config, shape, sequence.data(), p, a.data());
    for (int64_t i = 0; i < config.n_layer; ++i) {
      lk::block_forward(config, shape, lk::bind_block(config, p + model.block_offset(i)), a.data(), b.data(),
                        {full_ws.data, full_ws.size_bytes});
      std::swap(a, b);
    }
    lk::head_forward(config, shape, head, a.data(), logits.data(), {full_ws.data, full_ws.size_bytes});
    return logits;
  };
  auto argmax = [](const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
  };

  std::vector<int32_t> sequence(model.tokens().begin(), model.tokens().begin() + kPrompt);
  std::vector<std::vector<float>> decoded;  // logits at positions kPrompt−1 … window−2
  decoded.push_back(pass(sequence.data(), 0, kPrompt));
  while (static_cast<int64_t>(sequence.size()) < window) {
    sequence.push_back(argmax(decoded.back()));
    if (static_cast<int64_t>(sequence.size()) < window)
      decoded.push_back(pass(&sequence.back(), static_cast<int64_t>(sequence.size()) - 1, 1));
  }
  double worst = 0.0;
  for (size_t k = 0; k < decoded.size(); ++k) {
    const int64_t length = kPrompt + static_cast<int64_t>(k);
    const double error = relative_error(decoded[k].data(), [&] {
      std::vector<float> f = full(sequence, length);
      return std::vector<double>(f.begin(), f.end());
    }());
    EXPECT_LE(error, kMaxRelativeError) << "prompt-then-tokens decode at position " << length - 1;
    worst = std::max(worst, error);
  }
  // Again from position 0, one token per pass: every position of the window.
  for (int64_t t = 0; t < window; ++t) {
    const std::vector<float> logits = pass(&sequence[static_cast<size_t>(t)], t, 1);
    const std::vector<float> f = full(sequence, t + 1);
    const double error = relative_error(logits.data(), std::vector<double>(f.begin(), f.end()));
    EXPECT_LE(error, kMaxRelativeError) << "token-at-a-time decode at position " << t;
    worst = std::max(worst, error);
  }
  std::printf("decode vs full forward over %lld positions: worst relative error %.2e\n",
              static_cast<long long>(window), worst);

  TempDir dir;
  model.write(dir.path() / "decode");
  const std::string command =
      std::string(STRATA_PYTHON3) + " " + STRATA_LLAMA_REFERENCE + " " + (dir.path() / "decode").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << "the PyTorch reference script failed";
  const std::vector<double> reference = read_f64((dir.path() / "decode" / "out" / "greedy.f64").string(), greedy);
  for (int64_t k = 0; k < greedy; ++k)
    EXPECT_EQ(sequence[static_cast<size_t>(kPrompt + k)], static_cast<int32_t>(reference[static_cast<size_t>(k)]))
        << "greedy token " << k;
}

TEST(LlamaDecode, KvCacheMatchesFullForwardAndTorchGreedy) {
  check_decode(make_config(2, 6, 3, 16, 80, 112, 67, 24, false, 8.0));
}

// Qwen 2's q/k/v biases: the cached keys hold k's bias rotated at its own position.
TEST(LlamaDecode, Qwen2BiasesMatchFullForwardAndTorchGreedy) { check_decode(qwen_config(24, false)); }

// Llama's attention_bias (o_proj's bias too), tied.
TEST(LlamaDecode, AttentionBiasMatchesFullForwardAndTorchGreedy) {
  check_decode(make_config(2, 6, 3, 16, 80, 112, 67, 24, true, 8.0, true, true));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaMatchesTorch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace

int main(int argc, char** argv) {
  const std::string probe = std::string(STRATA_PYTHON3) + " -c 'import torch' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    std::fprintf(stderr, "SKIP: %s cannot import torch; install Debian's python3-torch to run the Llama checks\n",
                 STRATA_PYTHON3);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
