// kernels/optim/adamw8bit.h: proves the AVX2 and AVX-512 loops give the scalar loop's exact bits
// (params, codes, absmax, the compute copy; NaN/inf gradients, zero blocks, tails, block sizes
// 1..4096, fp32 and bf16 gradients), that the AVX-512 quantiser equals the scalar one on every
// float near every threshold and bucket edge, that the
// do not depend on the thread count, that a non-finite gradient leaves its element alone, that
// the code search returns the nearest code; and — through adamw8bit_reference.py, run with
// /usr/bin/python3 — that the code tables and 20 steps equal an independent torch
// implementation and that the loss of a regression tracks fp32 AdamW's.
#include <sys/wait.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/adamw8bit_element.h"
#include "kernels/optim/cpu_kernels.h"

namespace strata::kernels {
namespace {

#define SKIP_WITHOUT_AVX2()                        \
  if (detect_cpu_isa() != CpuIsa::avx2)            \
  GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C: only the scalar path runs"
#define SKIP_WITHOUT_AVX512() \
  if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 F/BW/DQ/VL/VBMI: the AVX-512 loop cannot run"

// One chunk's state, owned, with gradients drawn per step over many decades per block.
struct Chunk {
  size_t block_elements;
  std::vector<float> params;
  std::vector<uint8_t> m_codes, v_codes;
  std::vector<float> m_absmax, v_absmax;
  std::vector<uint16_t> copy;
  Chunk(size_t count, size_t block, uint64_t seed)
      : block_elements(block),
        params(count),
        m_codes(count),
        v_codes(count),
        m_absmax(adamw8bit_block_count(count, block)),
        v_absmax(adamw8bit_block_count(count, block)),
        copy(count) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    for (float& p : params) p = normal(rng);
    adamw8bit_init(state());
  }
  AdamW8bitState state() {
    return {params, m_codes, v_codes, m_absmax, v_absmax, block_elements};
  }
};

// Every fifth block of a chunk gets zero gradients (on the zero state: a block of zeros, absmax
// 0, the quantiser's scale 1).
std::vector<float> make_grads(size_t count, size_t block, uint64_t seed, bool non_finite) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> decade(-9, 2);
  std::vector<float> grads(count);
  for (size_t begin = 0, index = 0; begin < count; begin += block, ++index) {
    const float scale = index % 5 == 3 ? 0.0f : std::pow(10.0f, static_cast<float>(decade(rng)));
    for (size_t i = begin; i < std::min(count, begin + block); ++i) grads[i] = normal(rng) * scale;
  }
  if (non_finite) {
    const float specials[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < count; i += 37) grads[i] = specials[(i / 37) % 3];
  }
  return grads;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = detail::fp32_to_bf16_bits(values[i]);
  return bits;
}

void run_steps(Chunk& chunk, int steps, DType copy, bool bf16_grads, CpuIsa isa, float grad_scale = 1.0f) {
  const AdamWConfig config{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= steps; ++step) {
    const auto grads = make_grads(chunk.params.size(), chunk.block_elements, 100 + step, step % 2 == 1);
    const auto scalars = adamw_step_scalars(config, step, grad_scale);
    const ComputeCopy out{copy, copy == DType::f32 ? std::span<uint16_t>{} : std::span<uint16_t>(chunk.copy)};
    if (bf16_grads) {
      const auto bits = to_bf16(grads);
      adamw8bit_step_bf16_grads(scalars, chunk.state(), bits, out, isa);
    } else {
      adamw8bit_step(scalars, chunk.state(), grads, out, isa);
    }
  }
}

void expect_same_bits(const Chunk& a, const Chunk& b) {
  const size_t n = a.params.size();
  ASSERT_EQ(0, std::memcmp(a.params.data(), b.params.data(), n * 4));
  ASSERT_EQ(a.m_codes, b.m_codes);
  ASSERT_EQ(a.v_codes, b.v_codes);
  ASSERT_EQ(0, std::memcmp(a.m_absmax.data(), b.m_absmax.data(), a.m_absmax.size() * 4));
  ASSERT_EQ(0, std::memcmp(a.v_absmax.data(), b.v_absmax.data(), a.v_absmax.size() * 4));
  ASSERT_EQ(a.copy, b.copy);
}

