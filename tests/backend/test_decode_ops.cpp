// tests/backend/test_decode_ops.cpp — the decoding operations (kernels/ops.h, "decoding with a KV
// cache": copy_rows, attention_decode, matmul_bf16) on every backend present — cpu, emulated,
// and cuda where a device is visible (skipped, not passed, elsewhere) — against plain
// double-precision loops written here from ops.h's statement of each op, per output tensor;
// memory an op must not write is stamped and checked exactly. cpu and emulated run the same CPU
// loops and must agree bit for bit. The shapes reach the edges of the CUDA kernels: more new rows
// than one attention launch takes (64), GQA and MQA with strided q, k/v and out, a bf16 matrix
// wider than one widened piece (kDecodeHeadPieceRows), and one so skinny that its pieces must
// run along `in` in the tightest scratch the backend asks for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/backend/backend_harness.h"

namespace strata::testing {
namespace {

namespace ops = kernels::ops;

// Memory an op must leave alone holds this; any other value there is a stray write.
constexpr float kStamp = 7.25f;

// A value of every bf16 pattern's widening is the pattern in the top half of an fp32.
float widen(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

std::vector<uint16_t> random_bf16(size_t count, uint32_t seed) {
  std::vector<uint16_t> bits(count);
  const std::vector<float> values = random_floats(count, 1.0f, seed);
  for (size_t i = 0; i < count; ++i) {
    uint32_t word;
    std::memcpy(&word, &values[i], sizeof word);
    bits[i] = static_cast<uint16_t>(word >> 16);  // truncation: any bf16 is a fine input
  }
  return bits;
}

// max|got − want| / max|want| over the positions `checked` says, the parity suites' measure.
template <typename Checked>
double relative_error(const std::vector<float>& got, const std::vector<double>& want, Checked checked) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!checked(i)) continue;
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

std::string kind_label(device::Kind kind) { return device::kind_name(kind); }

// --- copy_rows --------------------------------------------------------------------------------

struct CopyCase {
  int64_t rows, cols, src_stride, dst_stride;
};
// Strided on both sides (CUDA's 2D copy), one row, and rows back to back (its plain copy).
const CopyCase kCopyCases[] = {{3, 4, 10, 7}, {1, 5, 9, 6}, {4, 6, 6, 6}};

std::vector<float> run_copy(BackendEnv& env, const CopyCase& c) {
  const float* src = env.upload(random_floats(static_cast<size_t>(c.rows * c.src_stride), 1.0f, 11));
  const size_t dst_count = static_cast<size_t>(c.rows * c.dst_stride);
  float* dst = env.upload(std::vector<float>(dst_count, kStamp));
  EXPECT_TRUE(env.backend().copy_rows(ops::CopyRows{dst, c.dst_stride, src, c.src_stride, c.rows, c.cols}).ok());
  return env.download(dst, dst_count);
}

// --- attention_decode -------------------------------------------------------------------------

struct AttentionCase {
  int64_t past, rows, max_positions, n_head, n_kv_head, head_dim, q_stride, kv_stride, out_stride;
};
const AttentionCase kAttentionCases[] = {
    // GQA (two query heads per k/v head) with q inside a fused [q | k | v] row, padded cache rows
    // and output rows wider than the heads.
    {5, 3, 12, 4, 2, 8, 64, 20, 37},
    // A GPT-2 prompt: MHA, q in a fused qkv row (3C), 70 new rows — past one launch's 64.
    {0, 70, 80, 2, 2, 4, 24, 8, 8},
    // One decoded token, MQA (one k/v head for six query heads).
    {9, 1, 16, 6, 1, 16, 96, 16, 96},
};

struct AttentionInputs {
  std::vector<float> q, keys, values;
};

AttentionInputs attention_inputs(const AttentionCase& c) {
  return {random_floats(static_cast<size_t>(c.rows * c.q_stride), 1.0f, 21),
          random_floats(static_cast<size_t>(c.max_positions * c.kv_stride), 1.0f, 22),
          random_floats(static_cast<size_t>(c.max_positions * c.kv_stride), 1.0f, 23)};
}

float attention_scale(const AttentionCase& c) { return 1.0f / std::sqrt(static_cast<float>(c.head_dim)); }

std::vector<float> run_attention(BackendEnv& env, const AttentionCase& c) {
  const AttentionInputs in = attention_inputs(c);
  const size_t out_count = static_cast<size_t>(c.rows * c.out_stride);
  float* out = env.upload(std::vector<float>(out_count, kStamp));
  const size_t scratch_bytes = env.backend().attention_decode_scratch_bytes(c.rows, c.n_head, c.max_positions);
  ops::AttentionDecode op;
  op.past = c.past;
  op.rows = c.rows;
  op.max_positions = c.max_positions;
  op.n_head = c.n_head;
  op.n_kv_head = c.n_kv_head;
  op.head_dim = c.head_dim;
  op.scale = attention_scale(c);
  op.q = env.upload(in.q);
  op.q_stride = c.q_stride;
  op.keys = env.upload(in.keys);
  op.values = env.upload(in.values);
  op.kv_stride = c.kv_stride;
  op.out = out;
  op.out_stride = c.out_stride;
  op.scratch = kernels::Workspace{env.zeros<float>(scratch_bytes / sizeof(float) + 1), scratch_bytes};
  EXPECT_TRUE(env.backend().attention_decode(op).ok());
  return env.download(out, out_count);
}

// ops.h's statement: new row r, query head h reads k/v head h / (n_head / n_kv_head) and
// attends to cache rows 0..past + r with softmax(scale·q·k).
std::vector<double> reference_attention(const AttentionCase& c) {
  const AttentionInputs in = attention_inputs(c);
  std::vector<double> out(static_cast<size_t>(c.rows * c.out_stride), 0.0);
  const int64_t d = c.head_dim;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t kv = h / (c.n_head / c.n_kv_head);
      const int64_t count = c.past + r + 1;
      std::vector<double> s(static_cast<size_t>(count));
      double max_s = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < d; ++e)
          dot += double(in.q[r * c.q_stride + h * d + e]) * in.keys[j * c.kv_stride + kv * d + e];
        s[j] = dot * attention_scale(c);
        max_s = std::max(max_s, s[j]);
      }
      double sum = 0.0;
      for (double& v : s) {
        v = std::exp(v - max_s);
        sum += v;
      }
      for (int64_t e = 0; e < d; ++e) {
        double acc = 0.0;
        for (int64_t j = 0; j < count; ++j) acc += s[j] / sum * in.values[j * c.kv_stride + kv * d + e];
        out[r * c.out_stride + h * d + e] = acc;
      }
    }
  }
  return out;
}

