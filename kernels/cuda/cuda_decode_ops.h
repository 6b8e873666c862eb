// strata/kernels/cuda/cuda_decode_ops.h — the CUDA backend's decoding operations (ops.h,
// "decoding with a KV cache"): copy_rows, attention_decode and matmul_bf16, and the scratch the
// last two need. cuda_backend.cpp's overrides call these; the kernels are cuda_decode_ops.cu's.
//
// Contract
// - Every pointer in an op is device memory on the current device. Each call enqueues its work on
//   the given stream (matmul_bf16: the Context's) and returns without synchronizing: the buffers,
//   the scratch included, stay alive until that stream reaches the work; the op struct only for
//   the call.
// - Errors: a failed copy, launch or cuBLAS call comes back as a Status (the device is gone or
//   out of resources). Bad shapes and a scratch shorter than the sizes below are programmer
//   errors and assert.
// - Determinism: no atomics; every sum runs in a fixed order (attention's max and sum in fixed
//   block trees, its output in position order; products are cuBLAS sgemm in pedantic fp32), so
//   the same inputs give the same bits run after run on one GPU model.
// - Threads: as the Context (cublas_context.h) — one host thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/cuda/cublas_context.h"
#include "kernels/ops.h"

namespace strata::kernels::cuda {

// attention_decode's scratch for up to max_rows new rows: the scores of at most
// kDecodeScoreRows (cuda_common.cuh) rows at a time, [rows, n_head, max_positions] floats, so a
// long prompt's attention grows the scratch linearly with max_positions, never with its square.
size_t attention_decode_scratch_bytes(int64_t max_rows, int64_t n_head, int64_t max_positions);
// matmul_bf16's scratch for every W with in ≤ max_in and out ≤ max_out: one widened piece of at
// most kDecodeHeadPieceRows (backend.h) slices along the longer side of W, each as long as its
// shorter side (a 128k-vocabulary head: 4096 rows of C at a time).
size_t matmul_bf16_scratch_bytes(int64_t max_in, int64_t max_out);

// cudaMemcpy2DAsync device to device (one plain copy when the rows are back to back).
[[nodiscard]] Status copy_rows(const ops::CopyRows& op, cudaStream_t stream);
// One thread block per (new row, query head): the per-model decode kernel it replaced (multi-head is its
// group-1 case) over op's strides and k/v heads, launched kDecodeScoreRows rows at a time.
[[nodiscard]] Status attention_decode(const ops::AttentionDecode& op, cudaStream_t stream);
// Widens bounded pieces of W (bf16 bits << 16, exact) into op.scratch and runs the fp32 GEMM on
// each. Pieces are bands of output columns whenever one fits, so each y element is one sgemm's
// dot product over all of `in`, as with W widened whole; only when not even one output column's
// `in` weights fit (a very skinny W) are they bands along `in`, added into y in order.
[[nodiscard]] Status matmul_bf16(const kernels::cuda::Context& ctx, const ops::MatmulBf16& op);

}  // namespace strata::kernels::cuda
