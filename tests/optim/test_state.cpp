// optim/state.h: proves the optimizer seam's layouts. adamw keeps its [master | m | v] bytes
// (stores written before the seam stay readable); adamw8bit's chunk size is exact for every mix
// of 8-bit and fp32 pieces; cuts inside 8-bit tensors fall on the tensor's block boundaries; and
// a unit updated in chunks (cut where snap_cut allows, several tensors per chunk) gives exactly
// the bits of each tensor updated alone by the kernels (adamw8bit_step with the tensor's own
// blocks, adamw_step for fp32-moment tensors) — the bitsandbytes per-tensor semantics, with
// the packing and the chunking taken out of the picture. Metadata round-trips and refuses
// values it cannot read. The state alone (what the C API keeps, the master being the caller's)
// is the chunk's bytes after its master, pointer for pointer; its moments read back dequantised
// and write back requantised.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "optim/state.h"

namespace strata::optim {
namespace {

using kernels::AdamWChunk;

constexpr uint64_t round4(uint64_t bytes) { return (bytes + 3) / 4 * 4; }

uint64_t eight_bit_bytes(uint64_t count, uint64_t block) {
  return 2 * 4 * ((count + block - 1) / block) + round4(2 * count);
}

TEST(StateLayout, AdamwKeepsItsLayout) {
  const StateLayout state;
  const TensorSpan tensors[] = {{0, 100, true}, {100, 7, false}};
  EXPECT_EQ(state.chunk_bytes(tensors, 0, 107), 12u * 107);
  EXPECT_EQ(state.store_shape(tensors, 0, 107), (std::vector<int64_t>{3, 107}));
  EXPECT_EQ(state.snap_cut(tensors, 33), 33u);
  EXPECT_EQ(state.bytes_per_element(), 12.0);
  std::vector<std::byte> chunk(state.chunk_bytes(tensors, 50, 57));
  std::vector<float> grads(57, 0.0f);
  std::vector<AdamWChunk> pieces;
  state.update_pieces({}, 0, tensors, 50, 57, chunk.data(), grads.data(), nullptr, pieces);
  ASSERT_EQ(pieces.size(), 2u);
  float* master = state.master(chunk.data());
  EXPECT_EQ(pieces[0].params, master);
  EXPECT_EQ(pieces[0].exp_avg, master + 57);
  EXPECT_EQ(pieces[0].exp_avg_sq, master + 114);
  EXPECT_EQ(pieces[1].params, master + 50);
  EXPECT_EQ(pieces[1].count, 7u);
  EXPECT_EQ(pieces[1].block_elements, 0u);
}

TEST(StateLayout, EightBitChunkBytesAreExact) {
  EightBitRules rules;
  rules.block_elements = 256;
  rules.min_8bit_elements = 4096;
  const StateLayout state(Kind::adamw8bit, rules);
  // 8-bit (10000), fp32 (small: 100), 8-bit (5001, a short tail block).
  const TensorSpan tensors[] = {{0, 10000, true}, {10000, 100, false}, {10100, 5001, true}};
  const uint64_t n = 15101;
  EXPECT_EQ(state.chunk_bytes(tensors, 0, n), 4 * n + eight_bit_bytes(10000, 256) + 8 * 100 + eight_bit_bytes(5001, 256));
  // A chunk from inside the first tensor (a block boundary) to inside the third.
  EXPECT_EQ(state.chunk_bytes(tensors, 9984, 10100 + 1000 - 9984),
            4 * (10100 + 1000 - 9984) + eight_bit_bytes(16, 256) + 8 * 100 + eight_bit_bytes(1000, 256));
  EXPECT_EQ(state.chunk_bytes(tensors, 0, n) % 4, 0u);
  EXPECT_EQ(state.store_shape(tensors, 0, n), (std::vector<int64_t>{static_cast<int64_t>(state.chunk_bytes(tensors, 0, n) / 4)}));
  EXPECT_DOUBLE_EQ(state.bytes_per_element(), 4 + 2 + 8.0 / 256);
}

TEST(StateLayout, CutsFallOnTheTensorsBlocks) {
  EightBitRules rules;
  rules.block_elements = 64;
  rules.min_8bit_elements = 1000;
  rules.embedding_fp32 = true;
  const StateLayout state(Kind::adamw8bit, rules);
  const TensorSpan tensors[] = {{0, 3000, true, true}, {3000, 500, false}, {3500, 2000, true}};
  EXPECT_FALSE(state.eight_bit(tensors[0]));  // the embedding, kept fp32
  EXPECT_FALSE(state.eight_bit(tensors[1]));  // under min_8bit_size
  EXPECT_TRUE(state.eight_bit(tensors[2]));
  EXPECT_EQ(state.snap_cut(tensors, 1234), 1234u);        // fp32 moments: anywhere
  EXPECT_EQ(state.snap_cut(tensors, 3100), 3100u);
  EXPECT_EQ(state.snap_cut(tensors, 3500 + 130), 3500u + 128);  // the tensor's own blocks
  EXPECT_EQ(state.snap_cut(tensors, 3500 + 63), 3500u);
  EXPECT_EQ(state.snap_cut(tensors, 3500), 3500u);
  rules.embedding_fp32 = false;
  const StateLayout eight(Kind::adamw8bit, rules);
  EXPECT_TRUE(eight.eight_bit(tensors[0]));
  EXPECT_EQ(eight.snap_cut(tensors, 1234), 1216u);
}

// A unit of several tensors, updated in chunks and as each tensor alone, must agree bit for bit.
TEST(StateLayout, ChunkedUpdateEqualsPerTensorKernels) {
  for (const bool embedding_fp32 : {false, true}) {
    EightBitRules rules;
    rules.block_elements = 128;
    rules.min_8bit_elements = 2000;
    rules.embedding_fp32 = embedding_fp32;
    const StateLayout state(Kind::adamw8bit, rules);
    const std::vector<TensorSpan> tensors = {
        {0, 4100, true, true}, {4100, 300, false}, {4400, 2500, true}, {6900, 1999, true}, {8899, 2003, false}};
    const uint64_t n = 10902;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> master(n);
    for (float& value : master) value = 0.1f * normal(rng);
    const kernels::AdamWConfig hyper{1e-2, 0.9, 0.95, 1e-8, 0.1};

    // Chunked: near-equal cuts of ~1500 elements, snapped.
    std::vector<std::pair<uint64_t, uint64_t>> chunks;
    uint64_t begin = 0;
    for (uint64_t c = 1; c <= 8; ++c) {
      const uint64_t end = c == 8 ? n : state.snap_cut(tensors, n * c / 8);
      if (end > begin) chunks.emplace_back(begin, end - begin);
      begin = std::max(begin, end);
    }
    std::vector<std::vector<std::byte>> stored;
    for (auto [b, count] : chunks) {
      stored.emplace_back(state.chunk_bytes(tensors, b, count));
      state.initialize(tensors, b, count, master.data() + b, stored.back().data());
    }
    // Per tensor: its own state, updated by the kernels directly.
    struct Alone {
      std::vector<float> params, m, v, absmax_m, absmax_v;
      std::vector<uint8_t> codes_m, codes_v;
    };
    std::vector<Alone> alone(tensors.size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      Alone& a = alone[t];
      const uint64_t count = tensors[t].element_count;
      a.params.assign(master.begin() + static_cast<int64_t>(tensors[t].offset_elements),
                      master.begin() + static_cast<int64_t>(tensors[t].offset_elements + count));
      if (state.eight_bit(tensors[t])) {
        const size_t blocks = kernels::adamw8bit_block_count(count, rules.block_elements);
        a.codes_m.resize(count), a.codes_v.resize(count), a.absmax_m.resize(blocks), a.absmax_v.resize(blocks);
        kernels::adamw8bit_init({a.params, a.codes_m, a.codes_v, a.absmax_m, a.absmax_v, rules.block_elements});
      } else {
        a.m.assign(count, 0.0f), a.v.assign(count, 0.0f);
      }
    }
    std::vector<float> grads(n);
    std::vector<uint16_t> copy(n), copy_alone(n);
    std::vector<AdamWChunk> pieces;
    for (uint64_t step = 0; step < 4; ++step) {
      for (float& g : grads) g = 0.01f * normal(rng);
      for (size_t c = 0; c < chunks.size(); ++c) {
        auto [b, count] = chunks[c];
        state.update_pieces(hyper, step, tensors, b, count, stored[c].data(), grads.data() + b, copy.data() + b, pieces);
        for (const AdamWChunk& p : pieces) {
          kernels::ComputeCopy out{p.copy_dtype, {p.copy, p.count}};
          if (p.block_elements > 0) {
            const size_t blocks = kernels::adamw8bit_block_count(p.count, p.block_elements);
            kernels::adamw8bit_step(p.scalars,
                                    {{p.params, p.count}, {p.exp_avg_codes, p.count}, {p.exp_avg_sq_codes, p.count},
                                     {p.exp_avg_absmax, blocks}, {p.exp_avg_sq_absmax, blocks}, p.block_elements},
                                    {p.grads, p.count}, out);
          } else {
            kernels::adamw_step(p.scalars, {p.params, p.count}, {p.grads, p.count}, {p.exp_avg, p.count},
                                {p.exp_avg_sq, p.count}, out);
          }
        }
      }
      kernels::AdamWConfig config = hyper;
      const auto decayed = kernels::adamw_step_scalars(config, static_cast<int64_t>(step + 1));
      config.weight_decay = 0.0;
      const auto undecayed = kernels::adamw_step_scalars(config, static_cast<int64_t>(step + 1));
      for (size_t t = 0; t < tensors.size(); ++t) {
        Alone& a = alone[t];
        const uint64_t off = tensors[t].offset_elements, count = tensors[t].element_count;
        const auto& scalars = tensors[t].weight_decay ? decayed : undecayed;
        kernels::ComputeCopy out{DType::bf16, {copy_alone.data() + off, count}};
        if (state.eight_bit(tensors[t]))
          kernels::adamw8bit_step(scalars, {a.params, a.codes_m, a.codes_v, a.absmax_m, a.absmax_v, rules.block_elements},
                                  {grads.data() + off, count}, out);
        else
          kernels::adamw_step(scalars, a.params, {grads.data() + off, count}, a.m, a.v, out);
      }
    }
    // Masters and copies: bit for bit.
    for (size_t c = 0; c < chunks.size(); ++c) {
      auto [b, count] = chunks[c];
      const float* chunk_master = state.master(stored[c].data());
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t e = b + i;
        size_t t = 0;
        while (e >= tensors[t].offset_elements + tensors[t].element_count) ++t;
        const float expected = alone[t].params[e - tensors[t].offset_elements];
        ASSERT_EQ(std::memcmp(&chunk_master[i], &expected, 4), 0)
            << "element " << e << " (tensor " << t << ", chunk " << c << ", embedding_fp32 " << embedding_fp32 << ")";
      }
    }
    EXPECT_EQ(copy, copy_alone);
    // The state too: the pieces' codes and absmax are the tensor's, at the piece's position.
    for (size_t c = 0; c < chunks.size(); ++c) {
      auto [b, count] = chunks[c];
      state.update_pieces(hyper, 9, tensors, b, count, stored[c].data(), grads.data() + b, nullptr, pieces);
      for (const AdamWChunk& p : pieces) {
        const uint64_t e = b + static_cast<uint64_t>(p.params - state.master(stored[c].data()));
        size_t t = 0;
        while (e >= tensors[t].offset_elements + tensors[t].element_count) ++t;
        const uint64_t local = e - tensors[t].offset_elements;
        const Alone& a = alone[t];
        if (p.block_elements > 0) {
          ASSERT_EQ(local % rules.block_elements, 0u) << "a piece that does not start on a block";
          EXPECT_EQ(std::memcmp(p.exp_avg_codes, a.codes_m.data() + local, p.count), 0);
          EXPECT_EQ(std::memcmp(p.exp_avg_sq_codes, a.codes_v.data() + local, p.count), 0);
          const size_t blocks = kernels::adamw8bit_block_count(p.count, p.block_elements);
          EXPECT_EQ(std::memcmp(p.exp_avg_absmax, a.absmax_m.data() + local / rules.block_elements, 4 * blocks), 0);
          EXPECT_EQ(std::memcmp(p.exp_avg_sq_absmax, a.absmax_v.data() + local / rules.block_elements, 4 * blocks), 0);
        } else {
          EXPECT_EQ(std::memcmp(p.exp_avg, a.m.data() + local, 4 * p.count), 0);
          EXPECT_EQ(std::memcmp(p.exp_avg_sq, a.v.data() + local, 4 * p.count), 0);
        }
      }
    }
  }
}

TEST(StateLayout, StateAloneIsTheChunkAfterItsMaster) {
  EightBitRules rules;
  rules.block_elements = 64;
  rules.min_8bit_elements = 1000;
  for (const StateLayout& layout : {StateLayout(), StateLayout(Kind::adamw8bit, rules)}) {
    // 8-bit (3000), fp32 (200), 8-bit (1100); a chunk from a block boundary of the first.
    const TensorSpan tensors[] = {{0, 3000, true}, {3000, 200, false}, {3200, 1100, true}};
    const uint64_t begin = 640, count = 4300 - 640;
    EXPECT_EQ(layout.state_bytes(tensors, begin, count) + 4 * count, layout.chunk_bytes(tensors, begin, count));
    std::vector<float> master(count, 1.0f), grads(count, 0.5f);
    std::vector<std::byte> chunk(layout.chunk_bytes(tensors, begin, count)), state(layout.state_bytes(tensors, begin, count));
    layout.initialize(tensors, begin, count, master.data(), chunk.data());
    layout.initialize_state(tensors, begin, count, state.data());
    EXPECT_EQ(std::memcmp(chunk.data() + 4 * count, state.data(), state.size()), 0) << layout.describe();
    std::vector<AdamWChunk> in_chunk, alone;
    layout.update_pieces({}, 2, tensors, begin, count, chunk.data(), grads.data(), nullptr, in_chunk);
    layout.update_pieces({}, 2, tensors, begin, count, master.data(), state.data(), grads.data(), nullptr, alone);
    ASSERT_EQ(in_chunk.size(), alone.size());
    auto offset = [](const void* p, const void* base) {
      return p == nullptr ? -1 : static_cast<const std::byte*>(p) - static_cast<const std::byte*>(base);
    };
    for (size_t i = 0; i < alone.size(); ++i) {
      const std::byte* c = chunk.data() + 4 * count;
      EXPECT_EQ(offset(in_chunk[i].params, chunk.data()), offset(alone[i].params, master.data()));
      EXPECT_EQ(in_chunk[i].count, alone[i].count);
      EXPECT_EQ(in_chunk[i].block_elements, alone[i].block_elements);
      EXPECT_EQ(offset(in_chunk[i].exp_avg, c), offset(alone[i].exp_avg, state.data()));
      EXPECT_EQ(offset(in_chunk[i].exp_avg_sq, c), offset(alone[i].exp_avg_sq, state.data()));
      EXPECT_EQ(offset(in_chunk[i].exp_avg_codes, c), offset(alone[i].exp_avg_codes, state.data()));
      EXPECT_EQ(offset(in_chunk[i].exp_avg_sq_absmax, c), offset(alone[i].exp_avg_sq_absmax, state.data()));
    }
    // Moments: fresh state reads back zero; written moments read back (8-bit: dequantised
    // after requantising; v, unsigned, exactly; m within its block's code error).
    std::vector<float> m(count, 7.0f), v(count, 7.0f);
    layout.read_moments(tensors, begin, count, state.data(), m.data(), v.data());
    for (uint64_t i = 0; i < count; ++i) ASSERT_TRUE(m[i] == 0.0f && v[i] == 0.0f) << i;
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    std::vector<float> m_in(count), v_in(count), m_back(count), v_back(count);
    for (uint64_t i = 0; i < count; ++i) {
      m_in[i] = uniform(rng) - 0.25f;  // the largest |m| of a block is positive
      v_in[i] = uniform(rng);
    }
    layout.write_moments(tensors, begin, count, m_in.data(), v_in.data(), state.data());
    layout.read_moments(tensors, begin, count, state.data(), m_back.data(), v_back.data());
    std::vector<float> m_again(count), v_again(count);
    layout.write_moments(tensors, begin, count, m_back.data(), v_back.data(), state.data());
    layout.read_moments(tensors, begin, count, state.data(), m_again.data(), v_again.data());
    for (uint64_t i = 0; i < count; ++i) {
      const bool eight = layout.kind() == Kind::adamw8bit && (begin + i < 3000 || begin + i >= 3200);
      if (!eight) {
        ASSERT_EQ(m_back[i], m_in[i]) << i;
        ASSERT_EQ(v_back[i], v_in[i]) << i;
      } else {
        ASSERT_NEAR(m_back[i], m_in[i], 0.05f) << i;  // codes near 0.75 are ~1/64 apart
        ASSERT_NEAR(v_back[i], v_in[i], 0.05f) << i;
      }
      // Requantising what was dequantised changes nothing (these blocks' largest m is positive).
      ASSERT_EQ(m_again[i], m_back[i]) << i;
      ASSERT_EQ(v_again[i], v_back[i]) << i;
    }
  }
}

TEST(StateLayout, MetadataRoundTripsAndRefusesNonsense) {
  EightBitRules rules;
  rules.block_elements = 512;
  rules.min_8bit_elements = 77;
  rules.embedding_fp32 = true;
  const StateLayout state(Kind::adamw8bit, rules);
  std::map<std::string, std::string> metadata;
  state.record(metadata);
  EXPECT_EQ(metadata.at("optim_state"), "adamw8bit");
  Result<StateLayout> back = StateLayout::from_metadata(metadata, "dir");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(*back == state);
  EXPECT_FALSE(*back == StateLayout());
  // A store from before the seam is adamw.
  Result<StateLayout> old = StateLayout::from_metadata({}, "dir");
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(*old == StateLayout());
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"optim_block_elements", "100"}, {"optim_block_elements", "8192"}, {"optim_block_elements", "2x"},
           {"optim_min_8bit_elements", "-1"}, {"optim_embedding_state", "int4"}, {"optim_state", "lion"}}) {
    std::map<std::string, std::string> bad = metadata;
    bad[key] = value;
    Result<StateLayout> refused = StateLayout::from_metadata(bad, "dir");
    ASSERT_FALSE(refused.ok()) << key << "=" << value;
    EXPECT_NE(refused.error().message.find(key == "optim_state" ? "optim_state" : key), std::string::npos)
        << refused.error().message;
  }
  std::map<std::string, std::string> missing = metadata;
  missing.erase("optim_block_elements");
  EXPECT_FALSE(StateLayout::from_metadata(missing, "dir").ok());
}

}  // namespace
}  // namespace strata::optim