// `isa` against the scalar loop over block sizes around the vector widths (8, 16, 64 codes),
// counts with every kind of tail (20001: two TBB tiles), each compute copy, fp32 and bf16
// gradients.
void expect_matches_scalar(CpuIsa isa) {
  for (const size_t block : {size_t{1}, size_t{8}, size_t{13}, size_t{16}, size_t{17}, size_t{64}, size_t{100},
                             size_t{256}, size_t{4096}}) {
    for (const size_t count : {size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{63}, size_t{65},
                               size_t{255}, size_t{257}, size_t{4099}, size_t{20001}}) {
      for (const DType copy : {DType::bf16, DType::f16, DType::f32}) {
        for (const bool bf16_grads : {false, true}) {
          const float grad_scale = copy == DType::f32 ? 0.25f : 1.0f;
          Chunk scalar(count, block, count), other(count, block, count);
          run_steps(scalar, 4, copy, bf16_grads, CpuIsa::scalar, grad_scale);
          run_steps(other, 4, copy, bf16_grads, isa, grad_scale);
          SCOPED_TRACE("block " + std::to_string(block) + " count " + std::to_string(count) + " copy " +
                       std::to_string(static_cast<int>(copy)) + " bf16 grads " + std::to_string(bf16_grads));
          expect_same_bits(scalar, other);
        }
      }
    }
  }
}

TEST(AdamW8bit, Avx2MatchesScalarBitForBit) {
  SKIP_WITHOUT_AVX2();
  expect_matches_scalar(CpuIsa::avx2);
}

TEST(AdamW8bit, Avx512MatchesScalarBitForBit) {
  SKIP_WITHOUT_AVX512();
  expect_matches_scalar(CpuIsa::avx512);
}

TEST(AdamW8bit, BestIsAvx512WhereTheCpuHasIt) {
  // The same bits whichever loop `best` picks; this pins that it picks the AVX-512 one here.
  SKIP_WITHOUT_AVX512();
  const size_t count = 4099;
  Chunk best(count, 256, 8), avx512(count, 256, 8);
  run_steps(best, 2, DType::bf16, false, CpuIsa::best);
  run_steps(avx512, 2, DType::bf16, false, CpuIsa::avx512);
  expect_same_bits(best, avx512);
}

TEST(AdamW8bit, ResultsDoNotDependOnThreadCount) {
  const size_t count = 1'000'003;  // ~61 tiles, a short tail block
  Chunk one(count, kAdamW8bitBlockElements, 5), two(count, kAdamW8bitBlockElements, 5);
  tbb::task_arena(1).execute([&] { run_steps(one, 3, DType::bf16, false, CpuIsa::best); });
  tbb::task_arena(2).execute([&] { run_steps(two, 3, DType::bf16, false, CpuIsa::best); });
  expect_same_bits(one, two);
}

// The dequantised moment of element i (what the state stands for).
float moment(const Chunk& chunk, size_t i, bool is_signed) {
  const auto& code = dynamic_code(is_signed);
  const size_t block = i / chunk.block_elements;
  return is_signed ? code[chunk.m_codes[i]] * chunk.m_absmax[block]
                   : code[chunk.v_codes[i]] * chunk.v_absmax[block];
}

