// tests/backend/test_ops.cpp — the op-parity suite of the operation-level seam (kernels/ops.h,
// kernels/backend.h "the operations"): every op runs, case by case, on each backend present —
// `cpu`, `emulated` (device memory, copies through its streams) and `cuda` when a device is
// visible — and EACH output tensor is held on its own against a reference written here in double
// precision with plain loops from ops.h's statement of the op (never strata's code):
// max|got − ref| / max|ref| within the tolerance stated with the case, or exact where the op is
// elementwise-exact. No packed comparison: a small tensor (a bias gradient, a statistic) is
// never hidden behind a large one. cpu and emulated must be bit-identical (the same loops on the
// same bits; only the memory differs), cuda must agree with cpu within each tensor's tolerance;
// the cpu backend gives the same bits on one thread as on every core. The ops that read the
// step's targets and packing must refuse out-of-range values on every backend.
// Without a CUDA device the cuda cases are skipped; the cpu and emulated ones still run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>

#include "kernels/backend.h"
#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "tests/backend/backend_harness.h"

namespace strata::testing {
namespace {

namespace ops = kernels::ops;
using Floats = std::vector<float>;
using Doubles = std::vector<double>;

// The step's shape: the harness's backends are made for small_shape() (CUDA's step buffers —
// tokens, targets, positions, segments — hold that many rows), so every case's step is 2 × 8.
constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 8;
constexpr int64_t kRows = kBatch * kSeq;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

size_t count(int64_t n) { return static_cast<size_t>(n); }
Doubles widen(const Floats& values) { return Doubles(values.begin(), values.end()); }

// --- Tolerances (max|got − ref| / max|ref| per tensor; 0 = the reference's fp32 rounding exactly) ---
// Elementwise-exact: a copy, one fp32 add or one fp32 product. The double result of two floats'
// sum or product rounds to the same float as fp32 arithmetic does, so any other bit is a bug.
constexpr double kExact = 0.0;
// A handful of fp32 roundings per element (2⁻²⁴ ≈ 6e-8 each) relative to the tensor's largest
// value: norms' y, RoPE's two products and a sum with fp32 cos/sin, GELU / SiLU through expf
// (op_math's tanh from one expf carries ~1e-7 absolute error near 0), cross-entropy's
// softmax from expf with a double sum, the embedding gradients' few fp32 adds of repeated rows.
constexpr double kFewRoundings = 1e-6;
// One double sum rounded to fp32 and added to an fp32 value: at most two roundings.
constexpr double kDoubleSum = 1e-6;
// Sums of up to ~60 fp32 products accumulated in fp32 (GEMM's K, attention's D-long dots and
// T-long weighted sums, LoRA's two chained products): the rounding error grows with the length
// and the terms' magnitude; CUDA may order them differently. ~1e-6 is typical here; 1e-5 is
// the bound test_gpt2_cuda holds GPT-2 on CUDA to.
constexpr double kFp32Sum = 1e-5;
// Statistics rounded to fp32 (LayerNorm's mean, rstd) and backward rows that subtract O(|g|)
// terms (norm dx, attention's dp − Σp·dp): a few roundings of the terms, relative to a result
// that cancellation may make smaller than them.
constexpr double kCancelling = 1e-5;
// GELU's derivative: tanh near ±1 carries an absolute error of ~1e-7 (fp32's spacing at 1, and
// op_math's one-expf tanh on top), which 1 + t and 1 − t² keep absolute and the derivative then
// multiplies by 0.5·x·√(2/π)·(1 + 3·0.044715·x²) — about 15 at |x| = 5. Measured on a 1e-5 grid
// over [−6, 6]: at most 2.0e-6 absolute (x ≈ −4.96; 5.6e-7 with tanhf), of a largest
// derivative ≈ 1.13, so ~1.8e-6 relative.
constexpr double kGeluDerivative = 3e-6;

// One output tensor of a case: what the backend gave and what the reference says.
struct Checked {
  std::string name;
  Floats got;
  Doubles want;
  double tolerance = 0.0;
  // RoPE's tables: a backend that computes the angles in its kernel (CUDA) leaves them
  // untouched (ops.h), so only a backend that runs the CPU's ops is held to them.
  bool cpu_backend_only = false;
};

// The step a case runs in (host memory that must outlive end_step, so the runner owns it) and
// what the case produced.
struct CaseRun {
  std::vector<int32_t> tokens = random_tokens(count(kRows), 5, 101);  // vocab 5: tokens repeat
  std::vector<int32_t> targets = random_tokens(count(kRows), 11, 102);
  std::vector<int32_t> positions, segments;
  int64_t loss_normalizer_tokens = 0;
  std::vector<Checked> tensors;
  bool has_loss = false;
  double want_loss = 0.0;
  double loss_tolerance = 0.0;
  double loss = 0.0;  // end_step's

  void pack() {
    const SmallPacking packing = small_packing();
    positions = packing.positions;
    segments = packing.segments;
  }
  void add(std::string name, Floats got, Doubles want, double tolerance, bool cpu_backend_only = false) {
    tensors.push_back({std::move(name), std::move(got), std::move(want), tolerance, cpu_backend_only});
  }
};

void expect_ok(const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); }

void begin(BackendEnv& env, const CaseRun& run) {
  kernels::StepBatch batch{run.tokens.data(), run.targets.data(), kRows};
  batch.positions = run.positions.empty() ? nullptr : run.positions.data();
  batch.segments = run.segments.empty() ? nullptr : run.segments.data();
  batch.loss_normalizer_tokens = run.loss_normalizer_tokens;
  expect_ok(env.backend().begin_step(batch));
}

struct OpCase {
  std::string name;  // the gtest parameter name
  std::string op;    // the op it proves, for the worst-error table
  std::function<void(BackendEnv&, CaseRun&)> body;
};

// max|got − want| / max|want| (max|want| == 0: the absolute difference); a non-finite value
// where the reference is finite is an infinite error (std::max would drop a NaN).
double relative_error(const Floats& got, const Doubles& want) {
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(diff)) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}
double relative_error(const Floats& got, const Floats& want) { return relative_error(got, widen(want)); }
// Elements that differ from the reference rounded to fp32 (a NaN differs; −0 equals +0: a
// "zero row" is numerically zero whichever sign a backend's arithmetic leaves).
size_t inexact_count(const Floats& got, const Doubles& want) {
  size_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) differing += !(got[i] == static_cast<float>(want[i]));
  return differing;
}

