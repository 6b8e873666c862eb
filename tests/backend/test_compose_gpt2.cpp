// tests/backend/test_compose_gpt2.cpp — proves that GPT-2's definition composed of the backend's
// operations (models/gpt2.cpp over kernels/ops.h) gives exactly the bytes of the GPT-2 kernels
// called directly (tests/reference/gpt2_reference.h): the same inputs through both, every output compared with
// memcmp. Each case runs on the cpu device (host memory) and on the emulated one (device memory
// the test reaches only by copies, the backend waiting on its stream before each op), so it
// also proves the emulated device gives the cpu's bits. Cases: the embedding, plain and packed;
// the block forward and backward — plain, packed, LoRA with dropout on all four targets, a
// frozen base (null grads) with and without adapters, recompute on and off, d_in aliasing d_out
// or not; the head over two chunks — plain, masked, masked with an explicit normaliser, every
// row masked, evaluation (loss only), a frozen head (d_x_final only) and a frozen ln_f.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/reference/gpt2_reference.h"
#include "kernels/lora/lora.h"
#include "models/model.h"
#include "tests/backend/backend_harness.h"
#include "tests/backend/compose_support.h"

namespace strata::testing {
namespace {

// The reference kernels, with the shape's names (gpt2_reference.h).
namespace gref = reference::gpt2;

namespace lora = kernels::lora;

// Two head chunks (300 rows: 256 + 44) with several heads and rows of a length that no tile
// divides; small enough for milliseconds.
ModelConfig model_config() {
  ModelConfig model;
  model.arch = "gpt2";
  model.n_layer = 1;
  model.n_head = 4;
  model.n_embd = 32;
  model.vocab_size = 96;
  model.seq_len = 100;
  return model;
}
const gref::BatchShape kShape{3, 100};
constexpr int64_t kRank = 4;
constexpr uint64_t kMaskKey = 0x5eed;


std::vector<float> concat(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> joined = a;
  joined.insert(joined.end(), b.begin(), b.end());
  return joined;
}
std::vector<float> slice(const std::vector<float>& v, size_t begin, size_t count) {
  return {v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(begin + count)};
}

// Three rows of 100 packed with examples of 37+63, 1+50+49 and 100 tokens (ids non-decreasing,
// not consecutive).
struct Packing {
  std::vector<int32_t> positions, segments;
};
Packing packing() {
  const std::vector<std::vector<int>> lengths = {{37, 63}, {1, 50, 49}, {100}};
  const std::vector<std::vector<int32_t>> ids = {{0, 1}, {2, 5, 6}, {9}};
  Packing p;
  for (size_t row = 0; row < lengths.size(); ++row)
    for (size_t e = 0; e < lengths[row].size(); ++e)
      for (int i = 0; i < lengths[row][e]; ++i) {
        p.positions.push_back(i);
        p.segments.push_back(ids[row][e]);
      }
  return p;
}

// The inputs every case draws from (fixed seeds), and the step's batch.
struct Inputs {
  ModelConfig model = model_config();
  gref::Config kc = models::gpt2_shape_config(model);
  size_t rows = static_cast<size_t>(kShape.rows());
  size_t act = rows * static_cast<size_t>(kc.n_embd);
  size_t wte_n = static_cast<size_t>(kc.vocab_size * kc.n_embd);
  size_t wpe_n = static_cast<size_t>(kc.n_ctx * kc.n_embd);
  size_t block_n = static_cast<size_t>(gref::block_param_count(kc));
  std::vector<int32_t> tokens = random_tokens(rows, static_cast<int32_t>(kc.vocab_size), 101);
  std::vector<int32_t> targets = random_tokens(rows, static_cast<int32_t>(kc.vocab_size), 102);
  Packing packed = packing();
  bool use_packing = false;
  int64_t normalizer = 0;