TEST(AdamW8bit, NonFiniteGradientLeavesItsElementAlone) {
  std::vector<CpuIsa> isas = {CpuIsa::scalar};
  if (detect_cpu_isa() == CpuIsa::avx2) isas.push_back(CpuIsa::avx2);
  if (cpu_has_avx512()) isas.push_back(CpuIsa::avx512);
  for (const CpuIsa isa : isas) {
    const size_t count = 1000;
    Chunk chunk(count, 256, 3);
    run_steps(chunk, 2, DType::f32, false, isa);  // non-zero moments
    const AdamWConfig config{};
    auto grads = make_grads(count, 256, 77, false);
    for (float& g : grads) g = 1e-3f;  // same magnitude as nothing else: absmax changes
    grads[5] = NAN;
    grads[300] = INFINITY;
    grads[999] = -INFINITY;
    std::vector<float> params_before = chunk.params;
    std::vector<float> m_before(count), v_before(count);
    for (size_t i = 0; i < count; ++i) {
      m_before[i] = moment(chunk, i, true);
      v_before[i] = moment(chunk, i, false);
    }
    adamw8bit_step(adamw_step_scalars(config, 3), chunk.state(), grads, {}, isa);
    for (const size_t i : {size_t{5}, size_t{300}, size_t{999}}) {
      EXPECT_EQ(std::bit_cast<uint32_t>(chunk.params[i]), std::bit_cast<uint32_t>(params_before[i])) << i;
      // The value is kept; its code is re-derived against the block's new absmax, so it reads
      // back as the nearest code to the same value: within half the widest gap between codes
      // (0.9/64 in the signed table's top decade, 0.9/128 in the unsigned one) times absmax.
      EXPECT_NEAR(moment(chunk, i, true), m_before[i], 0.0071f * chunk.m_absmax[i / 256]) << i;
      EXPECT_NEAR(moment(chunk, i, false), v_before[i], 0.0036f * chunk.v_absmax[i / 256]) << i;
    }
    // Their block neighbours moved.
    EXPECT_NE(chunk.params[6], params_before[6]);
    EXPECT_NE(chunk.params[301], params_before[301]);
    EXPECT_NE(chunk.params[998], params_before[998]);
  }
}

TEST(AdamW8bit, ZeroGradientsOnZeroStateStayZero) {
  Chunk chunk(600, 256, 9);
  const std::vector<float> grads(600, 0.0f);
  const AdamWConfig config{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
  adamw8bit_step(adamw_step_scalars(config, 1), chunk.state(), grads);
  for (size_t i = 0; i < 600; ++i) {
    EXPECT_EQ(chunk.m_codes[i], kDynamicCodeSignedZero);
    EXPECT_EQ(chunk.v_codes[i], 0);
  }
  for (const float a : chunk.m_absmax) EXPECT_EQ(a, 0.0f);
}

TEST(AdamW8bit, CodeSearchReturnsTheNearestCode) {
  for (const bool is_signed : {true, false}) {
    const detail::CodeTable& table = detail::cpu_code_table(is_signed);
    const auto& values = dynamic_code(is_signed);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> uniform(is_signed ? -1.0f : 0.0f, 1.0f);
    std::vector<float> probes;
    for (int i = 0; i < 200000; ++i) probes.push_back(uniform(rng));
    for (size_t k = 0; k < 256; ++k) probes.push_back(values[k]);
    for (size_t k = 1; k < 256; ++k) probes.push_back(table.midpoints[k]);  // exact ties
    for (const float x : probes) {
      const uint32_t code = detail::nearest_code(table.values, table.midpoints, x);
      ASSERT_LT(code, 256u);
      // Nearest in exact arithmetic, up to the fp32 rounding of the midpoint bitsandbytes
      // compares against (half an ulp of a value <= 1: below 6e-8).
      const double distance = std::fabs(static_cast<double>(values[code]) - x);
      for (size_t k = 0; k < 256; ++k) {
        ASSERT_LE(distance, std::fabs(static_cast<double>(values[k]) - x) + 6e-8) << x << " code " << code;
      }
      // And exactly the fp32 midpoint rule: x lies between the thresholds around its code, and
      // a tie on a threshold keeps the even index.
      ASSERT_GE(x, table.midpoints[code]) << x;
      ASSERT_LE(x, table.midpoints[code + 1]) << x;
      if (x == table.midpoints[code] || x == table.midpoints[code + 1]) {
        EXPECT_EQ(code % 2, 0u) << x;
      }
    }
  }
}

// The CPU's table lookup is the search, on every threshold and its neighbours, every bucket's
// edges, random values and the specials: two monotone step functions agreeing around every
// step and at every bucket edge agree everywhere.
TEST(AdamW8bit, TableLookupEqualsTheSearch) {
  for (const bool is_signed : {true, false}) {
    const detail::CodeTable& table = detail::cpu_code_table(is_signed);
    std::vector<float> probes = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, INFINITY, -INFINITY, NAN, -NAN,
                                 1e-30f, -1e-30f, 1e-8f, -1e-8f, 5.9604645e-08f, -5.9604645e-08f};
    for (size_t k = 1; k < 256; ++k) {
      const uint32_t bits = std::bit_cast<uint32_t>(table.midpoints[k]);
      for (int delta = -3; delta <= 3; ++delta) probes.push_back(std::bit_cast<float>(bits + delta));
    }
    for (uint32_t bucket = 0; bucket < detail::kCodeBucketsPerSign; ++bucket) {
      const uint32_t low = ((bucket >> 8) + detail::kCodeBucketMinExponent) << 23 | (bucket & 0xFFu) << 15;
      for (const uint32_t bits : {low, low | 0x7FFFu, low | 0x4000u}) {
        probes.push_back(std::bit_cast<float>(bits));
        probes.push_back(-std::bit_cast<float>(bits));
      }
    }
    std::mt19937_64 rng(12);
    for (int i = 0; i < 1000000; ++i) {
      // Random bit patterns of magnitude <= 1, both signs: every exponent equally.
      const uint32_t bits = static_cast<uint32_t>(rng()) % 0x3F800001u | (rng() & 1 ? 0x80000000u : 0u);
      probes.push_back(std::bit_cast<float>(bits));
    }
    for (const float x : probes) {
      ASSERT_EQ(detail::nearest_code_lut(table, x), detail::nearest_code(table.values, table.midpoints, x))
          << x << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x) << ")";
    }
  }
}