// The worst error seen per op (vs the reference on any backend; cuda vs cpu), printed at the end.
std::map<std::string, std::pair<double, std::string>>& worst_table() {
  static std::map<std::string, std::pair<double, std::string>> table;
  return table;
}
void note_worst(const std::string& op, double error, const std::string& where) {
  auto& entry = worst_table()[op];
  if (error >= entry.first) entry = {error, where};
}
class WorstErrors : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("worst relative error per op (any backend against the float64 reference):\n");
    for (const auto& [op, entry] : worst_table())
      std::printf("  %-34s %.3g  (%s)\n", op.c_str(), entry.first, entry.second.c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const kWorstErrors = ::testing::AddGlobalTestEnvironment(new WorstErrors);

// Each tensor against its reference, on backend `label`.
void check_against_reference(const OpCase& op_case, const CaseRun& run, const char* label, bool cpu_backend) {
  ASSERT_FALSE(run.tensors.empty()) << op_case.name;
  for (const Checked& t : run.tensors) {
    if (t.cpu_backend_only && !cpu_backend) continue;
    ASSERT_EQ(t.got.size(), t.want.size()) << op_case.name << ": " << t.name;
    const double error = relative_error(t.got, t.want);
    note_worst(op_case.op, error, op_case.name + "/" + t.name + " on " + label);
    std::printf("%-9s %-38s %-12s rel error %.3g (tolerance %.0e)\n", label, op_case.name.c_str(), t.name.c_str(),
                error, t.tolerance);
    if (t.tolerance == kExact) {
      EXPECT_EQ(inexact_count(t.got, t.want), 0u)
          << label << " " << op_case.name << ": " << t.name << " must be exact (rel error " << error << ")";
    } else {
      EXPECT_LE(error, t.tolerance) << label << " " << op_case.name << ": " << t.name;
    }
  }
  if (run.has_loss) {
    const double error = std::fabs(run.loss - run.want_loss) / std::max(std::fabs(run.want_loss), 1e-300);
    note_worst(op_case.op + " (step loss)", run.want_loss == 0.0 ? std::fabs(run.loss) : error,
               op_case.name + " on " + label);
    std::printf("%-9s %-38s %-12s %.9g vs %.9g\n", label, op_case.name.c_str(), "loss", run.loss, run.want_loss);
    if (run.want_loss == 0.0) {
      EXPECT_EQ(run.loss, 0.0) << label << " " << op_case.name << ": loss";
    } else {
      EXPECT_LE(error, run.loss_tolerance) << label << " " << op_case.name << ": loss";
    }
  }
}

CaseRun run_case(const OpCase& op_case, device::Kind kind) {
  CaseRun run;
  auto env = BackendEnv::create(kind);
  if (env == nullptr) {
    ADD_FAILURE() << "no " << device::kind_name(kind) << " backend";
    return run;
  }
  op_case.body(*env, run);
  auto scalars = env->backend().end_step();
  EXPECT_TRUE(scalars.ok()) << scalars.error().to_string();
  if (scalars.ok()) run.loss = scalars->loss;
  return run;
}

// --- GEMM: c = op(a)·op(b) + beta·c, row-major, leading dimensions wider than the rows ---
OpCase gemm_case(std::string name, bool trans_a, bool trans_b, float beta, int64_t m, int64_t n, int64_t k) {
  return {std::move(name), "gemm", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const int64_t a_cols = trans_a ? m : k, lda = a_cols + 3;
            const int64_t b_cols = trans_b ? k : n, ldb = b_cols + 5;
            const int64_t ldc = n + 2;
            const Floats a = random_floats(count((trans_a ? k : m) * lda), 1.0f, 201);
            const Floats b = random_floats(count((trans_b ? n : k) * ldb), 1.0f, 202);
            Floats c0 = random_floats(count(m * ldc), 1.0f, 203);
            if (beta == 0.0f)  // beta 0 never reads c: NaNs there must not reach the result
              for (int64_t i = 0; i < m; ++i) std::fill_n(c0.begin() + i * ldc, n, kNaN);
            Doubles want(count(m * n));
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double sum = 0.0;
                for (int64_t p = 0; p < k; ++p) {
                  const double a_ip = trans_a ? a[count(p * lda + i)] : a[count(i * lda + p)];
                  const double b_pj = trans_b ? b[count(j * ldb + p)] : b[count(p * ldb + j)];
                  sum += a_ip * b_pj;
                }
                want[count(i * n + j)] =
                    sum + (beta != 0.0f ? beta * static_cast<double>(c0[count(i * ldc + j)]) : 0.0);
              }
            float* c = env.upload(c0);
            expect_ok(env.backend().gemm(ops::Gemm{.trans_a = trans_a,
                                                   .trans_b = trans_b,
                                                   .m = m,
                                                   .n = n,
                                                   .k = k,
                                                   .a = env.upload(a),
                                                   .lda = lda,
                                                   .b = env.upload(b),
                                                   .ldb = ldb,
                                                   .beta = beta,
                                                   .c = c,
                                                   .ldc = ldc}));
            const Floats got = env.download(c, count(m * ldc));
            Floats block, padding, padding0;
            for (int64_t i = 0; i < m; ++i) {
              block.insert(block.end(), got.begin() + i * ldc, got.begin() + i * ldc + n);
              padding.insert(padding.end(), got.begin() + i * ldc + n, got.begin() + (i + 1) * ldc);
              padding0.insert(padding0.end(), c0.begin() + i * ldc + n, c0.begin() + (i + 1) * ldc);
            }
            run.add("c", block, want, kFp32Sum);
            run.add("c_padding", padding, widen(padding0), kExact);  // columns past n: never written
          }};
}

// --- rows_init: y = bias (+ residual), or y = residual; y may alias residual ---
OpCase rows_init_case(std::string name, bool with_bias, bool with_residual, bool in_place) {
  return {std::move(name), "rows_init", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            constexpr int64_t rows = 13, cols = 70;
            const Floats bias = random_floats(count(cols), 1.0f, 211);
            const Floats residual = random_floats(count(rows * cols), 1.0f, 212);
            const Floats y0 = random_floats(count(rows * cols), 1.0f, 213);  // overwritten
            Doubles want(count(rows * cols));
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < cols; ++j)
                want[count(r * cols + j)] = (with_bias ? static_cast<double>(bias[count(j)]) : 0.0) +
                                            (with_residual ? static_cast<double>(residual[count(r * cols + j)]) : 0.0);
            float* res = env.upload(residual);
            float* y = in_place ? res : env.upload(y0);
            expect_ok(env.backend().rows_init(ops::RowsInit{.y = y,
                                                            .bias = with_bias ? env.upload(bias) : nullptr,
                                                            .residual = with_residual ? res : nullptr,
                                                            .rows = rows,
                                                            .cols = cols}));
            run.add("y", env.download(y, count(rows * cols)), want, kExact);
          }};
}

OpCase add_bias_case() {
  return {
      "add_bias", "add_bias", [](BackendEnv& env, CaseRun& run) {
        begin(env, run);
        constexpr int64_t rows = 13, cols = 70;
        const Floats bias = random_floats(count(cols), 1.0f, 221);
        const Floats y0 = random_floats(count(rows * cols), 1.0f, 222);
        Doubles want(count(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < cols; ++j)
            want[count(r * cols + j)] = static_cast<double>(y0[count(r * cols + j)]) + bias[count(j)];
        float* y = env.upload(y0);
        expect_ok(env.backend().add_bias(ops::AddBias{.y = y, .bias = env.upload(bias), .rows = rows, .cols = cols}));
        run.add("y", env.download(y, count(rows * cols)), want, kExact);
      }};
}

OpCase column_sums_case() {
  return {"column_sums", "column_sums", [](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            constexpr int64_t rows = 300, cols = 37;  // cols: two full 16-column blocks and a part
            const Floats in = random_floats(count(rows * cols), 1.0f, 231);
            const Floats out0 = random_floats(count(cols), 1.0f, 232);  // accumulated into
            Doubles want = widen(out0);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < cols; ++j) want[count(j)] += in[count(r * cols + j)];
            float* out = env.upload(out0);
            expect_ok(env.backend().column_sums(
                ops::ColumnSums{.in = env.upload(in), .rows = rows, .cols = cols, .out = out}));
            run.add("out", env.download(out, count(cols)), want, kDoubleSum);
          }};
}

// --- norms ---
constexpr int64_t kNormRows = 13;
constexpr int64_t kNormWidth = 70;  // not a multiple of the CPU's 16-column blocks
constexpr double kNormEps = 1e-5;

// The row statistics in double: mean and 1/sqrt(biased variance + eps) (LayerNorm), or
// 1/sqrt(mean(x²) + eps) (RMSNorm), of `rows` rows `stride` apart.
struct RowStats {
  Doubles mean, rstd;
};
RowStats row_stats(ops::NormKind kind, const Floats& x, int64_t rows, int64_t width, int64_t stride) {
  RowStats stats{Doubles(count(rows)), Doubles(count(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * stride;
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t j = 0; j < width; ++j) sum += row[j];
    const double mean = kind == ops::NormKind::layer ? sum / static_cast<double>(width) : 0.0;
    for (int64_t j = 0; j < width; ++j) sum_sq += (row[j] - mean) * (row[j] - mean);
    stats.mean[count(r)] = mean;
    stats.rstd[count(r)] = 1.0 / std::sqrt(sum_sq / static_cast<double>(width) + kNormEps);
  }
  return stats;
}

OpCase norm_forward_case(std::string name, ops::NormKind kind, float weight_offset) {
  return {std::move(name), "norm_forward", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const bool layer = kind == ops::NormKind::layer;
            constexpr int64_t stride = kNormWidth + 6;  // rows picked from a wider tensor
            const Floats x = random_floats(count(kNormRows * stride), 1.0f, 241, 0.3f);
            // The gain is weight + offset: near 1 either way (Gemma stores w near 0 with offset 1).
            const Floats weight = random_floats(count(kNormWidth), 0.1f, 242, 1.0f - weight_offset);
            const Floats bias = random_floats(count(kNormWidth), 0.1f, 243);
            const RowStats stats = row_stats(kind, x, kNormRows, kNormWidth, stride);
            Doubles want_y(count(kNormRows * kNormWidth));
            for (int64_t r = 0; r < kNormRows; ++r)
              for (int64_t j = 0; j < kNormWidth; ++j) {
                const double xhat = (x[count(r * stride + j)] - stats.mean[count(r)]) * stats.rstd[count(r)];
                const double gain = static_cast<double>(weight[count(j)]) + weight_offset;
                want_y[count(r * kNormWidth + j)] = xhat * gain + (layer ? static_cast<double>(bias[count(j)]) : 0.0);
              }
            float* y = env.upload(Floats(count(kNormRows * kNormWidth), kNaN));
            float* mean = layer ? env.upload(Floats(count(kNormRows), kNaN)) : nullptr;
            float* rstd = env.upload(Floats(count(kNormRows), kNaN));
            expect_ok(env.backend().norm_forward(ops::NormForward{.kind = kind,
                                                                  .x = env.upload(x),
                                                                  .x_stride = stride,
                                                                  .weight = env.upload(weight),
                                                                  .bias = layer ? env.upload(bias) : nullptr,
                                                                  .weight_offset = weight_offset,
                                                                  .eps = kNormEps,
                                                                  .rows = kNormRows,
                                                                  .width = kNormWidth,
                                                                  .y = y,
                                                                  .mean = mean,
                                                                  .rstd = rstd}));
            run.add("y", env.download(y, count(kNormRows * kNormWidth)), want_y, kFewRoundings);
            if (layer) run.add("mean", env.download(mean, count(kNormRows)), stats.mean, kFewRoundings);
            run.add("rstd", env.download(rstd, count(kNormRows)), stats.rstd, kFewRoundings);
          }};
}