// --- matmul_bf16 ------------------------------------------------------------------------------

struct MatmulCase {
  bool w_out_major;
  int64_t rows, in, out;
  bool accumulate;
};
const MatmulCase kMatmulCases[] = {
    // Small matrices, both layouts, a decoded token (the CPU's GEMV) and a prompt (its pieces).
    {true, 1, 24, 40, false},
    {false, 1, 24, 40, false},
    {true, 5, 24, 40, true},
    {false, 5, 24, 40, true},
    // Wider than one piece: CUDA's output bands of kDecodeHeadPieceRows, then the rest.
    {true, 2, 8, 5000, false},
    {false, 2, 8, 5000, true},
    // Long and thin, in the tightest scratch: bands of two output columns on CUDA...
    {true, 5, 5000, 3, false},
    // ... and too thin for one output column: CUDA's bands along `in`, added in order.
    {true, 3, 5000, 1, false},
    {false, 3, 5000, 1, true},
};

std::string matmul_label(const MatmulCase& c) {
  return std::string(c.w_out_major ? "[out, in]" : "[in, out]") + " rows " + std::to_string(c.rows) + " in " +
         std::to_string(c.in) + " out " + std::to_string(c.out) + (c.accumulate ? " accumulate" : "");
}

struct MatmulInputs {
  std::vector<float> x, y;
  std::vector<uint16_t> w;
};

MatmulInputs matmul_inputs(const MatmulCase& c) {
  // y starts far from any product, so an output left unwritten (or added to when it should be
  // overwritten) cannot pass.
  return {random_floats(static_cast<size_t>(c.rows * c.in), 1.0f, 31),
          random_floats(static_cast<size_t>(c.rows * c.out), 1.0f, 32, 1000.0f),
          random_bf16(static_cast<size_t>(c.in * c.out), 33)};
}

std::vector<float> run_matmul(BackendEnv& env, const MatmulCase& c) {
  const MatmulInputs in = matmul_inputs(c);
  const size_t scratch_bytes = env.backend().matmul_bf16_scratch_bytes(c.in, c.out);
  ops::MatmulBf16 op;
  op.w_out_major = c.w_out_major;
  op.rows = c.rows;
  op.in = c.in;
  op.out = c.out;
  op.x = env.upload(in.x);
  op.w = env.upload(in.w);
  op.accumulate = c.accumulate;
  op.y = env.upload(in.y);
  op.scratch = kernels::Workspace{env.zeros<float>(scratch_bytes / sizeof(float) + 1), scratch_bytes};
  EXPECT_TRUE(env.backend().matmul_bf16(op).ok());
  return env.download(op.y, in.y.size());
}