using Quantiser = void (*)(const detail::CodeTable&, bool, const float*, float, size_t, uint8_t*);

// A vector quantiser is quantize_moment on every float within 64 ulps of every threshold (both
// signs, ties included), every bucket edge, the specials (±0, ±1 and their neighbours, ±inf,
// NaNs, subnormals) and random bit patterns, each scaled by 1, by random block scales and by 0
// (an infinite absmax), in runs of every length mod 16 (the vector tails).
void expect_quantiser_equals_scalar(Quantiser quantiser) {
  for (const bool is_signed : {true, false}) {
    const detail::CodeTable& table = detail::cpu_code_table(is_signed);
    std::vector<float> probes = {0.0f, -0.0f, 1.0f, -1.0f, std::nextafter(1.0f, 2.0f), std::nextafter(-1.0f, -2.0f),
                                 2.0f, -2.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -1e-30f, 1e-40f, -1e-40f,
                                 std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0xFFC00001u)};
    for (size_t k = 1; k < 256; ++k) {
      const uint32_t bits = std::bit_cast<uint32_t>(table.midpoints[k]);
      for (int delta = -64; delta <= 64; ++delta) {
        const float near = std::bit_cast<float>(bits + delta);
        probes.push_back(near);
        probes.push_back(-near);
      }
    }
    for (uint32_t bucket = 0; bucket < detail::kCodeBucketsPerSign; ++bucket) {
      const uint32_t low = ((bucket >> 8) + detail::kCodeBucketMinExponent) << 23 | (bucket & 0xFFu) << 15;
      for (const uint32_t bits : {low, low - 1, low | 0x7FFFu, low | 0x4000u}) {
        probes.push_back(std::bit_cast<float>(bits));
        probes.push_back(-std::bit_cast<float>(bits));
      }
    }
    std::mt19937_64 rng(13);
    for (int i = 0; i < 300000; ++i) {
      const uint32_t bits = static_cast<uint32_t>(rng()) % 0x3F800001u | (rng() & 1 ? 0x80000000u : 0u);
      probes.push_back(std::bit_cast<float>(bits));
    }
    std::uniform_real_distribution<float> log_scale(-12.0f, 3.0f);
    std::vector<float> inverses = {1.0f, detail::inverse_absmax(INFINITY)};
    for (int i = 0; i < 4; ++i) inverses.push_back(detail::inverse_absmax(std::pow(10.0f, log_scale(rng))));
    std::vector<uint8_t> codes(probes.size());
    for (const float inverse : inverses) {
      // Runs of 1..33 values, so every tail length goes through the masked last group.
      for (size_t begin = 0, run = 1; begin < probes.size(); begin += run, run = run % 33 + 1) {
        const size_t n = std::min(run, probes.size() - begin);
        quantiser(table, is_signed, probes.data() + begin, inverse, n, codes.data() + begin);
      }
      for (size_t i = 0; i < probes.size(); ++i) {
        ASSERT_EQ(codes[i], detail::quantize_moment(table, is_signed, probes[i], inverse))
            << probes[i] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(probes[i]) << ") inverse " << inverse
            << (is_signed ? " signed" : " unsigned");
      }
    }
  }
}