  kernels::StepBatch batch() const {
    kernels::StepBatch b{tokens.data(), targets.data(), kShape.seq_len * kShape.batch};
    b.loss_normalizer_tokens = normalizer;
    if (use_packing) {
      b.positions = packed.positions.data();
      b.segments = packed.segments.data();
    }
    return b;
  }
  gref::PackedRows packed_rows() const {
    return use_packing ? gref::PackedRows{packed.positions.data(), packed.segments.data()} : gref::PackedRows{};
  }
};

class ComposeGpt2 : public ::testing::TestWithParam<device::Kind> {
 protected:
  void SetUp() override {
    env_ = BackendEnv::create(GetParam());
    ASSERT_NE(env_, nullptr);
    definition_ = models::make_model_definition(in_.model);
    ASSERT_STREQ(definition_->arch(), "gpt2");
  }
  kernels::ComputeBackend& backend() { return env_->backend(); }
  void begin_step() { ASSERT_TRUE(backend().begin_step(in_.batch()).ok()); }
  // The definition's workspace on this backend, in the device's memory.
  gref::Workspace workspace() { return env_->workspace_for(definition_->workspace_size_bytes(backend(), kShape)); }

  Inputs in_;
  std::unique_ptr<BackendEnv> env_;
  std::unique_ptr<const models::ModelDefinition> definition_;
};

// --- the embedding ---

void embedding_case(BackendEnv& env, const models::ModelDefinition& def, Inputs& in) {
  const auto wte = random_floats(in.wte_n, 0.1f, 1), wpe = random_floats(in.wpe_n, 0.1f, 2);
  const auto d_x0 = random_floats(in.act, 0.1f, 3);
  const auto d_wte0 = random_floats(in.wte_n, 0.1f, 4), d_wpe0 = random_floats(in.wpe_n, 0.1f, 5);  // accumulated into

  std::vector<float> x0(in.act), d_wte = d_wte0, d_wpe = d_wpe0;
  gref::embedding_forward(in.kc, kShape, in.tokens.data(), wte.data(), wpe.data(), x0.data(), in.packed_rows());
  gref::embedding_backward(in.kc, kShape, in.tokens.data(), d_x0.data(), d_wte.data(), d_wpe.data(), in.packed_rows());

  kernels::ComputeBackend& b = env.backend();
  ASSERT_TRUE(b.begin_step(in.batch()).ok());
  const float* embed = env.upload(concat(wte, wpe));
  float* x0_dev = env.zeros<float>(in.act);
  const float* d_x0_dev = env.upload(d_x0);
  float* grads = env.upload(concat(d_wte0, d_wpe0));
  EXPECT_TRUE(def.embedding_forward(b, kShape, embed, x0_dev).ok());
  EXPECT_TRUE(def.embedding_backward(b, kShape, d_x0_dev, grads).ok());
  const auto got_grads = env.download(grads, in.wte_n + in.wpe_n);
  expect_same_bits("x0", env.download(x0_dev, in.act), x0);
  expect_same_bits("d_wte", slice(got_grads, 0, in.wte_n), d_wte);
  expect_same_bits("d_wpe", slice(got_grads, in.wte_n, in.wpe_n), d_wpe);
  ASSERT_TRUE(b.end_step().ok());
}

TEST_P(ComposeGpt2, Embedding) { embedding_case(*env_, *definition_, in_); }

TEST_P(ComposeGpt2, EmbeddingPacked) {
  in_.use_packing = true;
  embedding_case(*env_, *definition_, in_);
}

// --- the block ---

struct BlockCase {
  std::string name;
  bool packed = false;
  bool lora = false;
  float dropout = 0.0f;
  bool frozen = false;     // null block grads
  bool recompute = true;
  bool alias = true;       // d_in == d_out (the trainer's in-place backward)
};

struct BlockOutputs {
  std::vector<float> x_out, d_in, grads;
  std::vector<std::vector<float>> d_a, d_b;
};

// GPT-2's four adapter targets: (in, out) of attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
std::vector<std::pair<int64_t, int64_t>> lora_targets(int64_t c) {
  return {{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}};
}

BlockOutputs run_block_case(BackendEnv& env, const models::ModelDefinition& def, const Inputs& in,
                            const BlockCase& k, bool composed) {
  const int64_t c = in.kc.n_embd;
  const auto weights = block_weights(in.kc, 6);
  const auto x_in = random_floats(in.act, 1.0f, 7);
  const auto d_out = random_floats(in.act, 0.01f, 8);
  const auto grads0 = random_floats(in.block_n, 0.01f, 9);  // accumulated into
  const auto targets = lora_targets(c);
  std::vector<std::vector<float>> a, bm, d_a0, d_b0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto [fan_in, fan_out] = targets[i];
    a.push_back(random_floats(static_cast<size_t>(kRank * fan_in), 0.2f, 20 + static_cast<uint32_t>(i)));
    bm.push_back(random_floats(static_cast<size_t>(fan_out * kRank), 0.2f, 30 + static_cast<uint32_t>(i)));
    d_a0.push_back(random_floats(a.back().size(), 0.01f, 40 + static_cast<uint32_t>(i)));
    d_b0.push_back(random_floats(bm.back().size(), 0.01f, 50 + static_cast<uint32_t>(i)));
  }
  const lora::Spec spec{kRank, 0.5f, k.dropout, /*mask_first_row=*/17};
  const size_t scratch_bytes = lora::scratch_size_bytes(kShape.rows(), 4 * c, 4 * c, kRank, k.dropout);
  lora::BlockAdapters adapters;
  adapters.spec = spec;
  adapters.mask_key = kMaskKey;
  BlockOutputs out;

