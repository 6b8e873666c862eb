// tests/backend/test_compose_llama.cpp — proves the Llama definition composed of backend operations
// (models/llama.cpp through models/decoder.h) is the old Llama CPU kernels to the bit: each case
// runs one step — embedding forward, a block's forward and backward, the embedding's backward, the
// head — through make_model_definition's ops on the CPU backend (on the cpu device, and on the
// emulated one, whose memory the test reaches only by copies), and the same step through the
// reference kernels (tests/reference/llama_reference.h) called directly on host vectors with the
// same inputs, then memcmp's every output, gradient and the step's loss. The cases cover what the
// kernels branch on: GQA, attention biases, llama3 RoPE scaling, packed rows, LoRA with dropout on
// all seven targets, frozen bases, recompute or not, tied and untied heads over two head chunks
// with loss masks and a normalizer, and evaluation (the loss alone). The decode ops likewise (a
// prompt then single tokens over a KV cache, fp32 and bf16 weights) against llama_reference.cpp's
// decode entry points.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/reference/llama_reference.h"
#include "kernels/lora/lora.h"
#include "models/decoder.h"
#include "models/model.h"
#include "tests/backend/backend_harness.h"

namespace strata::testing {
namespace {

namespace lk = reference::llama;
namespace lora = kernels::lora;

struct Case {
  std::string name;
  bool gqa = false;
  bool bias = false;          // qkv_bias and o_proj_bias
  bool rope_scaling = false;  // llama3
  bool packed = false;        // small_packing's positions and segments
  bool lora = false;          // all 7 targets, dropout 0.1
  bool frozen = false;        // no block or head gradient (LoRA's frozen base)
  bool recompute = true;
  bool tied = true;
  bool masks = false;         // loss masks and a normalizer of 40
  bool eval = false;          // the head's loss only
  bool long_rows = false;     // 3 × 100 rows: two head chunks (kHeadChunkRows = 256)
};

std::vector<Case> cases() {
  std::vector<Case> all;
  all.push_back({.name = "plain"});
  all.push_back({.name = "gqa", .gqa = true});
  all.push_back({.name = "bias", .gqa = true, .bias = true});
  all.push_back({.name = "rope_llama3", .gqa = true, .rope_scaling = true});
  all.push_back({.name = "packed", .gqa = true, .bias = true, .rope_scaling = true, .packed = true});
  all.push_back({.name = "lora", .gqa = true, .bias = true, .lora = true});
  all.push_back({.name = "lora_frozen_packed", .gqa = true, .packed = true, .lora = true, .frozen = true});
  all.push_back({.name = "frozen", .gqa = true, .bias = true, .frozen = true});
  all.push_back({.name = "no_recompute", .gqa = true, .bias = true, .lora = true, .recompute = false});
  all.push_back({.name = "no_recompute_packed", .gqa = true, .packed = true, .recompute = false});
  all.push_back({.name = "untied", .gqa = true, .tied = false});
  all.push_back({.name = "tied_masks_two_chunks", .gqa = true, .masks = true, .long_rows = true});
  all.push_back({.name = "untied_masks_two_chunks", .gqa = true, .tied = false, .masks = true, .long_rows = true});
  all.push_back({.name = "eval_tied", .gqa = true, .eval = true, .long_rows = true});
  all.push_back({.name = "eval_untied_masks", .gqa = true, .tied = false, .masks = true, .eval = true});
  return all;
}

// The model of a case, and the kernels' config the Llama definition must derive from it.
ModelConfig model_config(const Case& k) {
  ModelConfig m;
  m.arch = "llama";
  m.n_layer = 1;
  m.n_head = 4;
  m.n_kv_head = k.gqa ? 2 : 4;
  m.head_dim = 8;  // ≠ n_embd / n_head
  m.n_embd = 24;
  m.intermediate_size = 40;
  m.vocab_size = 64;
  m.seq_len = k.long_rows ? 100 : 16;
  m.rope_theta = 500.0;
  if (k.rope_scaling) {
    m.rope_scaling.type = "llama3";
    m.rope_scaling.factor = 8.0;
    m.rope_scaling.low_freq_factor = 1.0;
    m.rope_scaling.high_freq_factor = 4.0;
    m.rope_scaling.original_max_position_embeddings = 16;
  }
  m.norm_eps = 1e-6;
  m.tie_word_embeddings = k.tied;
  m.qkv_bias = k.bias;
  m.o_proj_bias = k.bias;
  return m;
}

lk::Config kernel_config(const ModelConfig& m) {
  lk::Config c;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_kv_head = m.kv_heads();
  c.head_dim = m.head_size();
  c.n_embd = m.n_embd;
  c.intermediate_size = m.intermediate_size;
  c.vocab_size = m.vocab_size;
  c.n_ctx = m.seq_len;
  c.rope_theta = m.rope_theta;
  if (m.rope_scaling.type == "llama3") {
    c.rope_factor = m.rope_scaling.factor;
    c.rope_low_freq_factor = m.rope_scaling.low_freq_factor;
    c.rope_high_freq_factor = m.rope_scaling.high_freq_factor;
    c.rope_original_max_positions = m.rope_scaling.original_max_position_embeddings;
  }
  c.norm_eps = m.norm_eps;
  c.tie_word_embeddings = m.tie_word_embeddings;
  c.qkv_bias = m.qkv_bias;
  c.o_bias = m.o_proj_bias;
  return c;
}

// One LoRA target's shape (models::llama::lora_target order).
struct TargetShape {
  int64_t in, out;
};
std::vector<TargetShape> target_shapes(const lk::Config& c) {
  return {{c.n_embd, c.q_width()},  {c.n_embd, c.kv_width()},           {c.n_embd, c.kv_width()},
          {c.q_width(), c.n_embd},  {c.n_embd, c.intermediate_size},    {c.n_embd, c.intermediate_size},
          {c.intermediate_size, c.n_embd}};
}
constexpr int64_t kRank = 4;
constexpr float kDropout = 0.1f;

// Every input of a case, drawn from fixed seeds: the same for the kernels and the definition.
struct Inputs {
  kernels::BatchShape shape;
  std::vector<int32_t> tokens, targets, positions, segments;
  int64_t normalizer = 0;
  std::vector<float> block, embed, final_unit, x_in, d_out, d_x0, x_final;
  std::vector<float> block_grads, embed_grads, final_grads;  // accumulated into
  std::vector<std::vector<float>> lora_a, lora_b, lora_d_a, lora_d_b;
};

Inputs make_inputs(const Case& k, const lk::Config& c) {
  Inputs in;
  in.shape = k.long_rows ? kernels::BatchShape{3, 100} : small_shape();
  const auto rows = static_cast<size_t>(in.shape.rows());
  const auto act = rows * static_cast<size_t>(c.n_embd);
  const auto table = static_cast<size_t>(c.vocab_size * c.n_embd);
  in.tokens = random_tokens(rows, static_cast<int32_t>(c.vocab_size), 101);
  in.targets = random_tokens(rows, static_cast<int32_t>(c.vocab_size), 102);
  if (k.masks) in.normalizer = apply_masks("_masked_normalizer", in.targets);
  if (k.packed) {
    const SmallPacking p = small_packing();
    in.positions = p.positions;
    in.segments = p.segments;
  }
  const auto block_n = static_cast<size_t>(lk::block_param_count(c));
  in.block = random_floats(block_n, 0.1f, 103);
  size_t offset = 0;
  for (const auto& spec : lk::block_param_specs(c)) {
    if (spec.name_suffix.ends_with("layernorm.weight"))
      for (int64_t j = 0; j < spec.numel(); ++j) in.block[offset + static_cast<size_t>(j)] += 1.0f;
    offset += static_cast<size_t>(spec.numel());
  }
  in.embed = random_floats(table, 0.5f, 104);
  // The final unit: model.norm (around 1), then lm_head when untied.
  in.final_unit = random_floats(static_cast<size_t>(c.n_embd), 0.1f, 105, 1.0f);
  if (!c.tie_word_embeddings) {
    const auto lm_head = random_floats(table, 0.1f, 106);
    in.final_unit.insert(in.final_unit.end(), lm_head.begin(), lm_head.end());
  }
  in.x_in = random_floats(act, 1.0f, 107);
  in.d_out = random_floats(act, 0.01f, 108);
  in.d_x0 = random_floats(act, 0.1f, 109);
  in.x_final = random_floats(act, 1.0f, 110);
  in.block_grads = random_floats(block_n, 0.01f, 111);
  in.embed_grads = random_floats(table, 0.01f, 112);
  in.final_grads = random_floats(in.final_unit.size(), 0.01f, 113);
  if (k.lora) {
    uint32_t seed = 200;
    for (const TargetShape& t : target_shapes(c)) {
      in.lora_a.push_back(random_floats(static_cast<size_t>(kRank * t.in), 0.2f, seed++));
      in.lora_b.push_back(random_floats(static_cast<size_t>(t.out * kRank), 0.2f, seed++));
      in.lora_d_a.push_back(random_floats(static_cast<size_t>(kRank * t.in), 0.01f, seed++));
      in.lora_d_b.push_back(random_floats(static_cast<size_t>(t.out * kRank), 0.01f, seed++));
    }
  }
  return in;
}

size_t lora_scratch_bytes(const lk::Config& c, const kernels::BatchShape& shape) {
  const int64_t max_in = std::max({c.n_embd, c.q_width(), c.intermediate_size});
  const int64_t max_out = std::max({c.q_width(), c.kv_width(), c.n_embd, c.intermediate_size});
  return lora::scratch_size_bytes(shape.rows(), max_in, max_out, kRank, kDropout);
}

lora::Spec lora_spec() { return lora::Spec{kRank, 0.75f, kDropout, 0}; }
constexpr uint64_t kMaskKey = 0x5eed1234;

// The step's named outputs, and its loss as the fp32 the kernels return.
struct Outputs {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  float loss = 0.0f;
};

// 64-byte aligned host scratch.
struct AlignedFloats {
  explicit AlignedFloats(size_t bytes) : storage(bytes / sizeof(float) + 32) {
    data = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64);
  }
  std::vector<float> storage;
  float* data;
};

// The step through the reference kernels (tests/reference/llama_reference.h) called directly (the
// old path: what CpuBackend's llama_ ops ran).
Outputs run_kernels(const Case& k, const lk::Config& c, Inputs in) {
  const kernels::BatchShape s = in.shape;
  const size_t ws_bytes = lk::workspace_size_bytes(c, s);
  AlignedFloats ws_storage(ws_bytes);
  const kernels::Workspace ws{ws_storage.data, ws_bytes};
  const kernels::PackedRows packed =
      k.packed ? kernels::PackedRows{in.positions.data(), in.segments.data()} : kernels::PackedRows{};
  const size_t lora_bytes = lora_scratch_bytes(c, s);
  AlignedFloats lora_storage(lora_bytes);
  lora::BlockAdapters adapters;
  if (k.lora) {
    adapters.spec = lora_spec();
    adapters.mask_key = kMaskKey;
    for (size_t t = 0; t < in.lora_a.size(); ++t) {
      adapters.adapters[t] = {in.lora_a[t].data(), in.lora_b[t].data()};
      adapters.grads[t] = {in.lora_d_a[t].data(), in.lora_d_b[t].data()};
    }
    adapters.scratch = kernels::Workspace{lora_storage.data, lora_bytes};
  }
  const lora::BlockAdapters* adapters_or_null = k.lora ? &adapters : nullptr;
  const auto act = static_cast<size_t>(s.rows() * c.n_embd);
  Outputs out;
  std::vector<float> x0(act), x_out(act), d_in(act), d_x_final(act);

  lk::embedding_forward(c, s, in.tokens.data(), in.embed.data(), x0.data());
  const lk::BlockWeights w = lk::bind_block(c, static_cast<const float*>(in.block.data()));
  lk::block_forward(c, s, w, in.x_in.data(), x_out.data(), ws, packed, adapters_or_null);
  const lk::BlockGrads g = k.frozen ? lk::BlockGrads{} : lk::bind_block(c, in.block_grads.data());
  lk::block_backward(c, s, w, in.x_in.data(), in.d_out.data(), d_in.data(), g, ws, k.recompute, packed,
                     adapters_or_null);
  lk::embedding_backward(c, s, in.tokens.data(), in.d_x0.data(), in.embed_grads.data());
  const lk::HeadWeights head{in.final_unit.data(),
                             c.tie_word_embeddings ? in.embed.data() : in.final_unit.data() + c.n_embd};
  const lk::HeadGrads head_grads =
      k.frozen ? lk::HeadGrads{}
               : lk::HeadGrads{in.final_grads.data(),
                               c.tie_word_embeddings ? in.embed_grads.data() : in.final_grads.data() + c.n_embd};
  if (k.eval) {
    out.loss = lk::head_loss(c, s, head, in.x_final.data(), in.targets.data(), ws, in.normalizer);
  } else {
    out.loss = lk::head_forward_backward(c, s, head, in.x_final.data(), in.targets.data(), d_x_final.data(),
                                         head_grads, ws, in.normalizer);
  }
  out.tensors = {{"x0", x0},
                 {"x_out", x_out},
                 {"d_in", d_in},
                 {"block_grads", in.block_grads},
                 {"embed_grads", in.embed_grads},
                 {"d_x_final", d_x_final},
                 {"final_grads", in.final_grads}};
  for (size_t t = 0; t < in.lora_a.size(); ++t) {
    out.tensors.push_back({"lora_d_a." + std::to_string(t), in.lora_d_a[t]});
    out.tensors.push_back({"lora_d_b." + std::to_string(t), in.lora_d_b[t]});
  }
  return out;
}

// The step through the Llama definition's ops on a backend of `kind` (the new path).
Outputs run_definition(const Case& k, const ModelConfig& model, const lk::Config& c, const Inputs& in,
                       device::Kind kind) {
  const kernels::BatchShape s = in.shape;
  Outputs out;
  auto env = BackendEnv::create(kind);
  if (env == nullptr) return out;
  const auto def = models::make_model_definition(model);
  kernels::ComputeBackend& b = env->backend();
  kernels::StepBatch batch{in.tokens.data(), in.targets.data(), s.rows()};
  batch.loss_normalizer_tokens = in.normalizer;
  if (k.packed) {
    batch.positions = in.positions.data();
    batch.segments = in.segments.data();
  }
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };
  expect_ok(b.begin_step(batch));
  const kernels::Workspace ws = env->workspace_for(def->workspace_size_bytes(b, s));
  lora::BlockAdapters adapters;
  std::vector<float*> d_a, d_b;
  if (k.lora) {
    adapters.spec = lora_spec();
    adapters.mask_key = kMaskKey;
    for (size_t t = 0; t < in.lora_a.size(); ++t) {
      adapters.adapters[t] = {env->upload(in.lora_a[t]), env->upload(in.lora_b[t])};
      d_a.push_back(env->upload(in.lora_d_a[t]));
      d_b.push_back(env->upload(in.lora_d_b[t]));
      adapters.grads[t] = {d_a.back(), d_b.back()};
    }
    adapters.scratch = env->workspace_for(lora_scratch_bytes(c, s));
  }
  const lora::BlockAdapters* adapters_or_null = k.lora ? &adapters : nullptr;
  const auto act = static_cast<size_t>(s.rows() * c.n_embd);
  float* embed = env->upload(in.embed);
  float* block = env->upload(in.block);
  float* final_unit = env->upload(in.final_unit);
  float* x_in = env->upload(in.x_in);
  float* d_out = env->upload(in.d_out);
  float* d_x0 = env->upload(in.d_x0);
  float* x_final = env->upload(in.x_final);
  float* block_grads = env->upload(in.block_grads);
  float* embed_grads = env->upload(in.embed_grads);
  float* final_grads = env->upload(in.final_grads);
  float* x0 = env->zeros<float>(act);
  float* x_out = env->zeros<float>(act);
  // Not recomputing, d_in aliases d_out (allowed): both buffer arrangements are run.
  float* d_in = k.recompute ? env->zeros<float>(act) : d_out;
  float* d_x_final = env->zeros<float>(act);