OpCase norm_backward_case(std::string name, ops::NormKind kind, float weight_offset, bool accumulate, bool frozen) {
  return {std::move(name), "norm_backward", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const bool layer = kind == ops::NormKind::layer;
            constexpr int64_t rows = kNormRows, c = kNormWidth;
            const Floats x = random_floats(count(rows * c), 1.0f, 251, 0.3f);
            const Floats weight = random_floats(count(c), 0.1f, 252, 1.0f - weight_offset);
            const Floats dy = random_floats(count(rows * c), 0.1f, 253);
            const Floats dx0 = accumulate ? random_floats(count(rows * c), 0.1f, 254) : Floats(count(rows * c), kNaN);
            const Floats d_weight0 = random_floats(count(c), 0.1f, 255);
            const Floats d_bias0 = random_floats(count(c), 0.1f, 256);
            // The forward's statistics as the op receives them: fp32 (the reference uses those bits).
            const RowStats exact = row_stats(kind, x, rows, c, c);
            Floats mean(count(rows)), rstd(count(rows));
            for (int64_t r = 0; r < rows; ++r) {
              mean[count(r)] = static_cast<float>(exact.mean[count(r)]);
              rstd[count(r)] = static_cast<float>(exact.rstd[count(r)]);
            }
            Doubles want_dx(count(rows * c)), want_dw = widen(d_weight0), want_db = widen(d_bias0);
            for (int64_t r = 0; r < rows; ++r) {
              const double mu = layer ? mean[count(r)] : 0.0;
              const double rs = rstd[count(r)];
              Doubles g(count(c)), xhat(count(c));
              double mean_g = 0.0, mean_g_xhat = 0.0;
              for (int64_t j = 0; j < c; ++j) {
                const size_t at = count(r * c + j);
                g[count(j)] = dy[at] * (static_cast<double>(weight[count(j)]) + weight_offset);
                xhat[count(j)] = (x[at] - mu) * rs;
                mean_g += g[count(j)] / static_cast<double>(c);
                mean_g_xhat += g[count(j)] * xhat[count(j)] / static_cast<double>(c);
                want_dw[count(j)] += dy[at] * xhat[count(j)];
                want_db[count(j)] += dy[at];
              }
              for (int64_t j = 0; j < c; ++j) {
                // LayerNorm: rstd·(g − mean(g) − x̂·mean(g·x̂)); RMSNorm: rstd·(g − x̂·mean(g·x̂)),
                // which is rstd·g − x·rstd³·mean(g·x).
                const double grad = rs * (g[count(j)] - (layer ? mean_g : 0.0) - xhat[count(j)] * mean_g_xhat);
                want_dx[count(r * c + j)] = (accumulate ? static_cast<double>(dx0[count(r * c + j)]) : 0.0) + grad;
              }
            }
            float* dx = env.upload(dx0);
            float* d_weight = frozen ? nullptr : env.upload(d_weight0);
            float* d_bias = frozen || !layer ? nullptr : env.upload(d_bias0);
            expect_ok(env.backend().norm_backward(ops::NormBackward{.kind = kind,
                                                                    .dy = env.upload(dy),
                                                                    .x = env.upload(x),
                                                                    .mean = layer ? env.upload(mean) : nullptr,
                                                                    .rstd = env.upload(rstd),
                                                                    .weight = env.upload(weight),
                                                                    .weight_offset = weight_offset,
                                                                    .rows = rows,
                                                                    .width = c,
                                                                    .dx = dx,
                                                                    .accumulate = accumulate,
                                                                    .d_weight = d_weight,
                                                                    .d_bias = d_bias}));
            run.add("dx", env.download(dx, count(rows * c)), want_dx, kCancelling);
            // d_weight: double sums over the rows of dy·x̂ with x̂ rounded to fp32; d_bias: of dy alone.
            if (d_weight != nullptr) run.add("d_weight", env.download(d_weight, count(c)), want_dw, kFewRoundings);
            if (d_bias != nullptr) run.add("d_bias", env.download(d_bias, count(c)), want_db, kDoubleSum);
          }};
}

// --- RoPE ---
// The inverse frequency of pair i from the spec: theta^(−2i/D), then Hugging Face's llama3
// rope_scaling (_compute_llama3_parameters): long wavelengths divided by factor, short ones
// kept, the band between interpolated.
double reference_inverse_frequency(const ops::RopeSpec& spec, int64_t i) {
  const double pi = std::acos(-1.0);
  const double inv = std::pow(spec.theta, -2.0 * static_cast<double>(i) / static_cast<double>(spec.head_dim));
  if (spec.factor <= 0.0) return inv;
  const double wavelength = 2.0 * pi / inv;
  const double low_freq_wavelength = spec.original_max_positions / spec.low_freq_factor;
  const double high_freq_wavelength = spec.original_max_positions / spec.high_freq_factor;
  if (wavelength < high_freq_wavelength) return inv;
  if (wavelength > low_freq_wavelength) return inv / spec.factor;
  const double smooth = (spec.original_max_positions / wavelength - spec.low_freq_factor) /
                        (spec.high_freq_factor - spec.low_freq_factor);
  return (1.0 - smooth) * inv / spec.factor + smooth * inv;
}

ops::RopeSpec rope_spec(bool llama3) {
  ops::RopeSpec spec;
  spec.head_dim = 8;
  if (llama3) {
    // With D = 8 and theta 5e5 the four pairs' wavelengths (6, 167, 4.4e3, 1.2e5) fall on both
    // sides of and inside [8192/4, 8192]: every branch of the scaling.
    spec.theta = 500000.0;
    spec.factor = 8.0;
    spec.low_freq_factor = 1.0;
    spec.high_freq_factor = 4.0;
    spec.original_max_positions = 8192.0;
  }
  return spec;
}

// ops.h: the tables are cos and sin [t_len, D/2] each. (ops::rope_table_floats says so too, but
// is declared without a definition in kernels/, so calling it does not link.)
int64_t rope_table_size(int64_t t_len, int64_t head_dim) { return t_len * (head_dim / 2); }

OpCase rope_tables_case(std::string name, bool llama3, int64_t first_position) {
  return {std::move(name), "rope_tables", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const ops::RopeSpec spec = rope_spec(llama3);
            const int64_t half = spec.head_dim / 2, n = rope_table_size(kSeq, spec.head_dim);
            Doubles want_cos(count(n)), want_sin(count(n));
            for (int64_t t = 0; t < kSeq; ++t)
              for (int64_t i = 0; i < half; ++i) {
                const double angle = static_cast<double>(first_position + t) * reference_inverse_frequency(spec, i);
                want_cos[count(t * half + i)] = std::cos(angle);
                want_sin[count(t * half + i)] = std::sin(angle);
              }
            float* cos = env.upload(Floats(count(n), kNaN));
            float* sin = env.upload(Floats(count(n), kNaN));
            expect_ok(env.backend().rope_tables(ops::RopeTables{
                .spec = spec, .first_position = first_position, .t_len = kSeq, .cos = cos, .sin = sin}));
            // cos and sin of a double angle, each rounded once to fp32 (the angle's last double bit
            // may differ from ours, so equality is not promised): one fp32 rounding of values ≤ 1.
            run.add("cos", env.download(cos, count(n)), want_cos, 2e-7, /*cpu_backend_only=*/true);
            run.add("sin", env.download(sin, count(n)), want_sin, 2e-7, /*cpu_backend_only=*/true);
          }};
}

