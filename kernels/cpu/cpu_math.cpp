// kernels/cpu/cpu_math.cpp — the shared CPU building blocks (cpu_math.h). Moved here whole from
// gpt2.cpp so Llama's kernels run the very same GEMM tiles and attention loops.
#include "kernels/cpu/cpu_math.h"

#include <algorithm>
#include <cmath>

#include <cblas.h>

#include "kernels/gpt2/gpt2_math.h"

namespace strata::kernels::cpu_math {

using gpt2::axpy;
using gpt2::softmax_scaled_inplace;

void pin_blas_to_one_thread() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

namespace {

// Output tiles of one sgemm call. OpenBLAS 0.3.21's own threading changes which partial
// products meet in which order with its thread count (measured: thousands of elements of a
// 256×384×128 product differ between 1 and 2 threads), so the kernels run OpenBLAS
// single-threaded and split every product into these fixed tiles across TBB tasks instead:
// each output element is computed by one call over the full K, the same way whatever the thread
// count. 256×512 tiles keep a single-threaded call at full speed (measured on a 2-core Haswell:
// tiled 46-48 GFLOP/s vs OpenBLAS's own 2 threads 47-50 GFLOP/s for 1024×2304×768).
constexpr int64_t kGemmTileM = 256;
constexpr int64_t kGemmTileN = 512;

// key_t[d, j] = k_j[d]: lets the score row be built by axpy over j (vectorizes without
// reassociating any sum).
void transpose_head(const float* src, int64_t row_stride, int64_t t_len, int64_t head_dim, float* dst) {
  for (int64_t j = 0; j < t_len; ++j) {
    for (int64_t d = 0; d < head_dim; ++d) dst[d * t_len + j] = src[j * row_stride + d];
  }
}

// p[0..i] = softmax over j ≤ i of scale·(q_i · k_j).
void causal_probabilities(const AttentionHead& s, const float* key_t, int64_t i, float scale, float* p) {
  const int64_t count = i + 1;
  std::fill(p, p + count, 0.0f);
  const float* q_row = s.q + i * s.q_stride;
  for (int64_t d = 0; d < s.head_dim; ++d) axpy(q_row[d], key_t + d * s.t_len, p, count);
  softmax_scaled_inplace(p, count, scale);
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t tiles_m = (m + kGemmTileM - 1) / kGemmTileM;
  const int64_t tiles_n = (n + kGemmTileN - 1) / kGemmTileN;
  for_rows(tiles_m * tiles_n, 1, [&](int64_t tile) {
    const int64_t m0 = tile / tiles_n * kGemmTileM;
    const int64_t n0 = tile % tiles_n * kGemmTileN;
    const int64_t rows = std::min(kGemmTileM, m - m0);
    const int64_t cols = std::min(kGemmTileN, n - n0);
    const float* a_tile = trans_a ? a + m0 : a + m0 * lda;  // op(A) rows m0..
    const float* b_tile = trans_b ? b + n0 * ldb : b + n0;  // op(B) columns n0..
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(rows), static_cast<blasint>(cols), static_cast<blasint>(k), 1.0f, a_tile,
                static_cast<blasint>(lda), b_tile, static_cast<blasint>(ldb), beta, c + m0 * ldc + n0,
                static_cast<blasint>(ldc));
  });
}

void column_sums_accumulate(const float* in, int64_t rows, int64_t cols, float* out) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, cols - c0);
    double acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = in + r * cols + c0;
      for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
    for (int64_t j = 0; j < width; ++j) out[c0 + j] += static_cast<float>(acc[j]);
  });
}

void attention_forward_head(const AttentionHead& s, float scale, float* key_t, float* p, float* out,
                            int64_t out_stride) {
  transpose_head(s.k, s.kv_stride, s.t_len, s.head_dim, key_t);
  for (int64_t i = 0; i < s.t_len; ++i) {
    causal_probabilities(s, key_t, i, scale, p);
    float* out_row = out + i * out_stride;
    std::fill(out_row, out_row + s.head_dim, 0.0f);
    for (int64_t j = 0; j <= i; ++j) axpy(p[j], s.v + j * s.kv_stride, out_row, s.head_dim);
  }
}

// dp_j = d_out_i · v_j;  ds_j = p_j (dp_j − Σ_j p_j dp_j)·scale
// dq_i = Σ_j ds_j k_j;   dk_j += ds_j q_i;   dv_j += p_j d_out_i
void attention_backward_head(const AttentionHead& s, float scale, const float* d_out, int64_t out_stride,
                             float* key_t, float* value_t, float* p, float* dp, float* dq, int64_t dq_stride, float* dk,
                             float* dv) {
  transpose_head(s.k, s.kv_stride, s.t_len, s.head_dim, key_t);
  transpose_head(s.v, s.kv_stride, s.t_len, s.head_dim, value_t);
  for (int64_t i = 0; i < s.t_len; ++i) {
    const int64_t count = i + 1;
    causal_probabilities(s, key_t, i, scale, p);
    const float* d_out_row = d_out + i * out_stride;
    std::fill(dp, dp + count, 0.0f);
    for (int64_t d = 0; d < s.head_dim; ++d) axpy(d_out_row[d], value_t + d * s.t_len, dp, count);
    double p_dot_dp = 0.0;
    for (int64_t j = 0; j < count; ++j) p_dot_dp += static_cast<double>(p[j]) * dp[j];
    const float mean_dp = static_cast<float>(p_dot_dp);
    float* dq_row = dq + i * dq_stride;
    std::fill(dq_row, dq_row + s.head_dim, 0.0f);
    const float* q_row = s.q + i * s.q_stride;
    for (int64_t j = 0; j < count; ++j) {
      const float dscore = p[j] * (dp[j] - mean_dp) * scale;
      axpy(dscore, s.k + j * s.kv_stride, dq_row, s.head_dim);
      axpy(dscore, q_row, dk + j * s.kv_stride, s.head_dim);
      axpy(p[j], d_out_row, dv + j * s.kv_stride, s.head_dim);
    }
  }
}

}  // namespace strata::kernels::cpu_math