  expect_ok(def->embedding_forward(b, s, embed, x0));
  expect_ok(def->block_forward(b, s, block, x_in, x_out, ws, adapters_or_null));
  expect_ok(def->block_backward(b, s, block, x_in, d_out, d_in, k.frozen ? nullptr : block_grads, ws, k.recompute,
                                adapters_or_null));
  expect_ok(def->embedding_backward(b, s, d_x0, embed_grads));
  if (k.eval) {
    expect_ok(def->head_loss(b, s, final_unit, embed, x_final, ws));
  } else {
    expect_ok(def->head_forward_backward(b, s, final_unit, embed, x_final, d_x_final,
                                         k.frozen ? nullptr : final_grads, k.frozen ? nullptr : embed_grads, ws));
  }
  auto scalars = b.end_step();
  EXPECT_TRUE(scalars.ok());
  if (scalars.ok()) out.loss = static_cast<float>(scalars->loss);
  out.tensors = {{"x0", env->download(x0, act)},
                 {"x_out", env->download(x_out, act)},
                 {"d_in", env->download(d_in, act)},
                 {"block_grads", env->download(block_grads, in.block_grads.size())},
                 {"embed_grads", env->download(embed_grads, in.embed_grads.size())},
                 {"d_x_final", env->download(d_x_final, act)},
                 {"final_grads", env->download(final_grads, in.final_grads.size())}};
  for (size_t t = 0; t < d_a.size(); ++t) {
    out.tensors.push_back({"lora_d_a." + std::to_string(t), env->download(d_a[t], in.lora_d_a[t].size())});
    out.tensors.push_back({"lora_d_b." + std::to_string(t), env->download(d_b[t], in.lora_d_b[t].size())});
  }
  return out;
}