// x [kRows, heads·D] rotated forward (checked), then by the inverse (must give x back).
OpCase rope_case(std::string name, bool llama3, int64_t first_position, bool packed, bool use_step_positions) {
  return {std::move(name), "rope", [=](BackendEnv& env, CaseRun& run) {
            if (packed) run.pack();
            begin(env, run);
            constexpr int64_t heads = 3;
            const ops::RopeSpec spec = rope_spec(llama3);
            const int64_t d = spec.head_dim, half = d / 2, width = heads * d;
            const Floats x0 = random_floats(count(kRows * width), 1.0f, 261);
            Doubles want(count(kRows * width));
            for (int64_t r = 0; r < kRows; ++r) {
              // ops.h: row r at first_position + r % seq_len, or the step's packed position.
              const int64_t position =
                  packed && use_step_positions ? run.positions[count(r)] : first_position + r % kSeq;
              for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < half; ++i) {
                  const double angle = static_cast<double>(position) * reference_inverse_frequency(spec, i);
                  const size_t lo = count(r * width + h * d + i), hi = lo + count(half);
                  want[lo] = x0[lo] * std::cos(angle) - x0[hi] * std::sin(angle);
                  want[hi] = x0[hi] * std::cos(angle) + x0[lo] * std::sin(angle);
                }
            }
            const int64_t n = rope_table_size(kSeq, d);
            float* cos = env.upload(Floats(count(n), kNaN));
            float* sin = env.upload(Floats(count(n), kNaN));
            expect_ok(env.backend().rope_tables(ops::RopeTables{
                .spec = spec, .first_position = first_position, .t_len = kSeq, .cos = cos, .sin = sin}));
            float* x = env.upload(x0);
            ops::Rope rope{.spec = spec,
                           .x = x,
                           .shape = {kBatch, kSeq},
                           .heads = heads,
                           .first_position = first_position,
                           .inverse = false,
                           .use_step_positions = use_step_positions,
                           .cos = cos,
                           .sin = sin};
            expect_ok(env.backend().rope(rope));
            // fp32 cos and sin, two products and a sum per element.
            run.add("rotated", env.download(x, count(kRows * width)), want, kFewRoundings);
            rope.inverse = true;
            expect_ok(env.backend().rope(rope));
            // The transpose undoes the rotation up to the two passes' roundings (|x| ≤ 1): ~1e-6.
            run.add("restored", env.download(x, count(kRows * width)), widen(x0), kFewRoundings);
          }};
}

// --- attention ---
struct AttentionLayout {
  int64_t n_head, n_kv_head, head_dim;
  bool fused_qkv;     // GPT-2's c_attn output: q, k, v side by side in one [rows, 3C] tensor
  int64_t pad;        // extra floats per row of separate q / k / v / out (stride > width)
  bool packed;        // the step carries small_packing's positions and segments
  bool use_segments;  // the op applies them
};

// The first key row token i of batch row b may see: the start of its example when the segments
// apply, else 0.
int64_t first_key(const std::vector<int32_t>& segments, bool use, int64_t b, int64_t i) {
  if (!use || segments.empty()) return 0;  // no segments in the step: one example per row
  int64_t first = i;
  while (first > 0 && segments[count(b * kSeq + first - 1)] == segments[count(b * kSeq + i)]) --first;
  return first;
}

OpCase attention_case(std::string name, AttentionLayout layout) {
  return {std::move(name), "attention_forward/backward", [=](BackendEnv& env, CaseRun& run) {
            if (layout.packed) run.pack();
            begin(env, run);
            const int64_t h_n = layout.n_head, kv_n = layout.n_kv_head, d = layout.head_dim;
            const int64_t group = h_n / kv_n;
            const int64_t c = h_n * d, kv_width = kv_n * d;
            // Strides and where q, k, v (and their gradients) start in their buffers.
            const int64_t q_stride = layout.fused_qkv ? 3 * c : c + layout.pad;
            const int64_t kv_stride = layout.fused_qkv ? 3 * c : kv_width + layout.pad;
            const int64_t out_stride = c + (layout.fused_qkv ? 0 : layout.pad);
            const int64_t k_offset = layout.fused_qkv ? c : 0, v_offset = layout.fused_qkv ? 2 * c : 0;
            const float scale = 1.0f / std::sqrt(static_cast<float>(d));
            const Floats q_host = random_floats(count(kRows * q_stride), 1.0f, 271);
            const Floats kv_host = layout.fused_qkv ? q_host : random_floats(count(kRows * kv_stride), 1.0f, 272);
            const Floats v_host = layout.fused_qkv ? q_host : random_floats(count(kRows * kv_stride), 1.0f, 273);
            const Floats d_out_host = random_floats(count(kRows * out_stride), 0.1f, 274);
            auto q_at = [&](int64_t row, int64_t h, int64_t j) {
              return static_cast<double>(q_host[count(row * q_stride + h * d + j)]);
            };
            auto k_at = [&](int64_t row, int64_t kv, int64_t j) {
              return static_cast<double>(kv_host[count(row * kv_stride + k_offset + kv * d + j)]);
            };
            auto v_at = [&](int64_t row, int64_t kv, int64_t j) {
              return static_cast<double>(v_host[count(row * kv_stride + v_offset + kv * d + j)]);
            };
            // Reference, per (batch, query head): softmax over the visible keys, the weighted sum of
            // values; backward dv += p·dout, dp = dout·v, ds = p·(dp − Σ p·dp), dq = scale·Σ ds·k,
            // dk += scale·ds·q (the group's query heads add into their k/v head).
            Doubles want_out(count(kRows * c)), want_dq(count(kRows * c));
            Doubles want_dk(count(kRows * kv_width), 0.0), want_dv(count(kRows * kv_width), 0.0);
            for (int64_t b = 0; b < kBatch; ++b)
              for (int64_t h = 0; h < h_n; ++h) {
                const int64_t kv = h / group;
                for (int64_t i = 0; i < kSeq; ++i) {
                  const int64_t row = b * kSeq + i;
                  const int64_t first = first_key(run.segments, layout.use_segments, b, i);
                  Doubles p(count(kSeq), 0.0), dp(count(kSeq), 0.0);
                  double max_score = -INFINITY, total = 0.0, p_dot_dp = 0.0;
                  for (int64_t jr = first; jr <= i; ++jr) {
                    double s = 0.0;
                    for (int64_t e = 0; e < d; ++e) s += q_at(row, h, e) * k_at(b * kSeq + jr, kv, e);
                    p[count(jr)] = s * scale;
                    max_score = std::max(max_score, p[count(jr)]);
                  }
                  for (int64_t jr = first; jr <= i; ++jr) total += (p[count(jr)] = std::exp(p[count(jr)] - max_score));
                  for (int64_t jr = first; jr <= i; ++jr) {
                    p[count(jr)] /= total;
                    for (int64_t e = 0; e < d; ++e) {
                      const double g = d_out_host[count(row * out_stride + h * d + e)];
                      want_out[count(row * c + h * d + e)] += p[count(jr)] * v_at(b * kSeq + jr, kv, e);
                      dp[count(jr)] += g * v_at(b * kSeq + jr, kv, e);
                      want_dv[count((b * kSeq + jr) * kv_width + kv * d + e)] += p[count(jr)] * g;
                    }
                    p_dot_dp += p[count(jr)] * dp[count(jr)];
                  }
                  for (int64_t jr = first; jr <= i; ++jr) {
                    const double ds = p[count(jr)] * (dp[count(jr)] - p_dot_dp);
                    for (int64_t e = 0; e < d; ++e) {
                      want_dq[count(row * c + h * d + e)] += scale * ds * k_at(b * kSeq + jr, kv, e);
                      want_dk[count((b * kSeq + jr) * kv_width + kv * d + e)] += scale * ds * q_at(row, h, e);
                    }
                  }
                }
              }
            const float* q = env.upload(q_host);
            const float* k = layout.fused_qkv ? q + k_offset : env.upload(kv_host);
            const float* v = layout.fused_qkv ? q + v_offset : env.upload(v_host);
            constexpr float kSentinel = 7.5f;  // out's columns past the heads must keep it
            float* out = env.upload(Floats(count(kRows * out_stride), kSentinel));
            const kernels::BatchShape shape{kBatch, kSeq};
            const size_t scratch_bytes = env.backend().attention_scratch_bytes(shape, h_n, d);
            EXPECT_EQ(scratch_bytes, kernels::attention_scratch_bytes(env.device().kind(), shape, h_n, d));
            float* scratch = env.zeros<float>(scratch_bytes / sizeof(float) + 1);
            const ops::Attention forward{.shape = shape,
                                         .n_head = h_n,
                                         .n_kv_head = kv_n,
                                         .head_dim = d,
                                         .scale = scale,
                                         .q = q,
                                         .q_stride = q_stride,
                                         .k = k,
                                         .v = v,
                                         .kv_stride = kv_stride,
                                         .out = out,
                                         .out_stride = out_stride,
                                         .use_step_segments = layout.use_segments,
                                         .scratch = {scratch, scratch_bytes}};
            expect_ok(env.backend().attention_forward(forward));
            // Gradients OVERWRITTEN: NaN beforehand (in the fused layout dq, dk, dv share one
            // [rows, 3C] buffer, so each must write only its own columns).
            float* dq = env.upload(Floats(count(kRows * q_stride), kNaN));
            float* dk = layout.fused_qkv ? dq + k_offset : env.upload(Floats(count(kRows * kv_stride), kNaN));
            float* dv = layout.fused_qkv ? dq + v_offset : env.upload(Floats(count(kRows * kv_stride), kNaN));
            expect_ok(env.backend().attention_backward(ops::AttentionBackward{
                .forward = forward, .d_out = env.upload(d_out_host), .dq = dq, .dk = dk, .dv = dv}));
            const Floats out_all = env.download(out, count(kRows * out_stride));
            const Floats dq_all = env.download(dq, count(kRows * q_stride));
            const Floats dk_all = layout.fused_qkv ? dq_all : env.download(dk, count(kRows * kv_stride));
            const Floats dv_all = layout.fused_qkv ? dq_all : env.download(dv, count(kRows * kv_stride));
            Floats got_out, got_gap, got_dq, got_dk, got_dv;
            for (int64_t row = 0; row < kRows; ++row) {
              const auto at = [](const Floats& all, int64_t begin_at, int64_t n) {
                return Floats(all.begin() + begin_at, all.begin() + begin_at + n);
              };
              const Floats o = at(out_all, row * out_stride, c),
                           gap = at(out_all, row * out_stride + c, out_stride - c);
              const Floats g_q = at(dq_all, row * q_stride, c);
              const Floats g_k = at(dk_all, row * kv_stride + k_offset, kv_width);
              const Floats g_v = at(dv_all, row * kv_stride + v_offset, kv_width);
              got_out.insert(got_out.end(), o.begin(), o.end());
              got_gap.insert(got_gap.end(), gap.begin(), gap.end());
              got_dq.insert(got_dq.end(), g_q.begin(), g_q.end());
              got_dk.insert(got_dk.end(), g_k.begin(), g_k.end());
              got_dv.insert(got_dv.end(), g_v.begin(), g_v.end());
            }
            run.add("out", got_out, want_out, kFp32Sum);
            if (!got_gap.empty()) run.add("out_gap", got_gap, Doubles(got_gap.size(), kSentinel), kExact);
            run.add("dq", got_dq, want_dq, kCancelling);
            run.add("dk", got_dk, want_dk, kCancelling);
            run.add("dv", got_dv, want_dv, kFp32Sum);
          }};
}

