// kernels/cpu/cpu_math.cpp — the shared CPU building blocks (cpu_math.h): one copy, so every
// op and every reference kernel runs the very same GEMM tiles and attention loops.
#include "kernels/cpu/cpu_math.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <span>

#include <cblas.h>
#include <immintrin.h>

#include "kernels/cpu/cpu_rows.h"
#include "kernels/optim/cast.h"

// The bf16 GEMV's loops: compiled for AVX2+FMA whatever the baseline flags, and run only where
// detect_cpu_isa() found them (kernels/optim/cast.h).
#define STRATA_AVX2 __attribute__((target("avx2,fma")))

namespace strata::kernels::cpu_math {

using cpu_rows::axpy;
using cpu_rows::softmax_scaled_inplace;

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
// p[0..i−first] = softmax over keys first..i of scale·q_i·k_j.
void causal_probabilities(const AttentionHead& s, const float* key_t, int64_t first, int64_t i, float scale,
                          float* p) {
  const int64_t count = i - first + 1;
  std::fill(p, p + count, 0.0f);
  const float* q_row = s.q + i * s.q_stride;
  for (int64_t d = 0; d < s.head_dim; ++d) axpy(q_row[d], key_t + d * s.t_len + first, p, count);
  softmax_scaled_inplace(p, count, scale);
}

// The first key query row i may see: 0 unpacked, else the start of i's example. Called for
// i = 0, 1, … in order with the previous answer.
inline int64_t first_key(const AttentionHead& s, int64_t i, int64_t previous_first) {
  if (s.segments == nullptr || i == 0 || s.segments[i] == s.segments[i - 1]) return previous_first;
  assert(s.segments[i] > s.segments[i - 1]);
  return i;
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

// ---------------------------------------------------------------------------------------------
// Products on bf16 weights
// ---------------------------------------------------------------------------------------------

namespace {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

STRATA_AVX2 inline __m256 load_bf16x8(const uint16_t* src) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

STRATA_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// W [in, out]: one task owns 64 output columns (eight accumulators, one row of x at a time)
// and walks all of K down its column strip, so each y element is one sum in k order.
constexpr int64_t kGemvColumns = 64;

STRATA_AVX2 void gemv_in_out_block(int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w,
                                   bool accumulate, float* y, int64_t j0) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x_row = x + r * in;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t k = 0; k < in; ++k) {
      const __m256 xk = _mm256_set1_ps(x_row[k]);
      const uint16_t* wk = w + k * out + j0;
      a0 = _mm256_fmadd_ps(xk, load_bf16x8(wk), a0);
      a1 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 8), a1);
      a2 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 16), a2);
      a3 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 24), a3);
      a4 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 32), a4);
      a5 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 40), a5);
      a6 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 48), a6);
      a7 = _mm256_fmadd_ps(xk, load_bf16x8(wk + 56), a7);
    }
    float* y_row = y + r * out + j0;
    const __m256 sums[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int v = 0; v < 8; ++v) {
      const __m256 total = accumulate ? _mm256_add_ps(_mm256_loadu_ps(y_row + 8 * v), sums[v]) : sums[v];
      _mm256_storeu_ps(y_row + 8 * v, total);
    }
  }
}

// The last out % 64 columns, one element at a time (the same k order).
void gemv_in_out_tail(int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w, bool accumulate,
                      float* y, int64_t j0) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = j0; j < out; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < in; ++k) sum += x[r * in + k] * bf16_to_float(w[k * out + j]);
      y[r * out + j] = accumulate ? y[r * out + j] + sum : sum;
    }
  }
}

// W [out, in]: output rows o0..o1, each a dot product of W's contiguous row with each of the R
// rows of x; V vectors of eight per step (independent accumulators to cover the FMA latency;
// fewer when R rows need their own).
template <int R, int V>
STRATA_AVX2 void gemv_out_in_rows(int64_t in, int64_t out, const float* x, const uint16_t* w, bool accumulate,
                                  float* y, int64_t o0, int64_t o1) {
  constexpr int64_t kStep = 8 * V;
  for (int64_t o = o0; o < o1; ++o) {
    const uint16_t* w_row = w + o * in;
    __m256 acc[R][V];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + kStep <= in; k += kStep) {
      __m256 wv[V];
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) wv[v] = load_bf16x8(w_row + k + 8 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v)
          acc[r][v] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * in + k + 8 * v), wv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      __m256 total = acc[r][0];
#pragma GCC unroll 16
      for (int v = 1; v < V; ++v) total = _mm256_add_ps(total, acc[r][v]);
      float sum = horizontal_sum(total);
      for (int64_t kk = k; kk < in; ++kk) sum += x[r * in + kk] * bf16_to_float(w_row[kk]);
      float* y_at = y + r * out + o;
      *y_at = accumulate ? *y_at + sum : sum;
    }
  }
}

template <int R>
void gemv_out_in(int64_t in, int64_t out, const float* x, const uint16_t* w, bool accumulate, float* y) {
  // 32 output rows per task: a 50k-row head is ~1,600 tasks, a 768-row projection 24.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, out, 32), [&](const tbb::blocked_range<int64_t>& range) {
    gemv_out_in_rows<R, (R <= 2 ? 4 : 2)>(in, out, x, w, accumulate, y, range.begin(), range.end());
  });
}

bool have_avx2() {
  static const bool avx2 = detect_cpu_isa() == CpuIsa::avx2;
  return avx2;
}

}  // namespace

void widen_bf16(const uint16_t* src, int64_t count, float* dst) {
  kernels::cast_bf16_to_fp32(std::span<const uint16_t>(src, static_cast<size_t>(count)),
                             std::span<float>(dst, static_cast<size_t>(count)));
}