void expect_same_bits(const Outputs& kernels_out, const Outputs& definition_out) {
  ASSERT_EQ(kernels_out.tensors.size(), definition_out.tensors.size());
  for (size_t i = 0; i < kernels_out.tensors.size(); ++i) {
    const auto& [name, expected] = kernels_out.tensors[i];
    const auto& actual = definition_out.tensors[i].second;
    ASSERT_EQ(expected.size(), actual.size()) << name;
    if (std::memcmp(expected.data(), actual.data(), expected.size() * sizeof(float)) == 0) continue;
    size_t first = 0;
    while (std::memcmp(&expected[first], &actual[first], sizeof(float)) == 0) ++first;
    ADD_FAILURE() << name << " differs first at element " << first << ": kernels " << expected[first]
                  << ", definition " << actual[first];
  }
  EXPECT_EQ(std::memcmp(&kernels_out.loss, &definition_out.loss, sizeof(float)), 0)
      << "loss: kernels " << kernels_out.loss << ", definition " << definition_out.loss;
}

class ComposeLlama : public ::testing::TestWithParam<std::tuple<Case, device::Kind>> {};

TEST_P(ComposeLlama, DefinitionGivesTheKernelsBits) {
  const auto& [k, kind] = GetParam();
  const ModelConfig model = model_config(k);
  const lk::Config c = kernel_config(model);
  const Inputs in = make_inputs(k, c);
  const Outputs expected = run_kernels(k, c, in);
  // The step did something: a loss, and (training) gradients reaching the block's input.
  EXPECT_GT(expected.loss, 0.0f);
  const Outputs actual = run_definition(k, model, c, in, kind);
  expect_same_bits(expected, actual);
}

