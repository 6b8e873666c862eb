// tests/backend/test_compose_gpt2_decode.cpp — proves that GPT-2's decoding composed of the
// backend's operations (models/gpt2.cpp: embedding_decode, block_decode, head_logits and the bf16
// block and head) gives exactly the bytes of the GPT-2 decode kernels called directly
// (tests/reference/gpt2_reference.h: embedding_decode, block_decode, head_decode, fp32 and bf16). Generation's
// sequence — a 7-token prompt (past 0), then single tokens at past 7, 8 and 9 — runs through two
// blocks with a cache each, on both paths from the same inputs; every pass's block outputs and
// logits, and both caches whole (the rows never written included), are compared with memcmp.
// On the cpu device and on the emulated one (device memory reached only by copies, each op
// waiting on the stream), for fp32 weights and for bf16 weights multiplied as stored.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/reference/gpt2_reference.h"
#include "models/model.h"
#include "tests/backend/backend_harness.h"
#include "tests/backend/compose_support.h"

namespace strata::testing {
namespace {

// The reference kernels, with the shape's names (gpt2_reference.h).
namespace gref = reference::gpt2;

// Heads of 8, a vocabulary and widths no tile divides evenly, a window (max_positions) shorter
// than n_ctx so the cache's stride and the learned positions' range are not the same number.
ModelConfig model_config() {
  ModelConfig model;
  model.arch = "gpt2";
  model.n_layer = 2;
  model.n_head = 4;
  model.n_embd = 32;
  model.vocab_size = 97;
  model.seq_len = 16;
  return model;
}
constexpr int64_t kWindow = 12;
constexpr int64_t kPrompt = 7;
// (past, rows) of each pass: the prompt, then one sampled token at a time.
const std::vector<std::pair<int64_t, int64_t>> kPasses = {{0, kPrompt}, {7, 1}, {8, 1}, {9, 1}};


// The inputs both paths read (fixed seeds): tokens, wte and wpe, each block's unit (LayerNorm
// gains near 1), ln_f; and the bf16 bit patterns of the weights (their upper halves).
struct Inputs {
  ModelConfig model = model_config();
  gref::Config kc = models::gpt2_shape_config(model);
  int64_t c = kc.n_embd;
  std::vector<int32_t> tokens = random_tokens(static_cast<size_t>(kPrompt + 3), static_cast<int32_t>(kc.vocab_size), 61);
  std::vector<float> wte = random_floats(static_cast<size_t>(kc.vocab_size * c), 0.5f, 62);
  std::vector<float> wpe = random_floats(static_cast<size_t>(kc.n_ctx * c), 0.1f, 63);
  std::vector<std::vector<float>> blocks = {block_weights(kc, 64), block_weights(kc, 65)};
  std::vector<float> ln_f = ln_f_values();