  if (!composed) {  // the kernels, on host vectors
    Aligned ws(gref::workspace_size_bytes(in.kc, kShape)), scratch(scratch_bytes);
    adapters.scratch = scratch.workspace();
    out.d_a = d_a0;
    out.d_b = d_b0;
    for (size_t i = 0; i < targets.size(); ++i) {
      adapters.adapters[i] = {a[i].data(), bm[i].data()};
      adapters.grads[i] = {out.d_a[i].data(), out.d_b[i].data()};
    }
    const lora::BlockAdapters* ad = k.lora ? &adapters : nullptr;
    const gref::BlockWeights w = gref::bind_block(in.kc, weights.data());
    out.x_out.assign(in.act, 0.0f);
    out.grads = grads0;
    const gref::BlockGrads g = k.frozen ? gref::BlockGrads{} : gref::bind_block(in.kc, out.grads.data());
    gref::block_forward(in.kc, kShape, w, x_in.data(), out.x_out.data(), ws.workspace(), in.packed_rows(), ad);
    // With recompute the backward must not need what the forward left: clear it.
    if (k.recompute) std::memset(ws.data, 0, ws.size_bytes);
    std::vector<float> d_out_host = d_out, d_in_host(in.act, 0.0f);
    float* d_in_ptr = k.alias ? d_out_host.data() : d_in_host.data();
    gref::block_backward(in.kc, kShape, w, x_in.data(), d_out_host.data(), d_in_ptr, g, ws.workspace(), k.recompute,
                       in.packed_rows(), ad);
    out.d_in = k.alias ? d_out_host : d_in_host;
    return out;
  }