std::vector<std::tuple<Case, device::Kind>> params() {
  std::vector<std::tuple<Case, device::Kind>> all;
  for (const Case& k : cases())
    for (const device::Kind kind : {device::Kind::cpu, device::Kind::emulated}) all.emplace_back(k, kind);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, ComposeLlama, ::testing::ValuesIn(params()), [](const auto& info) {
  return std::get<0>(info.param).name + "_" + device::kind_name(std::get<1>(info.param));
});

// The options are live: each of Gemma's three changes the bits the composition gives (a wiring
// that dropped one would pass every case above, whose options are Llama's defaults).
TEST(ComposeLlamaOptions, EachOptionChangesTheResult) {
  const Case k{.name = "options", .gqa = true};
  const ModelConfig model = model_config(k);
  const lk::Config c = kernel_config(model);
  const Inputs in = make_inputs(k, c);
  const kernels::BatchShape s = in.shape;
  const auto act = static_cast<size_t>(s.rows() * c.n_embd);
  auto run = [&](const models::decoder::DecoderOptions& options) {
    auto env = BackendEnv::create(device::Kind::cpu);
    EXPECT_NE(env, nullptr);
    kernels::ComputeBackend& b = env->backend();
    EXPECT_TRUE(b.begin_step({in.tokens.data(), in.targets.data(), s.rows()}).ok());
    const kernels::Workspace ws = env->workspace_for(models::decoder::workspace_size_bytes(b, c, s));
    float* embed = env->upload(in.embed);
    float* x0 = env->zeros<float>(act);
    float* x_out = env->zeros<float>(act);
    const lk::BlockWeights w = lk::bind_block(c, static_cast<const float*>(env->upload(in.block)));
    EXPECT_TRUE(models::decoder::embedding_forward(b, c, options, s, embed, x0).ok());
    EXPECT_TRUE(models::decoder::block_forward(b, c, options, s, w, env->upload(in.x_in), x_out, ws).ok());
    std::vector<float> both = env->download(x0, act);
    const std::vector<float> block_out = env->download(x_out, act);
    both.insert(both.end(), block_out.begin(), block_out.end());
    return both;
  };
  const std::vector<float> llama = run({});
  models::decoder::DecoderOptions offset;
  offset.norm_weight_offset = 1.0f;
  models::decoder::DecoderOptions gelu;
  gelu.gate = kernels::ops::GateKind::gelu_tanh;
  models::decoder::DecoderOptions scaled;
  scaled.embedding_scale = 4.0f;
  for (const auto& [name, options] : {std::pair{"norm_weight_offset", offset}, std::pair{"gate", gelu},
                                      std::pair{"embedding_scale", scaled}}) {
    const std::vector<float> changed = run(options);
    EXPECT_NE(std::memcmp(llama.data(), changed.data(), llama.size() * sizeof(float)), 0) << name;
  }
}