// Widened pieces and one single-threaded sgemm each: lane l takes column tiles l, l + lanes, …
// and, for each, the K range in kBf16PieceK steps into its own kBf16PieceK × kBf16PieceN piece.
void matmul_bf16_pieces(bool w_out_major, int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w,
                        bool accumulate, float* y, float* pieces) {
  const int64_t tiles = (out + kBf16PieceN - 1) / kBf16PieceN;
  const int64_t lanes = std::min(kBf16Lanes, tiles);
  for_rows(lanes, 1, [&](int64_t lane) {
    float* piece = pieces + lane * kBf16PieceK * kBf16PieceN;
    for (int64_t tile = lane; tile < tiles; tile += lanes) {
      const int64_t n0 = tile * kBf16PieceN;
      const int64_t cols = std::min(kBf16PieceN, out - n0);
      for (int64_t k0 = 0; k0 < in; k0 += kBf16PieceK) {
        const int64_t depth = std::min(kBf16PieceK, in - k0);
        const float beta = k0 == 0 && !accumulate ? 0.0f : 1.0f;
        if (w_out_major) {  // piece [cols, depth] = W[n0.., k0..]; y += x[:, k0..] · pieceᵀ
          for (int64_t j = 0; j < cols; ++j) widen_bf16(w + (n0 + j) * in + k0, depth, piece + j * depth);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(cols),
                      static_cast<blasint>(depth), 1.0f, x + k0, static_cast<blasint>(in), piece,
                      static_cast<blasint>(depth), beta, y + n0, static_cast<blasint>(out));
        } else {  // piece [depth, cols] = W[k0.., n0..]; y += x[:, k0..] · piece
          for (int64_t kk = 0; kk < depth; ++kk) widen_bf16(w + (k0 + kk) * out + n0, cols, piece + kk * cols);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows),
                      static_cast<blasint>(cols), static_cast<blasint>(depth), 1.0f, x + k0, static_cast<blasint>(in),
                      piece, static_cast<blasint>(cols), beta, y + n0, static_cast<blasint>(out));
        }
      }
    }
  });
}

void matmul_bf16(bool w_out_major, int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w,
                 bool accumulate, float* y, float* pieces) {
  assert(rows > 0 && in > 0 && out > 0);
  if (rows <= kBf16GemvRows && have_avx2()) {
    if (w_out_major) {
      switch (rows) {
        case 1: gemv_out_in<1>(in, out, x, w, accumulate, y); break;
        case 2: gemv_out_in<2>(in, out, x, w, accumulate, y); break;
        case 3: gemv_out_in<3>(in, out, x, w, accumulate, y); break;
        default: gemv_out_in<4>(in, out, x, w, accumulate, y); break;
      }
    } else {
      const int64_t blocks = out / kGemvColumns;
      for_rows(blocks, 1, [&](int64_t block) {
        gemv_in_out_block(rows, in, out, x, w, accumulate, y, block * kGemvColumns);
      });
      if (blocks * kGemvColumns < out) gemv_in_out_tail(rows, in, out, x, w, accumulate, y, blocks * kGemvColumns);
    }
    return;
  }
  assert(pieces != nullptr);
  matmul_bf16_pieces(w_out_major, rows, in, out, x, w, accumulate, y, pieces);
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
  int64_t first = 0;
  for (int64_t i = 0; i < s.t_len; ++i) {
    first = first_key(s, i, first);
    causal_probabilities(s, key_t, first, i, scale, p);
    float* out_row = out + i * out_stride;
    std::fill(out_row, out_row + s.head_dim, 0.0f);
    for (int64_t j = first; j <= i; ++j) axpy(p[j - first], s.v + j * s.kv_stride, out_row, s.head_dim);
  }
}

// dp_j = d_out_i · v_j;  ds_j = p_j (dp_j − Σ_j p_j dp_j)·scale
// dq_i = Σ_j ds_j k_j;   dk_j += ds_j q_i;   dv_j += p_j d_out_i
void attention_backward_head(const AttentionHead& s, float scale, const float* d_out, int64_t out_stride,
                             float* key_t, float* value_t, float* p, float* dp, float* dq, int64_t dq_stride, float* dk,
                             float* dv) {
  transpose_head(s.k, s.kv_stride, s.t_len, s.head_dim, key_t);
  transpose_head(s.v, s.kv_stride, s.t_len, s.head_dim, value_t);
  int64_t first = 0;
  for (int64_t i = 0; i < s.t_len; ++i) {
    first = first_key(s, i, first);
    const int64_t count = i - first + 1;  // p[j] and dp[j] belong to key first + j
    causal_probabilities(s, key_t, first, i, scale, p);
    const float* d_out_row = d_out + i * out_stride;
    std::fill(dp, dp + count, 0.0f);
    for (int64_t d = 0; d < s.head_dim; ++d) axpy(d_out_row[d], value_t + d * s.t_len + first, dp, count);
    double p_dot_dp = 0.0;
    for (int64_t j = 0; j < count; ++j) p_dot_dp += static_cast<double>(p[j]) * dp[j];
    const float mean_dp = static_cast<float>(p_dot_dp);
    float* dq_row = dq + i * dq_stride;
    std::fill(dq_row, dq_row + s.head_dim, 0.0f);
    const float* q_row = s.q + i * s.q_stride;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t key = first + j;
      const float dscore = p[j] * (dp[j] - mean_dp) * scale;
      axpy(dscore, s.k + key * s.kv_stride, dq_row, s.head_dim);
      axpy(dscore, q_row, dk + key * s.kv_stride, s.head_dim);
      axpy(p[j], d_out_row, dv + key * s.kv_stride, s.head_dim);
    }
  }
}

}  // namespace strata::kernels::cpu_math
