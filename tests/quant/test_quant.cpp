// tests/quant/test_quant.cpp — kernels/quant's layout and kernel on their own terms: every piece
// on a 64-byte boundary, in order, non-overlapping and sized as docs/quant.md says; the nibble
// order and the zero block by hand; bits independent of the thread count; a corrupt buffer
// gives numbers, not a crash; and ComputeBackend::dequantize_unit on the `cpu` and `emulated`
// devices equal to the kernel called directly, bit for bit. The numerics against an independent
// numpy/torch implementation are quant_reference.py's (the `quant_reference` test).
#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include "kernels/quant/quant.h"
#include "tests/backend/backend_harness.h"

namespace strata::testing {
namespace {

namespace q = kernels::quant;

// 64-byte aligned host storage for a quantised unit.
struct AlignedBytes {
  explicit AlignedBytes(uint64_t size_bytes) : storage(size_bytes + q::kPieceAlignmentBytes) {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + (q::kPieceAlignmentBytes - address % q::kPieceAlignmentBytes) % q::kPieceAlignmentBytes;
  }
  std::vector<std::byte> storage;
  std::byte* data = nullptr;
};

std::vector<float> normal_floats(size_t count, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// A block-like unit: norms raw, linears quantised, odd sizes, more than one chunk and more
// than one absmax group in the big one.
std::vector<q::TensorPlan> block_plans() {
  return {{96, false}, {64 * 700 + 5, true}, {96, false}, {64 * 257 * 3, true}, {33, false}, {1, true}};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Quantised {
  q::UnitLayout layout;
  std::vector<float> unit;
  AlignedBytes bytes;
};
Quantised quantised_block(q::Kind kind, bool double_quant) {
  q::UnitLayout layout = q::make_unit_layout(kind, block_plans(), double_quant);
  std::vector<float> unit = normal_floats(layout.element_count, 0.02f, 7);
  AlignedBytes bytes(layout.size_bytes);
  q::quantize_unit(layout, unit.data(), bytes.data);
  return Quantised{std::move(layout), std::move(unit), std::move(bytes)};
}

class QuantFormats : public ::testing::TestWithParam<std::tuple<q::Kind, bool>> {};

// Proves each piece starts on a 64-byte boundary after the previous one ends, the sizes are the
// format's, quantized_tensor_bytes agrees, and the chunks tile every tensor in block multiples.
TEST_P(QuantFormats, LayoutIsAlignedOrderedAndSized) {
  const auto [kind, double_quant] = GetParam();
  const auto plans = block_plans();
  const q::UnitLayout layout = q::make_unit_layout(kind, plans, double_quant);
  ASSERT_EQ(layout.tensors.size(), plans.size());
  uint64_t cursor = 0, elements = 0;
  const auto expect_piece = [&](uint64_t offset, uint64_t size_bytes) {
    EXPECT_EQ(offset % q::kPieceAlignmentBytes, 0u);
    EXPECT_GE(offset, cursor);
    EXPECT_LT(offset, cursor + q::kPieceAlignmentBytes);
    cursor = offset + size_bytes;
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    const q::TensorLayout& t = layout.tensors[i];
    const uint64_t n = plans[i].element_count;
    EXPECT_EQ(t.element_offset, elements);
    EXPECT_EQ(t.element_count, n);
    EXPECT_EQ(t.quantized, plans[i].quantize);
    const uint64_t start = cursor;
    if (!plans[i].quantize) {
      expect_piece(t.raw_offset_bytes, 4 * n);
      EXPECT_EQ(t.codes_offset_bytes, q::kNoPiece);
    } else {
      const uint64_t blocks = (n + 63) / 64;
      EXPECT_EQ(t.block_count, blocks);
      EXPECT_EQ(t.raw_offset_bytes, q::kNoPiece);
      expect_piece(t.codes_offset_bytes, kind == q::Kind::nf4 ? (n + 1) / 2 : n);
      if (double_quant) {
        EXPECT_EQ(t.absmax_block_count, (blocks + 255) / 256);
        expect_piece(t.absmax_offset_bytes, blocks);
        expect_piece(t.absmax2_offset_bytes, 4 * t.absmax_block_count);
        expect_piece(t.absmax_mean_offset_bytes, 4);
      } else {
        EXPECT_EQ(t.absmax2_offset_bytes, q::kNoPiece);
        expect_piece(t.absmax_offset_bytes, 4 * blocks);
      }
      cursor = (cursor + 63) / 64 * 64;
      EXPECT_EQ(cursor - start, q::quantized_tensor_bytes(kind, n, double_quant)) << "tensor " << i;
    }
    cursor = (cursor + 63) / 64 * 64;
    elements += n;
  }
  EXPECT_EQ(layout.size_bytes, cursor);
  EXPECT_EQ(layout.element_count, elements);
  std::vector<uint64_t> covered(plans.size(), 0);
  for (const q::Chunk& chunk : layout.chunks) {
    EXPECT_EQ(chunk.begin_element % q::kBlockElements, 0u);
    EXPECT_EQ(chunk.begin_element, covered[chunk.tensor_index]);
    covered[chunk.tensor_index] += chunk.element_count;
  }
  for (size_t i = 0; i < plans.size(); ++i) EXPECT_EQ(covered[i], plans[i].element_count);
}

// Proves the bits depend on the data only: one thread and the whole arena agree, and a second
// quantisation of the same unit writes the same bytes (padding included).
TEST_P(QuantFormats, BitsDoNotDependOnThreads) {
  const auto [kind, double_quant] = GetParam();
  Quantised quantised = quantised_block(kind, double_quant);
  const q::UnitLayout& layout = quantised.layout;
  std::vector<float> wide(layout.element_count), single(layout.element_count);
  q::dequantize_unit(layout, quantised.bytes.data, wide.data());
  AlignedBytes again(layout.size_bytes);
  std::memset(again.data, 0x5A, layout.size_bytes);
  tbb::task_arena one_thread(1);
  one_thread.execute([&] {
    q::quantize_unit(layout, quantised.unit.data(), again.data);
    q::dequantize_unit(layout, again.data, single.data());
  });
  EXPECT_EQ(std::memcmp(again.data, quantised.bytes.data, layout.size_bytes), 0);
  EXPECT_TRUE(same_bits(wide, single));
}

// Proves the AVX2 loop gives the scalar loop's bits (where the CPU has AVX2).
TEST_P(QuantFormats, Avx2EqualsScalar) {
  if (kernels::detect_cpu_isa() == kernels::CpuIsa::scalar) GTEST_SKIP() << "no AVX2 on this CPU";
  const auto [kind, double_quant] = GetParam();
  Quantised quantised = quantised_block(kind, double_quant);
  const q::UnitLayout& layout = quantised.layout;
  std::vector<float> scalar(layout.element_count), avx2(layout.element_count);
  q::dequantize_unit(layout, quantised.bytes.data, scalar.data(), kernels::CpuIsa::scalar);
  q::dequantize_unit(layout, quantised.bytes.data, avx2.data(), kernels::CpuIsa::avx2);
  EXPECT_TRUE(same_bits(scalar, avx2));
}

// Proves a corrupt buffer (random bytes where codes, absmax and the double-quant pieces should
// be) is read without going out of bounds: every code indexes inside its table.
TEST_P(QuantFormats, CorruptBufferGivesNumbersNotACrash) {
  const auto [kind, double_quant] = GetParam();
  const q::UnitLayout layout = q::make_unit_layout(kind, block_plans(), double_quant);
  AlignedBytes bytes(layout.size_bytes);
  std::mt19937 rng(3);
  for (uint64_t i = 0; i < layout.size_bytes; ++i) bytes.data[i] = static_cast<std::byte>(rng());
  std::vector<float> out(layout.element_count);
  q::dequantize_unit(layout, bytes.data, out.data());
  SUCCEED();
}

// Proves non-finite inputs (the checkpoint loader's to refuse) are quantised without undefined
// behaviour — no NaN or inf reaches an integer conversion — and the finite blocks beside them
// come back as they would alone.
TEST_P(QuantFormats, NonFiniteInputsAreSafe) {
  const auto [kind, double_quant] = GetParam();
  const q::UnitLayout layout = q::make_unit_layout(kind, {{256, true}}, double_quant);
  std::vector<float> unit = normal_floats(256, 1.0f, 5);
  unit[3] = std::numeric_limits<float>::quiet_NaN();
  unit[70] = std::numeric_limits<float>::infinity();
  unit[140] = -std::numeric_limits<float>::infinity();
  AlignedBytes bytes(layout.size_bytes);
  q::quantize_unit(layout, unit.data(), bytes.data);
  std::vector<float> out(256);
  q::dequantize_unit(layout, bytes.data, out.data());
  if (double_quant) return;  // the mean of an inf absmax spoils every block: only safety here
  const q::UnitLayout alone = q::make_unit_layout(kind, {{64, true}}, false);
  AlignedBytes alone_bytes(alone.size_bytes);
  q::quantize_unit(alone, unit.data() + 192, alone_bytes.data);
  std::vector<float> alone_out(64);
  q::dequantize_unit(alone, alone_bytes.data, alone_out.data());
  EXPECT_EQ(std::memcmp(out.data() + 192, alone_out.data(), 64 * sizeof(float)), 0);
}

// Proves the op on each CPU-side device kind — `cpu` (in place) and `emulated` (a discrete
// device: the buffer crosses by copies, the op waits for the stream) — is the kernel called
// directly, bit for bit.
TEST_P(QuantFormats, BackendOpEqualsTheKernel) {
  const auto [kind, double_quant] = GetParam();
  Quantised quantised = quantised_block(kind, double_quant);
  const q::UnitLayout& layout = quantised.layout;
  std::vector<float> direct(layout.element_count);
  q::dequantize_unit(layout, quantised.bytes.data, direct.data());
  const std::vector<std::byte> host_bytes(quantised.bytes.data, quantised.bytes.data + layout.size_bytes);
  for (const device::Kind device_kind : {device::Kind::cpu, device::Kind::emulated}) {
    auto env = BackendEnv::create(device_kind);
    ASSERT_NE(env, nullptr);
    const std::byte* src = env->upload(host_bytes);
    float* dst = env->zeros<float>(layout.element_count);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(src) % q::kPieceAlignmentBytes, 0u);
    ASSERT_TRUE(env->backend().dequantize_unit(layout, src, dst).ok());
    EXPECT_TRUE(same_bits(env->download(dst, layout.element_count), direct))
        << device::kind_name(device_kind) << ": the op differs from quant::dequantize_unit";
  }
}

INSTANTIATE_TEST_SUITE_P(Quant, QuantFormats,
                         ::testing::Combine(::testing::Values(q::Kind::nf4, q::Kind::int8), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<q::Kind, bool>>& info) {
                           return std::string(q::kind_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_double_quant" : "");
                         });

// Proves the nibble order (first element high, bitsandbytes'), the odd tail's zero low nibble,
// the zero block's codes and exact zeros, by hand.
TEST(Nf4, NibbleOrderAndZeroBlockByHand) {
  const q::UnitLayout layout = q::make_unit_layout(q::Kind::nf4, {{64 + 3, true}, {64, true}}, false);
  std::vector<float> unit(layout.element_count, 0.0f);
  unit[0] = 1.0f;    // code 15
  unit[1] = -1.0f;   // code 0
  unit[2] = 0.0f;    // code 7
  unit[3] = 0.5f;    // nearest level 0.4407 (0.5626 is farther) -> code 12
  unit[64] = 2.0f;   // second block: absmax 2, code 15
  unit[65] = -0.2f;  // -0.1 of absmax: nearest -0.0911 -> code 6
  unit[66] = 1.0f;   // 0.5 -> code 12, the odd tail: low nibble 0
  // tensor 1 all zeros
  AlignedBytes bytes(layout.size_bytes);
  q::quantize_unit(layout, unit.data(), bytes.data);
  const auto* codes = reinterpret_cast<const uint8_t*>(bytes.data + layout.tensors[0].codes_offset_bytes);
  EXPECT_EQ(codes[0], 0xF0);
  EXPECT_EQ(codes[1], 0x7C);
  EXPECT_EQ(codes[32], 0xF6);
  EXPECT_EQ(codes[33], 0xC0);
  const auto* absmax = reinterpret_cast<const float*>(bytes.data + layout.tensors[0].absmax_offset_bytes);
  EXPECT_EQ(absmax[0], 1.0f);
  EXPECT_EQ(absmax[1], 2.0f);
  const auto* zero_codes = reinterpret_cast<const uint8_t*>(bytes.data + layout.tensors[1].codes_offset_bytes);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(zero_codes[i], 0x77) << i;
  std::vector<float> out(layout.element_count, -1.0f);
  q::dequantize_unit(layout, bytes.data, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[3], q::kNf4Levels[12]);
  EXPECT_EQ(out[66], q::kNf4Levels[12] * 2.0f);
  EXPECT_EQ(out[65], q::kNf4Levels[6] * 2.0f);
  for (uint64_t i = 67; i < layout.element_count; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), 0u) << i;
}

// Proves int8's rounding and clamp by hand: round half to even of x / (absmax / 127).
TEST(Int8, CodesByHand) {
  const q::UnitLayout layout = q::make_unit_layout(q::Kind::int8, {{4, true}}, false);
  const std::vector<float> unit = {127.0f, -127.0f, 2.5f, -0.5f};  // absmax 127: scale 1
  AlignedBytes bytes(layout.size_bytes);
  q::quantize_unit(layout, unit.data(), bytes.data);
  const auto* codes = reinterpret_cast<const int8_t*>(bytes.data + layout.tensors[0].codes_offset_bytes);
  EXPECT_EQ(codes[0], 127);
  EXPECT_EQ(codes[1], -127);
  EXPECT_EQ(codes[2], 2);  // 2.5 -> 2 (even)
  EXPECT_EQ(codes[3], 0);  // -0.5 -> -0 -> 0
}

}  // namespace
}  // namespace strata::testing