// --- decoding with a KV cache -------------------------------------------------------------
// The definition's decode ops (decoder.h's decode composition) against llama_reference.cpp's
// embedding_decode / block_decode / head_decode called directly: a prompt of kPromptRows rows at
// past 0, then kSingleSteps single tokens at past kPromptRows, kPromptRows + 1, …, each through
// the embedding, the block and the head; every step's x0, block output and logits and the whole
// KV cache afterwards (its untouched rows too: it starts random) memcmp-equal. fp32 weights with
// a head of a piece of the vocabulary (projection_rows < vocab), and bf16 weights with the whole
// head; on the cpu and the emulated device.
constexpr int64_t kPromptRows = 7;
constexpr int64_t kSingleSteps = 4;
constexpr int64_t kMaxPositions = 16;
constexpr int64_t kProjectionRows = 40;  // the fp32 head's vocabulary piece (vocab 64)

struct DecodeCase {
  std::string name;
  Case shape;  // gqa, bias, rope_scaling, tied
  bool bf16 = false;
};

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> all;
  for (const bool bf16 : {false, true}) {
    const std::string suffix = bf16 ? "_bf16" : "_fp32";
    all.push_back({"mha" + suffix, {.name = "mha"}, bf16});
    all.push_back({"gqa" + suffix, {.name = "gqa", .gqa = true}, bf16});
    all.push_back({"gqa_bias" + suffix, {.name = "gqa_bias", .gqa = true, .bias = true}, bf16});
    all.push_back({"rope_llama3" + suffix, {.name = "rope_llama3", .gqa = true, .rope_scaling = true}, bf16});
  }
  return all;
}