// --- activations ---
constexpr int64_t kElements = 3001;  // three of the CPU's 1024-element chunks and a part

double gelu_reference(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}
double gelu_derivative_reference(double x) {
  const double pi = std::acos(-1.0);
  const double c = std::sqrt(2.0 / pi);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
double sigmoid_reference(double x) { return 1.0 / (1.0 + std::exp(-x)); }

OpCase gelu_case() {
  return {"gelu", "gelu_forward/backward", [](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const Floats pre = random_floats(count(kElements), 6.0f, 281);  // into both tails
            const Floats d0 = random_floats(count(kElements), 1.0f, 282);
            Doubles want_out(count(kElements)), want_d(count(kElements));
            for (size_t i = 0; i < pre.size(); ++i) {
              want_out[i] = gelu_reference(pre[i]);
              want_d[i] = d0[i] * gelu_derivative_reference(pre[i]);
            }
            const float* in = env.upload(pre);
            float* out = env.upload(Floats(count(kElements), kNaN));
            float* d = env.upload(d0);
            expect_ok(env.backend().gelu_forward(ops::Gelu{.in = in, .out = out, .n = kElements}));
            expect_ok(env.backend().gelu_backward(ops::GeluBackward{.d = d, .pre = in, .n = kElements}));
            run.add("out", env.download(out, count(kElements)), want_out, kFewRoundings);
            run.add("d", env.download(d, count(kElements)), want_d, kGeluDerivative);
          }};
}

OpCase gated_case(std::string name, ops::GateKind kind) {
  return {std::move(name), "gated_forward/backward", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            const Floats gate0 = random_floats(count(kElements), 6.0f, 291);
            const Floats up0 = random_floats(count(kElements), 2.0f, 292);
            const Floats d_act = random_floats(count(kElements), 1.0f, 293);
            Doubles want_act(count(kElements)), want_d_gate(count(kElements)), want_d_up(count(kElements));
            for (size_t i = 0; i < gate0.size(); ++i) {
              const double x = gate0[i], u = up0[i], da = d_act[i];
              if (kind == ops::GateKind::silu) {
                const double s = sigmoid_reference(x);
                want_act[i] = x * s * u;
                want_d_gate[i] = da * u * s * (1.0 + x * (1.0 - s));  // d(x·σ(x))/dx
                want_d_up[i] = da * x * s;
              } else {
                want_act[i] = gelu_reference(x) * u;
                want_d_gate[i] = da * u * gelu_derivative_reference(x);
                want_d_up[i] = da * gelu_reference(x);
              }
            }
            float* gate = env.upload(gate0);
            float* up = env.upload(up0);
            float* act = env.upload(Floats(count(kElements), kNaN));
            expect_ok(env.backend().gated_forward(
                ops::Gated{.kind = kind, .gate = gate, .up = up, .act = act, .n = kElements}));
            run.add("act", env.download(act, count(kElements)), want_act, kFewRoundings);
            expect_ok(env.backend().gated_backward(
                ops::GatedBackward{.kind = kind, .d_act = env.upload(d_act), .gate = gate, .up = up, .n = kElements}));
            run.add("d_gate", env.download(gate, count(kElements)), want_d_gate,
                    kind == ops::GateKind::gelu_tanh ? kGeluDerivative : kFewRoundings);
            run.add("d_up", env.download(up, count(kElements)), want_d_up, kFewRoundings);
          }};
}

