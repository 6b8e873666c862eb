// strata/kernels/cpu/cpu_math.h — the CPU building blocks every CPU op shares: the fixed-tile
// GEMM, column sums, row loops and one causal attention head. Internal to kernels/ (the CPU
// backend's ops, the LoRA op) and the reference kernels of tests/reference; callers use
// backend.h.
//
// Contract
// - Determinism: everything here gives the same bits whatever the TBB thread count. The GEMM
//   runs OpenBLAS single-threaded on fixed 256×512 output tiles (one call over the full K per
//   element: OpenBLAS 0.3.21's own threading is not thread-count invariant — measured,
//   thousands of elements of a 256×384×128 product differ between 1 and 2 threads); column
//   sums run one column block per task over the rows in order; attention heads reduce inside
//   one task.
// - pin_blas_to_one_thread() must have run on the calling thread before any of it (every CPU
//   op's entry calls it first).
// - Pointers are row-major fp32 host memory owned by the caller (bf16 weights: their 16-bit
//   patterns as uint16_t); nothing allocates.
#pragma once

#include <cstdint>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

namespace strata::kernels::cpu_math {

// Rows per TBB task for row-wise work; big enough to amortize scheduling, small enough to
// balance two cores on short batches.
inline constexpr int64_t kRowGrain = 8;
// Columns per task for column sums: 16 floats = one cache line, so tasks never share a line.
inline constexpr int64_t kColumnBlock = 16;

template <typename Body>
void for_rows(int64_t count, int64_t grain, const Body& body) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, grain), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t i = range.begin(); i != range.end(); ++i) body(i);
  });
}

// OpenBLAS single-threaded (process-wide; strata does no other BLAS work).
void pin_blas_to_one_thread();

// C[M,N] = op(A)·op(B) + beta·C, all row-major, tiled over TBB in fixed tiles.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);

// --- Products on bf16 weights (generation: decode on the store's bf16 compute copy) ---
// y[rows, out] = x[rows, in] · W (accumulate: y += …) for W given as bf16 bit patterns, stored
// [in, out] (a Conv1D: y = x·W) or, with `w_out_major`, [out, in] (nn.Linear and a head:
// y = x·Wᵀ). The point is the memory traffic: W's bf16 bytes are read once and never written
// back widened. With AVX2+FMA and rows ≤ kBf16GemvRows (a decoded token) it is a GEMV that widens
// eight weights at a time in registers; otherwise (a prompt's rows, or no AVX2) each of
// kBf16Lanes fixed lanes widens kBf16PieceK × kBf16PieceN pieces into its part of `pieces`
// (kBf16PiecesFloats floats: small enough to stay in L2) and adds each piece's product with one
// single-threaded cblas_sgemm (beta 1). Both are thread-count invariant (fixed column blocks /
// fixed lanes, each output element summed by one task in a fixed order); they differ from
// widening W whole and calling sgemm only in fp32 summation order. `pieces` may be null when
// rows ≤ kBf16GemvRows and the CPU has AVX2 (bf16_matmul_needs_pieces says).
inline constexpr int64_t kBf16GemvRows = 4;
inline constexpr int64_t kBf16PieceK = 64;
inline constexpr int64_t kBf16PieceN = 512;
inline constexpr int64_t kBf16Lanes = 8;
inline constexpr int64_t kBf16PiecesFloats = kBf16Lanes * kBf16PieceK * kBf16PieceN;  // 1 MiB
void matmul_bf16(bool w_out_major, int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w,
                 bool accumulate, float* y, float* pieces);
// matmul_bf16's pieces path alone, for any rows and any CPU (what it runs without AVX2; tests
// and bench/bf16_decode_timing.cpp call it to compare).
void matmul_bf16_pieces(bool w_out_major, int64_t rows, int64_t in, int64_t out, const float* x, const uint16_t* w,
                        bool accumulate, float* y, float* pieces);
// bf16 → fp32, exact (the bits shifted up); small spans, on the calling thread.
void widen_bf16(const uint16_t* src, int64_t count, float* dst);

// out[j] += Σ_r in[r, j] over all rows in row order, summed in double.
void column_sums_accumulate(const float* in, int64_t rows, int64_t cols, float* out);

// One (batch, head) of causal attention: row i of q, k, v at q + i·q_stride (etc.), head_dim
// floats each. Grouped-query attention points several query heads at one k/v head. `segments`
// (this batch row's t_len example ids, non-decreasing; ops.h PackedRows) makes it block-diagonal:
// row i attends to keys first..i, first the start of i's run of equal ids. Null: first = 0, the
// same loops and bits as before packing existed (the test is once per query row, not per key).
struct AttentionHead {
  int64_t t_len = 0;
  int64_t head_dim = 0;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_stride = 0;
  const int32_t* segments = nullptr;
};

// out row i (at out + i·out_stride) = Σ_{first≤j≤i} softmax_j(scale·q_i·k_j) v_j. Scratch: key_t
// [head_dim, t_len], p [t_len].
void attention_forward_head(const AttentionHead& s, float scale, float* key_t, float* p, float* out,
                            int64_t out_stride);

// Gradients of one head from d_out (rows at d_out + i·out_stride): dq rows (dq_stride)
// OVERWRITTEN; dk, dv rows (kv_stride, like k and v) ACCUMULATED, so the query heads of one
// k/v group add up in the order the caller runs them (the caller zeroes them first).
// Recomputes each probability row from q and k; no [T, T] matrix is kept. Scratch: key_t and
// value_t [head_dim, t_len], p and dp [t_len].
void attention_backward_head(const AttentionHead& s, float scale, const float* d_out, int64_t out_stride,
                             float* key_t, float* value_t, float* p, float* dp, float* dq, int64_t dq_stride, float* dk,
                             float* dv);

}  // namespace strata::kernels::cpu_math