// bf16 bit patterns of fp32 values (truncated: any bf16 values serve, both paths read the same).
std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &values[i], sizeof bits);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

struct DecodeInputs {
  std::vector<int32_t> tokens;  // kPromptRows + kSingleSteps
  std::vector<float> block, embed, norm, projection, keys, values;
  std::vector<uint16_t> block_bf16, norm_bf16, projection_bf16;
};

DecodeInputs make_decode_inputs(const lk::Config& c) {
  DecodeInputs in;
  in.tokens = random_tokens(static_cast<size_t>(kPromptRows + kSingleSteps), static_cast<int32_t>(c.vocab_size), 301);
  in.block = random_floats(static_cast<size_t>(lk::block_param_count(c)), 0.1f, 302);
  size_t offset = 0;
  for (const auto& spec : lk::block_param_specs(c)) {
    if (spec.name_suffix.ends_with("layernorm.weight"))
      for (int64_t j = 0; j < spec.numel(); ++j) in.block[offset + static_cast<size_t>(j)] += 1.0f;
    offset += static_cast<size_t>(spec.numel());
  }
  in.embed = random_floats(static_cast<size_t>(c.vocab_size * c.n_embd), 0.5f, 303);
  in.norm = random_floats(static_cast<size_t>(c.n_embd), 0.1f, 304, 1.0f);
  in.projection = random_floats(static_cast<size_t>(c.vocab_size * c.n_embd), 0.3f, 305);
  const auto cache_n = static_cast<size_t>(kMaxPositions * c.kv_width());
  in.keys = random_floats(cache_n, 1.0f, 306);
  in.values = random_floats(cache_n, 1.0f, 307);
  in.block_bf16 = to_bf16(in.block);
  in.norm_bf16 = to_bf16(in.norm);
  in.projection_bf16 = to_bf16(in.projection);
  return in;
}