std::vector<double> reference_matmul(const MatmulCase& c) {
  const MatmulInputs in = matmul_inputs(c);
  std::vector<double> y(in.y.size());
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t o = 0; o < c.out; ++o) {
      double acc = c.accumulate ? in.y[r * c.out + o] : 0.0;
      for (int64_t i = 0; i < c.in; ++i) {
        const uint16_t bits = c.w_out_major ? in.w[o * c.in + i] : in.w[i * c.out + o];
        acc += double(in.x[r * c.in + i]) * widen(bits);
      }
      y[r * c.out + o] = acc;
    }
  }
  return y;
}

// --- every backend against the reference ---------------------------------------------------

class DecodeOps : public ::testing::TestWithParam<device::Kind> {
 protected:
  // False (skip) only for cuda with no device or driver; any other CUDA error fails the test.
  bool kind_present() const {
    if (GetParam() != device::Kind::cuda) return true;
    Result<int> devices = device::cuda_device_count_or_error();
    EXPECT_TRUE(devices.ok()) << devices.error().to_string();
    return devices.ok() && *devices > 0;
  }
};

// A copy is exact, and the destination's stride padding stays as it was.
TEST_P(DecodeOps, CopyRowsCopiesExactlyTheRows) {
  if (!kind_present()) GTEST_SKIP() << "no CUDA device visible";
  auto env = BackendEnv::create(GetParam());
  ASSERT_NE(env, nullptr);
  for (const CopyCase& c : kCopyCases) {
    const std::vector<float> src = random_floats(static_cast<size_t>(c.rows * c.src_stride), 1.0f, 11);
    const std::vector<float> got = run_copy(*env, c);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t j = 0; j < c.dst_stride; ++j) {
        const float want = j < c.cols ? src[r * c.src_stride + j] : kStamp;
        ASSERT_EQ(got[r * c.dst_stride + j], want) << "row " << r << " column " << j << " of " << c.rows << "×"
                                                   << c.cols;
      }
    }
  }
}

// fp32 rounding of head_dim-long dot products, the softmax's exp and a sum over ≤ 80 positions:
// 1e-5 of the largest output, the block ops' tolerance. Columns past the heads stay stamped.
TEST_P(DecodeOps, AttentionDecodeMatchesTheReference) {
  if (!kind_present()) GTEST_SKIP() << "no CUDA device visible";
  auto env = BackendEnv::create(GetParam());
  ASSERT_NE(env, nullptr);
  for (const AttentionCase& c : kAttentionCases) {
    const std::vector<float> got = run_attention(*env, c);
    const std::vector<double> want = reference_attention(c);
    const int64_t width = c.n_head * c.head_dim;
    auto in_heads = [&](size_t i) { return static_cast<int64_t>(i) % c.out_stride < width; };
    const std::string label = "past " + std::to_string(c.past) + " rows " + std::to_string(c.rows);
    EXPECT_LE(relative_error(got, want, in_heads), 1e-5) << label;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!in_heads(i)) {
        ASSERT_EQ(got[i], kStamp) << label << ": a write past the heads at " << i;
      }
    }
  }
}

// fp32 summation of up to 5,000 products of exactly widened weights: 1e-5 of the largest output
// (the reference sums in double; accumulate adds y's 1000-offset start, which must be there).
TEST_P(DecodeOps, MatmulBf16MatchesTheReference) {
  if (!kind_present()) GTEST_SKIP() << "no CUDA device visible";
  auto env = BackendEnv::create(GetParam());
  ASSERT_NE(env, nullptr);
  for (const MatmulCase& c : kMatmulCases) {
    const std::vector<float> got = run_matmul(*env, c);
    const std::vector<double> want = reference_matmul(c);
    EXPECT_LE(relative_error(got, want, [](size_t) { return true; }), 1e-5) << matmul_label(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DecodeOps,
                         ::testing::Values(device::Kind::cpu, device::Kind::emulated, device::Kind::cuda),
                         [](const ::testing::TestParamInfo<device::Kind>& info) { return kind_label(info.param); });

// The emulated device runs the CPU loops on its own memory: the same bits as the cpu device.
TEST(DecodeOpsEmulated, MatchesTheCpuBitForBit) {
  auto cpu = BackendEnv::create(device::Kind::cpu);
  auto emulated = BackendEnv::create(device::Kind::emulated);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(emulated, nullptr);
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const CopyCase& c : kCopyCases) EXPECT_TRUE(same_bits(run_copy(*cpu, c), run_copy(*emulated, c)));
  for (const AttentionCase& c : kAttentionCases)
    EXPECT_TRUE(same_bits(run_attention(*cpu, c), run_attention(*emulated, c))) << "attention rows " << c.rows;
  for (const MatmulCase& c : kMatmulCases)
    EXPECT_TRUE(same_bits(run_matmul(*cpu, c), run_matmul(*emulated, c))) << matmul_label(c);
}

}  // namespace
}  // namespace strata::testing