// --- embedding (the step's tokens: vocabulary 5 over 16 rows, so tokens repeat) ---
OpCase embedding_case(std::string name, bool learned_positions, bool packed, bool scaled, bool use_step_positions) {
  return {std::move(name), "embedding_lookup/_backward", [=](BackendEnv& env, CaseRun& run) {
            if (packed) run.pack();
            begin(env, run);
            constexpr int64_t c = 24, vocab = 5;
            // Gemma's normaliser: √C rounded to fp32 first.
            const float scale = scaled ? static_cast<float>(std::sqrt(static_cast<double>(c))) : 1.0f;
            const Floats table = random_floats(count(vocab * c), 1.0f, 301);
            const Floats positions = random_floats(count(kSeq * c), 1.0f, 302);
            const Floats d_x = random_floats(count(kRows * c), 1.0f, 303);
            const Floats d_table0 = random_floats(count(vocab * c), 1.0f, 304);  // accumulated into
            const Floats d_positions0 = random_floats(count(kSeq * c), 1.0f, 305);
            Doubles want_x(count(kRows * c)), want_d_table = widen(d_table0), want_d_positions = widen(d_positions0);
            for (int64_t r = 0; r < kRows; ++r) {
              const int64_t token = run.tokens[count(r)];
              const int64_t position = packed && use_step_positions ? run.positions[count(r)] : r % kSeq;
              for (int64_t j = 0; j < c; ++j) {
                const size_t at = count(r * c + j);
                want_x[at] = static_cast<double>(scale) * table[count(token * c + j)] +
                             (learned_positions ? static_cast<double>(positions[count(position * c + j)]) : 0.0);
                want_d_table[count(token * c + j)] += static_cast<double>(scale) * d_x[at];
                want_d_positions[count(position * c + j)] += d_x[at];
              }
            }
            const ops::Embedding forward{.shape = {kBatch, kSeq},
                                         .width = c,
                                         .vocab = vocab,
                                         .table = env.upload(table),
                                         .positions = learned_positions ? env.upload(positions) : nullptr,
                                         .use_step_positions = use_step_positions,
                                         .scale = scale,
                                         .x = env.upload(Floats(count(kRows * c), kNaN))};
            expect_ok(env.backend().embedding_lookup(forward));
            run.add("x", env.download(forward.x, count(kRows * c)), want_x, kExact);
            float* d_table = env.upload(d_table0);
            float* d_positions = learned_positions ? env.upload(d_positions0) : nullptr;
            expect_ok(env.backend().embedding_lookup_backward(ops::EmbeddingBackward{
                .forward = forward, .d_x = env.upload(d_x), .d_table = d_table, .d_positions = d_positions}));
            // Repeated tokens (and the batch's rows of one position) add in fp32, a few adds each.
            run.add("d_table", env.download(d_table, count(vocab * c)), want_d_table, kFewRoundings);
            if (learned_positions)
              run.add("d_positions", env.download(d_positions, count(kSeq * c)), want_d_positions, kFewRoundings);
          }};
}

// --- cross-entropy: the step's targets (vocabulary 11), in chunks of rows ---
enum class Masks { none, some, all };
OpCase cross_entropy_case(std::string name, Masks masks, int64_t normalizer, bool gradient, int64_t split_row) {
  return {
      std::move(name), "cross_entropy", [=](BackendEnv& env, CaseRun& run) {
        constexpr int64_t vocab = 11;
        for (int64_t r = 0; r < kRows; ++r) {  // any negative target is a mask
          if (masks == Masks::all || (masks == Masks::some && r % 3 == 0)) run.targets[count(r)] = -1;
          if (masks == Masks::some && r == 5) run.targets[count(r)] = -7;
        }
        run.loss_normalizer_tokens = normalizer;
        begin(env, run);
        int64_t n = normalizer;  // StepBatch: 0 means the batch's own count of trained targets
        if (n == 0)
          for (const int32_t t : run.targets) n += t >= 0;
        const Floats logits0 = random_floats(count(kRows * vocab), 3.0f, 311);
        Doubles want(count(kRows * vocab), 0.0);
        double loss_sum = 0.0;
        std::vector<bool> masked_row(count(kRows));
        for (int64_t r = 0; r < kRows; ++r) {
          const int32_t target = run.targets[count(r)];
          masked_row[count(r)] = target < 0;
          const float* row = logits0.data() + r * vocab;
          if (target < 0) continue;  // no loss, a zero gradient row
          const double max_logit = *std::max_element(row, row + vocab);
          double total = 0.0;
          for (int64_t j = 0; j < vocab; ++j) total += std::exp(row[j] - max_logit);
          loss_sum += max_logit + std::log(total) - row[target];
          for (int64_t j = 0; j < vocab; ++j)
            want[count(r * vocab + j)] =
                (std::exp(row[j] - max_logit) / total - (j == target ? 1.0 : 0.0)) / static_cast<double>(n);
        }
        float* logits = env.upload(logits0);
        float* row_loss = env.zeros<float>(count(kRows));
        for (const auto& [first, rows] : {std::pair<int64_t, int64_t>{0, split_row}, {split_row, kRows - split_row}})
          if (rows > 0)
            expect_ok(env.backend().cross_entropy(ops::CrossEntropy{.logits = logits + first * vocab,
                                                                    .rows = rows,
                                                                    .vocab = vocab,
                                                                    .first_row = first,
                                                                    .gradient = gradient,
                                                                    .row_loss = row_loss}));
        const Floats got = env.download(logits, count(kRows * vocab));
        if (gradient) {
          // The softmax from expf over a double sum, one division by N: a few roundings.
          run.add("d_logits", got, want, kFewRoundings);
          Floats masked_got;
          for (int64_t r = 0; r < kRows; ++r)
            if (masked_row[count(r)])
              masked_got.insert(masked_got.end(), got.begin() + r * vocab, got.begin() + (r + 1) * vocab);
          if (!masked_got.empty()) run.add("masked_rows", masked_got, Doubles(masked_got.size(), 0.0), kExact);
        } else {
          run.add("logits_untouched", got, widen(logits0), kExact);  // no gradient: nothing written
        }
        run.has_loss = true;
        run.want_loss = n > 0 ? loss_sum / static_cast<double>(n) : 0.0;
        // Each row's loss rounded to fp32 from a double log-sum-exp, summed in double, the
        // mean rounded to fp32.
        run.loss_tolerance = kFewRoundings;
      }};
}