// The rows of each call: the prompt, then single tokens.
std::vector<std::pair<int64_t, int64_t>> decode_calls() {
  std::vector<std::pair<int64_t, int64_t>> calls{{0, kPromptRows}};
  for (int64_t s = 0; s < kSingleSteps; ++s) calls.emplace_back(kPromptRows + s, 1);
  return calls;
}

Outputs decode_kernels(const DecodeCase& k, const lk::Config& c, DecodeInputs in) {
  Outputs out;
  const size_t ws_bytes = lk::decode_workspace_size_bytes(c, kPromptRows, kMaxPositions);
  AlignedFloats ws_storage(ws_bytes);
  const kernels::Workspace ws{ws_storage.data, ws_bytes};
  const size_t scratch_bytes = lk::decode_bf16_scratch_bytes(c);
  AlignedFloats scratch_storage(scratch_bytes);
  const kernels::Workspace scratch{scratch_storage.data, scratch_bytes};
  const lk::BlockWeights w = lk::bind_block(c, static_cast<const float*>(in.block.data()));
  const lk::BlockWeightsBf16 w16 = lk::bind_block(c, static_cast<const uint16_t*>(in.block_bf16.data()));
  const kernels::KvCacheBlock cache{in.keys.data(), in.values.data(), kMaxPositions};
  lk::Config piece = c;
  piece.vocab_size = kProjectionRows;
  for (const auto& [past, rows] : decode_calls()) {
    const auto act = static_cast<size_t>(rows * c.n_embd);
    std::vector<float> x0(act), x1(act), logits(static_cast<size_t>(k.bf16 ? c.vocab_size : kProjectionRows));
    lk::embedding_decode(c, rows, in.tokens.data() + past, in.embed.data(), x0.data());
    if (k.bf16) {
      lk::block_decode(c, past, rows, w16, x0.data(), x1.data(), cache, ws, scratch);
      lk::head_decode(c, rows, lk::HeadWeightsBf16{in.norm_bf16.data(), in.projection_bf16.data()}, x1.data(),
                      logits.data(), ws, scratch);
    } else {
      lk::block_decode(c, past, rows, w, x0.data(), x1.data(), cache, ws);
      lk::head_decode(piece, rows, lk::HeadWeights{in.norm.data(), in.projection.data()}, x1.data(), logits.data(),
                      ws);
    }
    const std::string at = "@" + std::to_string(past);
    out.tensors.push_back({"x0" + at, x0});
    out.tensors.push_back({"x_out" + at, x1});
    out.tensors.push_back({"logits" + at, logits});
  }
  out.tensors.push_back({"keys", in.keys});
  out.tensors.push_back({"values", in.values});
  return out;
}