TEST(AdamW8bit, Avx2QuantiserEqualsTheScalarOne) {
  SKIP_WITHOUT_AVX2();
  expect_quantiser_equals_scalar(detail::quantize_moments_avx2);
}

TEST(AdamW8bit, Avx512QuantiserEqualsTheScalarOne) {
  SKIP_WITHOUT_AVX512();
  expect_quantiser_equals_scalar(detail::quantize_moments_avx512);
}

// Every fp32 bit pattern of |x| < 2 (both signs, so every input the moments give and the
// rounding past 1) through a vector quantiser, quantize_moment and the reference search at
// scale 1: all 2.15e9 of them per table when STRATA_ADAMW8BIT_EXHAUSTIVE=1 (about 25 s of CPU
// per quantiser on this 2-core EPYC), else every 97th — a sweep that still crosses every
// bucket many times.
void expect_quantiser_equals_scalar_swept(Quantiser quantiser) {
  const char* exhaustive = std::getenv("STRATA_ADAMW8BIT_EXHAUSTIVE");
  const uint32_t stride = exhaustive != nullptr && std::string(exhaustive) == "1" ? 1 : 97;
  constexpr uint32_t kLimit = 0x40000000u;  // 2.0f
  constexpr uint32_t kChunk = 1u << 16;
  for (const bool is_signed : {true, false}) {
    const detail::CodeTable& table = detail::cpu_code_table(is_signed);
    std::atomic<uint64_t> mismatches{0};
    std::atomic<uint32_t> first_bad{0};
    tbb::parallel_for(uint32_t{0}, 2 * (kLimit / kChunk), [&](uint32_t chunk) {
      const uint32_t sign = chunk & 1u ? 0x80000000u : 0u;
      const uint32_t begin = (chunk >> 1) * kChunk;
      std::vector<float> values;
      values.reserve(kChunk / stride + 1);
      // Offsets keep stride > 1 from seeing one residue class only.
      for (uint32_t low = begin + (chunk >> 1) % stride; low < begin + kChunk; low += stride) {
        values.push_back(std::bit_cast<float>(sign | low));
      }
      std::vector<uint8_t> codes(values.size());
      quantiser(table, is_signed, values.data(), 1.0f, values.size(), codes.data());
      for (size_t k = 0; k < values.size(); ++k) {
        // Both the CPU's table lookup and bitsandbytes' search itself (with the sign rule).
        const uint32_t searched = detail::nearest_code(table.values, table.midpoints, values[k]);
        const auto reference = static_cast<uint8_t>(is_signed ? detail::keep_sign(searched, values[k]) : searched);
        if (codes[k] != detail::quantize_moment(table, is_signed, values[k], 1.0f) || codes[k] != reference) {
          if (mismatches.fetch_add(1) == 0) first_bad = std::bit_cast<uint32_t>(values[k]);
        }
      }
    });
    EXPECT_EQ(mismatches.load(), 0u) << (is_signed ? "signed" : "unsigned") << ", first at bits 0x" << std::hex
                                     << first_bad.load();
  }
}