  kernels::ComputeBackend& b = env.backend();
  EXPECT_TRUE(b.begin_step(in.batch()).ok());
  const float* w = env.upload(weights);
  const float* x_in_dev = env.upload(x_in);
  float* x_out = env.zeros<float>(in.act);
  float* d_out_dev = env.upload(d_out);
  float* d_in_dev = k.alias ? d_out_dev : env.zeros<float>(in.act);
  float* grads = k.frozen ? nullptr : env.upload(grads0);
  const gref::Workspace ws = env.workspace_for(def.workspace_size_bytes(b, kShape));
  adapters.scratch = env.workspace_for(scratch_bytes);
  std::vector<float*> d_a_dev, d_b_dev;
  for (size_t i = 0; i < targets.size(); ++i) {
    d_a_dev.push_back(env.upload(d_a0[i]));
    d_b_dev.push_back(env.upload(d_b0[i]));
    adapters.adapters[i] = {env.upload(a[i]), env.upload(bm[i])};
    adapters.grads[i] = {d_a_dev[i], d_b_dev[i]};
  }
  const lora::BlockAdapters* ad = k.lora ? &adapters : nullptr;
  expect_ok(def.block_forward(b, kShape, w, x_in_dev, x_out, ws, ad));
  if (k.recompute) expect_ok(b.zero(ws.data, ws.size_bytes / sizeof(float)));
  expect_ok(def.block_backward(b, kShape, w, x_in_dev, d_out_dev, d_in_dev, grads, ws, k.recompute, ad));
  out.x_out = env.download(x_out, in.act);
  out.d_in = env.download(d_in_dev, in.act);
  out.grads = grads == nullptr ? grads0 : env.download(grads, in.block_n);
  for (size_t i = 0; i < targets.size(); ++i) {
    out.d_a.push_back(env.download(d_a_dev[i], d_a0[i].size()));
    out.d_b.push_back(env.download(d_b_dev[i], d_b0[i].size()));
  }
  EXPECT_TRUE(b.end_step().ok());
  return out;
}

class ComposeGpt2Block : public ComposeGpt2 {
 protected:
  void check(const BlockCase& k) {
    SCOPED_TRACE(k.name);
    in_.use_packing = k.packed;
    const BlockOutputs direct = run_block_case(*env_, *definition_, in_, k, false);
    const BlockOutputs composed = run_block_case(*env_, *definition_, in_, k, true);
    expect_same_bits("x_out", composed.x_out, direct.x_out);
    expect_same_bits("d_in", composed.d_in, direct.d_in);
    expect_same_bits("grads", composed.grads, direct.grads);
    for (size_t i = 0; i < direct.d_a.size(); ++i) {
      expect_same_bits("d_A " + std::to_string(i), composed.d_a[i], direct.d_a[i]);
      expect_same_bits("d_B " + std::to_string(i), composed.d_b[i], direct.d_b[i]);
    }
  }
};

TEST_P(ComposeGpt2Block, Plain) { check({"plain"}); }
TEST_P(ComposeGpt2Block, PlainNoRecompute) { check({.name = "plain, recompute false", .recompute = false}); }
TEST_P(ComposeGpt2Block, PlainSeparateDIn) { check({.name = "plain, d_in apart from d_out", .alias = false}); }
TEST_P(ComposeGpt2Block, Packed) { check({.name = "packed", .packed = true}); }
TEST_P(ComposeGpt2Block, PackedNoRecompute) {
  check({.name = "packed, recompute false", .packed = true, .recompute = false});
}
TEST_P(ComposeGpt2Block, Frozen) { check({.name = "frozen base", .frozen = true}); }
TEST_P(ComposeGpt2Block, LoraDropout) { check({.name = "lora dropout", .lora = true, .dropout = 0.25f}); }
TEST_P(ComposeGpt2Block, LoraDropoutNoRecompute) {
  check({.name = "lora dropout, recompute false", .lora = true, .dropout = 0.25f, .recompute = false});
}
TEST_P(ComposeGpt2Block, LoraDropoutFrozenBase) {
  check({.name = "lora dropout, frozen base", .lora = true, .dropout = 0.25f, .frozen = true});
}
TEST_P(ComposeGpt2Block, LoraFrozenBasePackedSeparateDIn) {
  check({.name = "lora, frozen base, packed, d_in apart",
         .packed = true,
         .lora = true,
         .frozen = true,
         .recompute = false,
         .alias = false});
}

// --- the head ---

enum class HeadGrad { full, eval, frozen_head, frozen_ln_f };
struct HeadCase {
  std::string name;
  std::string masks;  // apply_masks' suffix: "", "_masked", "_masked_normalizer", "_all_masked"
  HeadGrad grad = HeadGrad::full;
};

class ComposeGpt2Head : public ComposeGpt2 {
 protected:
  void check(const HeadCase& k) {
    SCOPED_TRACE(k.name);
    in_.normalizer = apply_masks("head" + k.masks, in_.targets);
    const int64_t c = in_.kc.n_embd;
    const auto ln_f = random_floats(2 * static_cast<size_t>(c), 0.1f, 60, 0.5f);
    const auto wte = random_floats(in_.wte_n, 0.1f, 61), wpe = random_floats(in_.wpe_n, 0.1f, 62);
    const auto x = random_floats(in_.act, 1.0f, 63);
    const auto ln_f_grads0 = random_floats(2 * static_cast<size_t>(c), 0.01f, 64);  // accumulated into
    const auto wte_grads0 = random_floats(in_.wte_n, 0.01f, 65), wpe_grads0 = random_floats(in_.wpe_n, 0.01f, 66);
    const bool gradient = k.grad != HeadGrad::eval;
    const bool ln_f_trained = k.grad == HeadGrad::full;
    const bool wte_trained = k.grad == HeadGrad::full || k.grad == HeadGrad::frozen_ln_f;

    // The kernels.
    Aligned ws(gref::workspace_size_bytes(in_.kc, kShape));
    std::vector<float> d_x(in_.act, 0.0f), ln_f_grads = ln_f_grads0, wte_grads = wte_grads0;
    const gref::HeadWeights weights{ln_f.data(), ln_f.data() + c, wte.data()};
    const gref::HeadGrads grads{ln_f_trained ? ln_f_grads.data() : nullptr,
                              ln_f_trained ? ln_f_grads.data() + c : nullptr,
                              wte_trained ? wte_grads.data() : nullptr};
    const float loss = gradient ? gref::head_forward_backward(in_.kc, kShape, weights, x.data(), in_.targets.data(),
                                                            d_x.data(), grads, ws.workspace(), in_.normalizer)
                                : gref::head_loss(in_.kc, kShape, weights, x.data(), in_.targets.data(), ws.workspace(),
                                                in_.normalizer);

    // The definition on the backend.
    kernels::ComputeBackend& b = backend();
    begin_step();
    const float* ln_f_dev = env_->upload(ln_f);
    const float* embed = env_->upload(concat(wte, wpe));
    const float* x_dev = env_->upload(x);
    float* d_x_dev = gradient ? env_->upload(std::vector<float>(in_.act, 7.0f)) : nullptr;  // overwritten
    float* ln_f_grads_dev = ln_f_trained ? env_->upload(ln_f_grads0) : nullptr;
    float* embed_grads_dev = wte_trained ? env_->upload(concat(wte_grads0, wpe_grads0)) : nullptr;
    expect_ok(definition_->head_forward_backward(b, kShape, ln_f_dev, embed, x_dev, d_x_dev, ln_f_grads_dev,
                                                 embed_grads_dev, workspace()));
    auto scalars = b.end_step();
    ASSERT_TRUE(scalars.ok());
    // The backend's loss is the kernels' float, widened.
    const auto got_loss = static_cast<float>(scalars->loss);
    EXPECT_EQ(scalars->loss, static_cast<double>(got_loss));
    EXPECT_EQ(std::memcmp(&got_loss, &loss, sizeof loss), 0) << "loss: composed " << got_loss << ", kernels " << loss;
    if (k.masks != "_all_masked") {
      EXPECT_GT(loss, 0.0f);  // a loss that is there to compare
    }
    if (gradient) expect_same_bits("d_x_final", env_->download(d_x_dev, in_.act), d_x);
    if (ln_f_trained)
      expect_same_bits("d_ln_f", env_->download(ln_f_grads_dev, 2 * static_cast<size_t>(c)), ln_f_grads);
    if (wte_trained) {
      const auto got = env_->download(embed_grads_dev, in_.wte_n + in_.wpe_n);
      expect_same_bits("d_wte", slice(got, 0, in_.wte_n), wte_grads);
      expect_same_bits("d_wpe (untouched)", slice(got, in_.wte_n, in_.wpe_n), wpe_grads0);
    }
  }
};

TEST_P(ComposeGpt2Head, Plain) { check({"plain", ""}); }
TEST_P(ComposeGpt2Head, Masked) { check({"masked", "_masked"}); }
TEST_P(ComposeGpt2Head, MaskedNormalizer) { check({"masked, N = 40", "_masked_normalizer"}); }
TEST_P(ComposeGpt2Head, AllMasked) { check({"every row masked", "_all_masked"}); }
TEST_P(ComposeGpt2Head, Eval) { check({"evaluation", "", HeadGrad::eval}); }
TEST_P(ComposeGpt2Head, EvalMaskedNormalizer) { check({"evaluation, masked, N = 40", "_masked_normalizer", HeadGrad::eval}); }
TEST_P(ComposeGpt2Head, FrozenHead) { check({"frozen head: d_x_final only", "_masked", HeadGrad::frozen_head}); }
TEST_P(ComposeGpt2Head, FrozenLnF) { check({"frozen ln_f, d_wte trained", "", HeadGrad::frozen_ln_f}); }

// The workspace the definition asks a backend for is what it says for the kind before any
// backend exists (planning sizes the same buffer the trainer allocates).
TEST_P(ComposeGpt2, WorkspaceSizeAgreesWithKind) {
  EXPECT_EQ(definition_->workspace_size_bytes(backend(), kShape), definition_->workspace_size_bytes(GetParam(), kShape));
}

std::string kind_name(const ::testing::TestParamInfo<device::Kind>& info) { return device::kind_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Devices, ComposeGpt2, ::testing::Values(device::Kind::cpu, device::Kind::emulated), kind_name);
INSTANTIATE_TEST_SUITE_P(Devices, ComposeGpt2Block, ::testing::Values(device::Kind::cpu, device::Kind::emulated),
                         kind_name);
INSTANTIATE_TEST_SUITE_P(Devices, ComposeGpt2Head, ::testing::Values(device::Kind::cpu, device::Kind::emulated),
                         kind_name);

}  // namespace
}  // namespace strata::testing