Outputs decode_definition(const DecodeCase& k, const ModelConfig& model, const lk::Config& c, const DecodeInputs& in,
                          device::Kind kind) {
  Outputs out;
  auto env = BackendEnv::create(kind);
  if (env == nullptr) return out;
  const auto def = models::make_model_definition(model);
  kernels::ComputeBackend& b = env->backend();
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };
  const kernels::Workspace ws = env->workspace_for(def->decode_workspace_size_bytes(kind, kPromptRows, kMaxPositions));
  const kernels::Workspace scratch = env->workspace_for(def->decode_bf16_scratch_bytes(kind));
  float* embed = env->upload(in.embed);
  float* block = env->upload(in.block);
  float* norm = env->upload(in.norm);
  float* projection = env->upload(in.projection);
  uint16_t* block16 = env->upload(in.block_bf16);
  uint16_t* norm16 = env->upload(in.norm_bf16);
  uint16_t* projection16 = env->upload(in.projection_bf16);
  float* keys = env->upload(in.keys);
  float* values = env->upload(in.values);
  const kernels::KvCacheBlock cache{keys, values, kMaxPositions};
  const auto logits_n = static_cast<size_t>(k.bf16 ? c.vocab_size : kProjectionRows);
  for (const auto& [past, rows] : decode_calls()) {
    const auto act = static_cast<size_t>(rows * c.n_embd);
    float* x0 = env->zeros<float>(act);
    float* x1 = env->zeros<float>(act);
    float* logits = env->zeros<float>(logits_n);
    // The tokens are host memory (generation's own, not a step's).
    expect_ok(def->embedding_decode(b, past, rows, in.tokens.data() + past, embed, c.vocab_size, nullptr, x0));
    if (k.bf16) {
      expect_ok(def->block_decode_bf16(b, past, rows, block16, x0, x1, cache, ws, scratch));
      expect_ok(def->head_logits_bf16(b, rows, norm16, projection16, x1, logits, ws, scratch));
    } else {
      expect_ok(def->block_decode(b, past, rows, block, x0, x1, cache, ws));
      expect_ok(def->head_logits(b, rows, norm, projection, kProjectionRows, x1, logits, ws));
    }
    const std::string at = "@" + std::to_string(past);
    out.tensors.push_back({"x0" + at, env->download(x0, act)});
    out.tensors.push_back({"x_out" + at, env->download(x1, act)});
    out.tensors.push_back({"logits" + at, env->download(logits, logits_n)});
  }
  out.tensors.push_back({"keys", env->download(keys, in.keys.size())});
  out.tensors.push_back({"values", env->download(values, in.values.size())});
  return out;
}

class ComposeLlamaDecode : public ::testing::TestWithParam<std::tuple<DecodeCase, device::Kind>> {};

TEST_P(ComposeLlamaDecode, DefinitionGivesTheKernelsBits) {
  const auto& [k, kind] = GetParam();
  const ModelConfig model = model_config(k.shape);
  const lk::Config c = kernel_config(model);
  const DecodeInputs in = make_decode_inputs(c);
  const Outputs expected = decode_kernels(k, c, in);
  // The decode wrote the cache: the kernels' keys differ from the random ones they started as.
  EXPECT_NE(std::memcmp(expected.tensors[expected.tensors.size() - 2].second.data(), in.keys.data(),
                        in.keys.size() * sizeof(float)),
            0);
  const Outputs actual = decode_definition(k, model, c, in, kind);
  expect_same_bits(expected, actual);
}

std::vector<std::tuple<DecodeCase, device::Kind>> decode_params() {
  std::vector<std::tuple<DecodeCase, device::Kind>> all;
  for (const DecodeCase& k : decode_cases())
    for (const device::Kind kind : {device::Kind::cpu, device::Kind::emulated}) all.emplace_back(k, kind);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, ComposeLlamaDecode, ::testing::ValuesIn(decode_params()), [](const auto& info) {
  return std::get<0>(info.param).name + "_" + device::kind_name(std::get<1>(info.param));
});

}  // namespace
}  // namespace strata::testing