  std::vector<float> ln_f_values() const {
    std::vector<float> v = random_floats(static_cast<size_t>(c), 0.1f, 66, 1.0f);
    const std::vector<float> bias = random_floats(static_cast<size_t>(c), 0.1f, 67);
    v.insert(v.end(), bias.begin(), bias.end());
    return v;
  }
  std::vector<float> embed() const {  // the embedding unit: wte, then wpe
    std::vector<float> e = wte;
    e.insert(e.end(), wpe.begin(), wpe.end());
    return e;
  }
};

// What a decode run leaves: per pass the last block's output and the logits, then each
// block's whole cache (keys, values).
struct DecodeOutputs {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
};

void expect_same(const DecodeOutputs& composed, const DecodeOutputs& direct) {
  ASSERT_EQ(composed.tensors.size(), direct.tensors.size());
  for (size_t i = 0; i < direct.tensors.size(); ++i) {
    ASSERT_EQ(composed.tensors[i].first, direct.tensors[i].first);
    expect_same_bits(direct.tensors[i].first, composed.tensors[i].second, direct.tensors[i].second);
  }
}

// The GPT-2 decode kernels called directly, on host vectors.
DecodeOutputs run_kernels(const Inputs& in, bool bf16) {
  const gref::Config& kc = in.kc;
  const int64_t c = in.c;
  const size_t cache_n = static_cast<size_t>(kWindow * c);
  std::vector<std::vector<float>> keys(in.blocks.size(), std::vector<float>(cache_n)),
      values(in.blocks.size(), std::vector<float>(cache_n));
  std::vector<std::vector<uint16_t>> block_bits;
  for (const auto& block : in.blocks) block_bits.push_back(upper_halves(block));
  const std::vector<uint16_t> ln_f_bits = upper_halves(in.ln_f), wte_bits = upper_halves(in.wte);
  Aligned ws(gref::decode_workspace_size_bytes(kc, kPrompt, kWindow)), scratch(gref::decode_bf16_scratch_bytes(kc));
  std::vector<float> x_a(static_cast<size_t>(kPrompt * c)), x_b(x_a.size()), logits(static_cast<size_t>(kc.vocab_size));
  DecodeOutputs out;
  for (const auto& [past, rows] : kPasses) {
    gref::embedding_decode(kc, past, rows, in.tokens.data() + past, in.wte.data(), in.wpe.data(), x_a.data());
    for (size_t l = 0; l < in.blocks.size(); ++l) {
      const gref::KvCacheBlock cache{keys[l].data(), values[l].data(), kWindow};
      if (bf16)
        gref::block_decode(kc, past, rows, gref::bind_block(kc, static_cast<const uint16_t*>(block_bits[l].data())),
                         x_a.data(), x_b.data(), cache, ws.workspace(), scratch.workspace());
      else
        gref::block_decode(kc, past, rows, gref::bind_block(kc, static_cast<const float*>(in.blocks[l].data())),
                         x_a.data(), x_b.data(), cache, ws.workspace());
      std::swap(x_a, x_b);
    }
    if (bf16)
      gref::head_decode(kc, rows, gref::HeadWeightsBf16{ln_f_bits.data(), ln_f_bits.data() + c, wte_bits.data()},
                      x_a.data(), logits.data(), ws.workspace(), scratch.workspace());
    else
      gref::head_decode(kc, rows, gref::HeadWeights{in.ln_f.data(), in.ln_f.data() + c, in.wte.data()}, x_a.data(),
                      logits.data(), ws.workspace());
    const std::string at = "@past " + std::to_string(past);
    out.tensors.push_back({"x_final " + at, std::vector<float>(x_a.begin(), x_a.begin() + rows * c)});
    out.tensors.push_back({"logits " + at, logits});
  }
  for (size_t l = 0; l < in.blocks.size(); ++l) {
    out.tensors.push_back({"keys of block " + std::to_string(l), keys[l]});
    out.tensors.push_back({"values of block " + std::to_string(l), values[l]});
  }
  return out;
}

// The definition's decode ops on `env`'s backend, the weights in its device's memory, sized as
// generation sizes them (the definition's decode_workspace_size_bytes and
// decode_bf16_scratch_bytes for the device kind).
DecodeOutputs run_definition(BackendEnv& env, device::Kind kind, const models::ModelDefinition& def,
                             const Inputs& in, bool bf16) {
  kernels::ComputeBackend& b = env.backend();
  const int64_t c = in.c;
  const int64_t vocab = in.kc.vocab_size;
  const size_t cache_n = static_cast<size_t>(kWindow * c);
  const float* embed = env.upload(in.embed());
  const float* ln_f = env.upload(in.ln_f);
  const uint16_t* ln_f_bits = env.upload(upper_halves(in.ln_f));
  const uint16_t* wte_bits = env.upload(upper_halves(in.wte));
  std::vector<const float*> blocks;
  std::vector<const uint16_t*> block_bits;
  std::vector<gref::KvCacheBlock> caches;
  for (const auto& block : in.blocks) {
    blocks.push_back(env.upload(block));
    block_bits.push_back(env.upload(upper_halves(block)));
    caches.push_back(gref::KvCacheBlock{env.zeros<float>(cache_n), env.zeros<float>(cache_n), kWindow});
  }
  float* x_a = env.zeros<float>(static_cast<size_t>(kPrompt * c));
  float* x_b = env.zeros<float>(static_cast<size_t>(kPrompt * c));
  float* logits = env.zeros<float>(static_cast<size_t>(vocab));
  const gref::Workspace ws = env.workspace_for(def.decode_workspace_size_bytes(kind, kPrompt, kWindow));
  const gref::Workspace scratch = env.workspace_for(def.decode_bf16_scratch_bytes(kind));
  DecodeOutputs out;
  for (const auto& [past, rows] : kPasses) {
    expect_ok(def.embedding_decode(b, past, rows, in.tokens.data() + past, embed, vocab, embed + vocab * c, x_a));
    for (size_t l = 0; l < blocks.size(); ++l) {
      if (bf16)
        expect_ok(def.block_decode_bf16(b, past, rows, block_bits[l], x_a, x_b, caches[l], ws, scratch));
      else
        expect_ok(def.block_decode(b, past, rows, blocks[l], x_a, x_b, caches[l], ws));
      std::swap(x_a, x_b);
    }
    if (bf16)
      expect_ok(def.head_logits_bf16(b, rows, ln_f_bits, wte_bits, x_a, logits, ws, scratch));
    else
      expect_ok(def.head_logits(b, rows, ln_f, embed, vocab, x_a, logits, ws));
    const std::string at = "@past " + std::to_string(past);
    out.tensors.push_back({"x_final " + at, env.download(x_a, static_cast<size_t>(rows * c))});
    out.tensors.push_back({"logits " + at, env.download(logits, static_cast<size_t>(vocab))});
  }
  for (size_t l = 0; l < caches.size(); ++l) {
    out.tensors.push_back({"keys of block " + std::to_string(l), env.download(caches[l].keys, cache_n)});
    out.tensors.push_back({"values of block " + std::to_string(l), env.download(caches[l].values, cache_n)});
  }
  return out;
}

class ComposeGpt2Decode : public ::testing::TestWithParam<device::Kind> {
 protected:
  void SetUp() override {
    env_ = BackendEnv::create(GetParam());
    ASSERT_NE(env_, nullptr);
    definition_ = models::make_model_definition(in_.model);
    ASSERT_STREQ(definition_->arch(), "gpt2");
  }
  Inputs in_;
  std::unique_ptr<BackendEnv> env_;
  std::unique_ptr<const models::ModelDefinition> definition_;
};

TEST_P(ComposeGpt2Decode, Fp32) {
  const DecodeOutputs direct = run_kernels(in_, /*bf16=*/false);
  expect_same(run_definition(*env_, GetParam(), *definition_, in_, /*bf16=*/false), direct);
}

TEST_P(ComposeGpt2Decode, Bf16) {
  const DecodeOutputs direct = run_kernels(in_, /*bf16=*/true);
  expect_same(run_definition(*env_, GetParam(), *definition_, in_, /*bf16=*/true), direct);
}

// Generation's bf16 embedding: the new tokens' rows widened into a piece (ids 0…rows−1) and
// their positions' rows after it, so the op is told past 0 over the piece (model.h). It must
// give the bits of the whole tables read at the tokens and at past….
TEST_P(ComposeGpt2Decode, EmbeddingOverPieces) {
  const int64_t c = in_.c;
  const int64_t past = 5, rows = 3;
  std::vector<float> token_piece, position_piece;
  std::vector<int32_t> piece_ids;
  for (int64_t r = 0; r < rows; ++r) {
    const auto token = static_cast<size_t>(in_.tokens[static_cast<size_t>(past + r)]);
    token_piece.insert(token_piece.end(), in_.wte.begin() + static_cast<std::ptrdiff_t>(token * c),
                       in_.wte.begin() + static_cast<std::ptrdiff_t>((token + 1) * c));
    piece_ids.push_back(static_cast<int32_t>(r));
  }
  position_piece.assign(in_.wpe.begin() + past * c, in_.wpe.begin() + (past + rows) * c);
  std::vector<float> direct(static_cast<size_t>(rows * c));
  gref::embedding_decode(in_.kc, past, rows, in_.tokens.data() + past, in_.wte.data(), in_.wpe.data(), direct.data());

  kernels::ComputeBackend& b = env_->backend();
  const float* tokens_dev = env_->upload(token_piece);
  const float* positions_dev = env_->upload(position_piece);
  float* x0 = env_->zeros<float>(direct.size());
  expect_ok(definition_->embedding_decode(b, 0, rows, piece_ids.data(), tokens_dev, rows, positions_dev, x0));
  expect_same_bits("x0 over pieces", env_->download(x0, direct.size()), direct);
}

std::string kind_name(const ::testing::TestParamInfo<device::Kind>& info) { return device::kind_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Devices, ComposeGpt2Decode, ::testing::Values(device::Kind::cpu, device::Kind::emulated),
                         kind_name);

}  // namespace
}  // namespace strata::testing