TEST(AdamW8bit, Avx2QuantiserEqualsTheScalarOneSwept) {
  SKIP_WITHOUT_AVX2();
  expect_quantiser_equals_scalar_swept(detail::quantize_moments_avx2);
}

TEST(AdamW8bit, Avx512QuantiserEqualsTheScalarOneSwept) {
  SKIP_WITHOUT_AVX512();
  expect_quantiser_equals_scalar_swept(detail::quantize_moments_avx512);
}

// The eps caveat (docs/optim.md), pinned: in a block whose v spans more than the code's range,
// a small entry's v is stored as 0 every step, so its denominator is sqrt(1-b2) of what fp32
// AdamW has and its update grows towards ~31x (b2 = 0.999) as the bias correction fades.
TEST(AdamW8bit, EpsCaveatSmallVInAWideBlockStepsLarge) {
  const size_t count = 256;
  std::vector<float> grads(count, 1e-4f);
  grads[0] = 1.0f;  // v ratio 1e-8 < the smallest code's midpoint (1.6e-7)
  Chunk chunk(count, 256, 1);
  std::fill(chunk.params.begin(), chunk.params.end(), 0.0f);
  std::vector<float> params32(count, 0.0f), m32(count, 0.0f), v32(count, 0.0f);
  const AdamWConfig config{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
  float update8 = 0.0f, update32 = 0.0f;
  for (int step = 1; step <= 100; ++step) {
    const float before8 = chunk.params[1], before32 = params32[1];
    adamw8bit_step(adamw_step_scalars(config, step), chunk.state(), grads);
    adamw_step(adamw_step_scalars(config, step), params32, grads, m32, v32);
    update8 = chunk.params[1] - before8;
    update32 = params32[1] - before32;
    ASSERT_EQ(chunk.v_codes[1], 0) << "step " << step;
  }
  EXPECT_NEAR(update32, -1e-3f, 1e-6f);
  EXPECT_GT(update8 / update32, 8.0f);  // 8.76x at step 100 here
}

TEST(AdamW8bit, PredicateAndSizes) {
  EXPECT_FALSE(adamw8bit_applies(4095));
  EXPECT_TRUE(adamw8bit_applies(4096));
  EXPECT_FALSE(adamw8bit_applies(100, 101));
  EXPECT_EQ(adamw8bit_block_count(256), 1u);
  EXPECT_EQ(adamw8bit_block_count(257), 2u);
  EXPECT_EQ(adamw8bit_state_bytes(1000), 2000u + 8u * 4u);
  EXPECT_EQ(dynamic_code(true)[kDynamicCodeSignedZero], 0.0f);
  EXPECT_EQ(dynamic_code(false)[0], 0.0f);
  EXPECT_EQ(dynamic_code(true)[255], 1.0f);
}

// --- against PyTorch ----------------------------------------------------------------------------------

void run_torch_reference(const std::string& mode) {
  const std::string command = std::string(STRATA_SYSTEM_PYTHON) + " " + STRATA_ADAMW8BIT_TORCH_SCRIPT + " " +
                              STRATA_OPTIM_CAPI + " " + mode;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  const int code = WEXITSTATUS(status);
  if (code == 77) GTEST_SKIP() << "PyTorch is not importable by " << STRATA_SYSTEM_PYTHON;
  EXPECT_EQ(code, 0) << command;
}

TEST(AdamW8bitVsTorch, DynamicMapsEqualTheConstruction) { run_torch_reference("maps"); }
TEST(AdamW8bitVsTorch, TwentyStepsCodesAbsmaxParams) { run_torch_reference("steps"); }
TEST(AdamW8bitVsTorch, RegressionLossTracksFp32AdamW) { run_torch_reference("loss"); }

}  // namespace
}  // namespace strata::kernels