// --- LoRA: y += scale·drop(x)·Aᵀ·Bᵀ and its backward in two halves (lora.h) ---
// The dropout mask as lora.h states it: SplitMix64 (written here from its published constants),
// row hash splitmix64(splitmix64(splitmix64(key) + target) + row), element kept when the top 24
// bits of splitmix64(row_hash + col) are at least ceil(p·2²⁴).
uint64_t splitmix64_reference(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
bool keep_reference(uint64_t key, int target, int64_t row, int64_t col, float dropout) {
  const uint64_t row_hash = splitmix64_reference(
      splitmix64_reference(splitmix64_reference(key) + static_cast<uint64_t>(target)) + static_cast<uint64_t>(row));
  const auto threshold = static_cast<uint64_t>(std::ceil(static_cast<double>(dropout) * 16777216.0));
  return (splitmix64_reference(row_hash + static_cast<uint64_t>(col)) >> 40) >= threshold;
}

enum class LoraAdapters { targeted, null_adapters, other_target };
OpCase lora_case(std::string name, float dropout, LoraAdapters which) {
  return {std::move(name), "lora_forward/backward_params/backward_input", [=](BackendEnv& env, CaseRun& run) {
            begin(env, run);
            constexpr int64_t rows = 13, in = 24, out = 20, rank = 4;
            constexpr int target = 2, slot = 1;  // a non-zero du slot
            constexpr uint64_t kMaskKey = 0x5eed1234ull;
            constexpr int64_t kMaskFirstRow = 5;
            const float scale = 2.0f;  // α/r
            const Floats x = random_floats(count(rows * in), 1.0f, 321);
            const Floats a = random_floats(count(rank * in), 0.5f, 322);
            const Floats b = random_floats(count(out * rank), 0.5f, 323);
            const Floats dy = random_floats(count(rows * out), 0.5f, 324);
            const Floats y0 = random_floats(count(rows * out), 1.0f, 325);
            const Floats dx0 = random_floats(count(rows * in), 1.0f, 326);
            const Floats d_a0 = random_floats(count(rank * in), 0.1f, 327);
            const Floats d_b0 = random_floats(count(out * rank), 0.1f, 328);
            const bool active = which == LoraAdapters::targeted;
            // drop(x): kept elements times 1/(1 − p) (that factor in fp32), dropped ones 0.
            const double inverse_keep = dropout > 0.0f ? static_cast<double>(1.0f / (1.0f - dropout)) : 1.0;
            Doubles dropped(count(rows * in)), keep_factor(count(rows * in));
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < in; ++j) {
                const bool keep = dropout == 0.0f || keep_reference(kMaskKey, target, kMaskFirstRow + r, j, dropout);
                keep_factor[count(r * in + j)] = keep ? inverse_keep : 0.0;
                dropped[count(r * in + j)] = x[count(r * in + j)] * keep_factor[count(r * in + j)];
              }
            Doubles u(count(rows * rank), 0.0), du(count(rows * rank), 0.0);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t q = 0; q < rank; ++q)
                for (int64_t j = 0; j < in; ++j)
                  u[count(r * rank + q)] += dropped[count(r * in + j)] * a[count(q * in + j)];
            Doubles want_y = widen(y0), want_d_b = widen(d_b0), want_d_a = widen(d_a0), want_dx = widen(dx0);
            if (active) {
              for (int64_t r = 0; r < rows; ++r)
                for (int64_t o = 0; o < out; ++o)
                  for (int64_t q = 0; q < rank; ++q) {
                    want_y[count(r * out + o)] += scale * u[count(r * rank + q)] * b[count(o * rank + q)];
                    want_d_b[count(o * rank + q)] += scale * dy[count(r * out + o)] * u[count(r * rank + q)];
                    du[count(r * rank + q)] += scale * dy[count(r * out + o)] * b[count(o * rank + q)];
                  }
              for (int64_t r = 0; r < rows; ++r)
                for (int64_t q = 0; q < rank; ++q)
                  for (int64_t j = 0; j < in; ++j) {
                    want_d_a[count(q * in + j)] += du[count(r * rank + q)] * dropped[count(r * in + j)];
                    want_dx[count(r * in + j)] +=
                        du[count(r * rank + q)] * a[count(q * in + j)] * keep_factor[count(r * in + j)];
                  }
            }
            float* d_a = env.upload(d_a0);
            float* d_b = env.upload(d_b0);
            const size_t scratch_bytes = kernels::lora::scratch_size_bytes(rows, in, out, rank, dropout);
            kernels::lora::BlockAdapters adapters;
            adapters.spec = {.rank = rank, .scale = scale, .dropout = dropout, .mask_first_row = kMaskFirstRow};
            adapters.mask_key = kMaskKey;
            const int slot_target = which == LoraAdapters::other_target ? target + 1 : target;
            adapters.adapters[count(slot_target)] = {env.upload(a), env.upload(b)};
            adapters.grads[count(slot_target)] = {d_a, d_b};
            adapters.scratch = {env.zeros<float>(scratch_bytes / sizeof(float) + 1), scratch_bytes};
            const kernels::lora::BlockAdapters* passed = which == LoraAdapters::null_adapters ? nullptr : &adapters;
            const float* x_dev = env.upload(x);
            float* y = env.upload(y0);
            float* dx = env.upload(dx0);
            expect_ok(env.backend().lora_forward(passed, target, x_dev, rows, in, out, y));
            expect_ok(env.backend().lora_backward_params(passed, target, x_dev, rows, in, out, env.upload(dy), slot));
            expect_ok(env.backend().lora_backward_input(passed, target, rows, in, dx, slot));
            // Two chained fp32 products (K = in, then rank), scale on the [rows, rank] factor.
            const double tolerance = active ? kFp32Sum : kExact;  // nothing targeted: nothing touched
            run.add("y", env.download(y, count(rows * out)), want_y, tolerance);
            run.add("d_a", env.download(d_a, count(rank * in)), want_d_a, tolerance);
            run.add("d_b", env.download(d_b, count(out * rank)), want_d_b, tolerance);
            run.add("dx", env.download(dx, count(rows * in)), want_dx, tolerance);
          }};
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  // GEMM: all four transpose combinations, beta 0 and 1, non-square, lda/ldb/ldc past the width;
  // then a product wider than the CPU's 256×512 output tiles.
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true})
      for (const float beta : {0.0f, 1.0f})
        cases.push_back(gemm_case(
            std::string("gemm_") + (trans_a ? "t" : "n") + (trans_b ? "t" : "n") + (beta == 0.0f ? "_beta0" : "_beta1"),
            trans_a, trans_b, beta, 37, 29, 53));
  cases.push_back(gemm_case("gemm_nn_beta1_past_tiles", false, false, 1.0f, 300, 530, 24));
  cases.push_back(gemm_case("gemm_tt_beta0_past_tiles", true, true, 0.0f, 260, 515, 19));
  cases.push_back(rows_init_case("rows_init_bias_residual", true, true, false));
  cases.push_back(rows_init_case("rows_init_bias_only", true, false, false));
  cases.push_back(rows_init_case("rows_init_residual_only", false, true, false));
  cases.push_back(rows_init_case("rows_init_in_place", true, true, true));
  cases.push_back(rows_init_case("rows_init_in_place_no_bias", false, true, true));
  cases.push_back(add_bias_case());
  cases.push_back(column_sums_case());
  cases.push_back(norm_forward_case("norm_layer_forward_strided", ops::NormKind::layer, 0.0f));
  cases.push_back(norm_forward_case("norm_rms_forward_strided", ops::NormKind::rms, 0.0f));
  cases.push_back(norm_forward_case("norm_rms_forward_offset1_strided", ops::NormKind::rms, 1.0f));
  cases.push_back(norm_backward_case("norm_layer_backward", ops::NormKind::layer, 0.0f, false, false));
  cases.push_back(norm_backward_case("norm_layer_backward_accumulate", ops::NormKind::layer, 0.0f, true, false));
  cases.push_back(norm_backward_case("norm_layer_backward_frozen", ops::NormKind::layer, 0.0f, false, true));
  cases.push_back(norm_backward_case("norm_rms_backward", ops::NormKind::rms, 0.0f, false, false));
  cases.push_back(norm_backward_case("norm_rms_backward_offset1_accumulate", ops::NormKind::rms, 1.0f, true, false));
  cases.push_back(norm_backward_case("norm_rms_backward_offset1_frozen", ops::NormKind::rms, 1.0f, true, true));
  cases.push_back(rope_tables_case("rope_tables", false, 0));
  cases.push_back(rope_tables_case("rope_tables_llama3_from5", true, 5));
  cases.push_back(rope_case("rope_forward_inverse", false, 0, false, false));
  cases.push_back(rope_case("rope_llama3_from3", true, 3, false, false));
  cases.push_back(rope_case("rope_packed_positions", false, 0, true, true));
  cases.push_back(rope_case("rope_packed_step_unused", false, 0, true, false));            // row order in a packed step
  cases.push_back(rope_case("rope_step_positions_unpacked_step", false, 0, false, true));  // none: row order
  cases.push_back(attention_case("attention_mha_strided", {4, 4, 8, false, 3, false, false}));
  cases.push_back(attention_case("attention_gqa_strided", {6, 2, 8, false, 2, false, false}));
  cases.push_back(attention_case("attention_gpt2_fused_qkv", {4, 4, 8, true, 0, false, false}));
  cases.push_back(attention_case("attention_gqa_packed_segments", {4, 2, 8, false, 0, true, true}));
  cases.push_back(attention_case("attention_packed_step_unused", {4, 2, 8, false, 0, true, false}));
  // use_step_segments on a step without segments: one example per row.
  cases.push_back(attention_case("attention_segments_unpacked_step", {4, 2, 8, false, 0, false, true}));
  cases.push_back(gelu_case());
  cases.push_back(gated_case("gated_silu", ops::GateKind::silu));
  cases.push_back(gated_case("gated_gelu_tanh", ops::GateKind::gelu_tanh));
  cases.push_back(embedding_case("embedding_learned_positions", true, false, false, false));
  cases.push_back(embedding_case("embedding_packed_positions", true, true, false, true));
  cases.push_back(embedding_case("embedding_packed_step_unused", true, true, false, false));
  cases.push_back(embedding_case("embedding_step_positions_unpacked_step", true, false, false, true));
  cases.push_back(embedding_case("embedding_scaled_sqrt_c", false, false, true, false));
  cases.push_back(embedding_case("embedding_plain", false, false, false, false));
  cases.push_back(cross_entropy_case("cross_entropy_masked_two_chunks", Masks::some, 0, true, 6));
  cases.push_back(cross_entropy_case("cross_entropy_normalizer_two_chunks", Masks::some, 40, true, 9));
  cases.push_back(cross_entropy_case("cross_entropy_no_gradient_two_chunks", Masks::some, 0, false, 6));
  cases.push_back(cross_entropy_case("cross_entropy_unmasked_one_chunk", Masks::none, 0, true, kRows));
  cases.push_back(cross_entropy_case("cross_entropy_all_masked", Masks::all, 0, true, 6));
  cases.push_back(lora_case("lora", 0.0f, LoraAdapters::targeted));
  cases.push_back(lora_case("lora_dropout", 0.25f, LoraAdapters::targeted));
  cases.push_back(lora_case("lora_null_adapters", 0.0f, LoraAdapters::null_adapters));
  cases.push_back(lora_case("lora_other_target", 0.0f, LoraAdapters::other_target));
  return cases;
}

// Every tensor (and the step's loss) of `got` the bits of `want`'s.
void expect_bit_identical(const std::string& case_name, const CaseRun& got, const CaseRun& want, const char* what) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << case_name;
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const Floats& a = got.tensors[i].got;
    const Floats& b = want.tensors[i].got;
    ASSERT_EQ(a.size(), b.size()) << case_name << ": " << want.tensors[i].name;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), b.size() * sizeof(float)), 0)
        << case_name << ": " << want.tensors[i].name << " differs (" << what << ")";
  }
  EXPECT_EQ(std::memcmp(&got.loss, &want.loss, sizeof(double)), 0) << case_name << ": loss (" << what << ")";
}

// Whether the cuda cases run: a visible device. An error other than "no GPU / no driver" fails.
bool cuda_visible() {
  Result<int> devices = device::cuda_device_count_or_error();
  EXPECT_TRUE(devices.ok()) << devices.error().to_string();
  return devices.ok() && *devices > 0;
}

// gtest prints a parameter of a failed test: the case's name, not its bytes.
void PrintTo(const OpCase& op_case, std::ostream* os) { *os << op_case.name; }

class Ops : public ::testing::TestWithParam<OpCase> {};

TEST_P(Ops, CpuMatchesReference) {
  const CaseRun cpu = run_case(GetParam(), device::Kind::cpu);
  check_against_reference(GetParam(), cpu, "cpu", true);
}

// The emulated device runs the CPU's loops on device memory it copies in and out through its
// streams: its results must be the cpu device's bits, and both the reference's within tolerance.
TEST_P(Ops, EmulatedBitIdenticalToCpu) {
  const CaseRun cpu = run_case(GetParam(), device::Kind::cpu);
  const CaseRun emulated = run_case(GetParam(), device::Kind::emulated);
  check_against_reference(GetParam(), emulated, "emulated", true);
  expect_bit_identical(GetParam().name, emulated, cpu, "emulated vs cpu");
}

// ops.h: every op gives the same bits whatever its thread count. The cpu backend with TBB held
// to one thread must give the bits it gives with every core (on a one-core machine this proves
// only run-to-run determinism).
TEST_P(Ops, CpuSameBitsOnOneThread) {
  const CaseRun every_core = run_case(GetParam(), device::Kind::cpu);
  CaseRun one_thread;
  {
    const tbb::global_control single(tbb::global_control::max_allowed_parallelism, 1);
    one_thread = run_case(GetParam(), device::Kind::cpu);
  }
  expect_bit_identical(GetParam().name, one_thread, every_core, "one thread vs every core");
}

// CUDA: the reference's tolerance against the float64 reference, and the same bound against the
// cpu backend's result (the two differ only by fp32 rounding order).
TEST_P(Ops, CudaMatchesCpuAndReference) {
  if (!cuda_visible()) GTEST_SKIP() << "no CUDA device visible";
  const CaseRun cpu = run_case(GetParam(), device::Kind::cpu);
  const CaseRun cuda = run_case(GetParam(), device::Kind::cuda);
  check_against_reference(GetParam(), cuda, "cuda", false);
  ASSERT_EQ(cuda.tensors.size(), cpu.tensors.size());
  for (size_t i = 0; i < cpu.tensors.size(); ++i) {
    const Checked& want = cpu.tensors[i];
    if (want.cpu_backend_only) continue;
    const double error = relative_error(cuda.tensors[i].got, want.got);
    note_worst(GetParam().op + " (cuda vs cpu)", error, GetParam().name + "/" + want.name);
    if (want.tolerance == kExact) {
      EXPECT_EQ(std::memcmp(cuda.tensors[i].got.data(), want.got.data(), want.got.size() * sizeof(float)), 0)
          << GetParam().name << ": " << want.name << " must be exact on cuda";
    } else {
      EXPECT_LE(error, want.tolerance) << GetParam().name << ": " << want.name << " cuda vs cpu";
    }
  }
  if (cpu.has_loss) {
    EXPECT_LE(std::fabs(cuda.loss - cpu.loss), kFewRoundings * std::max(std::fabs(cpu.loss), 1e-30))
        << GetParam().name << ": loss cuda vs cpu";
  }
}

// The backends present: cpu and emulated always, cuda when a device is visible.
std::vector<device::Kind> present_kinds() {
  std::vector<device::Kind> kinds = {device::Kind::cpu, device::Kind::emulated};
  if (cuda_visible()) kinds.push_back(device::Kind::cuda);
  return kinds;
}

// backend.h: the ops that read the step's targets or packing refuse values a kernel would index
// past its tables by — invalid_argument before any kernel runs — on every backend. A target at
// the vocabulary's size in the chunk's rows (a chunk that ends before it passes); a packed
// position at seq_len; a segment id smaller than the one before it in its row.
TEST(OpsRefuse, OutOfRangeStepValues) {
  for (const device::Kind kind : present_kinds()) {
    SCOPED_TRACE(device::kind_name(kind));
    auto env = BackendEnv::create(kind);
    ASSERT_NE(env, nullptr);
    kernels::ComputeBackend& b = env->backend();
    constexpr int64_t vocab = 11, c = 8;
    auto expect_invalid = [](const Status& status, const char* what) {
      ASSERT_FALSE(status.ok()) << what << " accepted";
      EXPECT_EQ(status.error().kind, ErrorKind::invalid_argument) << what << ": " << status.to_string();
    };
    {
      CaseRun run;
      run.targets[count(kRows - 1)] = static_cast<int32_t>(vocab);
      begin(*env, run);
      float* logits = env->upload(random_floats(count(kRows * vocab), 1.0f, 331));
      float* row_loss = env->zeros<float>(count(kRows));
      const ops::CrossEntropy head{
          .logits = logits, .rows = 6, .vocab = vocab, .first_row = 0, .gradient = true, .row_loss = row_loss};
      expect_ok(b.cross_entropy(head));  // rows 0..5: the bad target is not among them
      ops::CrossEntropy tail = head;
      tail.logits = logits + 6 * vocab;
      tail.rows = kRows - 6;
      tail.first_row = 6;
      expect_invalid(b.cross_entropy(tail), "a target at the vocabulary size");
      (void)b.end_step();
    }
    {
      CaseRun run;
      run.pack();
      run.positions[3] = static_cast<int32_t>(kSeq);
      begin(*env, run);
      const ops::Embedding embedding{.shape = {kBatch, kSeq},
                                     .width = c,
                                     .vocab = 5,
                                     .table = env->upload(random_floats(count(5 * c), 1.0f, 332)),
                                     .positions = env->upload(random_floats(count(kSeq * c), 1.0f, 333)),
                                     .use_step_positions = true,
                                     .x = env->zeros<float>(count(kRows * c))};
      expect_invalid(b.embedding_lookup(embedding), "packed position seq_len (embedding)");
      const ops::RopeSpec spec = rope_spec(false);
      const int64_t n = rope_table_size(kSeq, spec.head_dim);
      const ops::Rope rope{.spec = spec,
                           .x = env->zeros<float>(count(kRows * spec.head_dim)),
                           .shape = {kBatch, kSeq},
                           .heads = 1,
                           .use_step_positions = true,
                           .cos = env->zeros<float>(count(n)),
                           .sin = env->zeros<float>(count(n))};
      expect_invalid(b.rope(rope), "packed position seq_len (rope)");
      (void)b.end_step();
    }
    {
      CaseRun run;
      run.pack();
      run.segments[count(kSeq + 4)] = 0;  // row 1 runs 1, 4, 4, 4, then 0
      begin(*env, run);
      const kernels::BatchShape shape{kBatch, kSeq};
      const size_t scratch_bytes = b.attention_scratch_bytes(shape, 2, 4);
      const float* qkv = env->upload(random_floats(count(kRows * 8), 1.0f, 334));
      const ops::Attention attention{.shape = shape,
                                     .n_head = 2,
                                     .n_kv_head = 2,
                                     .head_dim = 4,
                                     .scale = 0.5f,
                                     .q = qkv,
                                     .q_stride = 8,
                                     .k = qkv,
                                     .v = qkv,
                                     .kv_stride = 8,
                                     .out = env->zeros<float>(count(kRows * 8)),
                                     .out_stride = 8,
                                     .use_step_segments = true,
                                     .scratch = {env->zeros<float>(scratch_bytes / sizeof(float) + 1), scratch_bytes}};
      expect_invalid(b.attention_forward(attention), "a decreasing segment id");
      (void)b.end_step();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Each, Ops, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

}  // namespace
}  // namespace strata::testing
