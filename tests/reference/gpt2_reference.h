// strata/tests/reference/gpt2_reference.h — GPT-2 forward and backward on the CPU, one block at
// a time: the per-model kernels the composed definition (models/gpt2.cpp) is held to bit for
// bit (tests/backend/test_compose_gpt2*.cpp) and that tests/gpt2 checks against PyTorch. Test
// code only: nothing outside tests/ includes it. The shape (Config, tensors, names, the pointer
// structs) is models/gpt2_shape.h's; this header brings its names into strata::reference::gpt2.
//
// Contract
// - Math: models/gpt2_shape.h's; loss = the cross-entropy over the trained rows divided by N
//   (kernels/ops.h, count_trained_targets).
// - Ownership: the caller owns every buffer — weights, activations, gradients and the
//   workspace. No entry point allocates; each takes a Workspace the caller allocates once
//   (workspace_size_bytes says how big for the largest batch shape it will use; 64-byte
//   alignment). Nothing is retained between calls except what a doc comment names
//   (block_forward leaves the block's activations in the workspace, see block_backward).
// - Gradients are ACCUMULATED (+=) into the caller's gradient tensors (d_wte, d_wpe, the
//   block grads, d_ln_f) so micro-batches add up; the caller zeroes them at the start of a
//   step. Activation gradients (d_in, d_x_final) are OVERWRITTEN. A null gradient pointer is a
//   frozen tensor: its gradient (and the product that forms it) is skipped, nothing else
//   changes — so a block_backward with a default BlockGrads{} (a frozen base under LoRA) or a
//   head with a default HeadGrads{} computes d_in / d_x_final alone, bit for bit the full
//   backward's, for about two thirds of its products.
// - LoRA: block_forward / block_backward take an optional `lora::BlockAdapters`
//   (kernels/lora/lora.h) for models::gpt2::lora_target's linears: each targeted linear adds
//   scale · drop(x)·Aᵀ·Bᵀ, and the backward adds the adapters' share of d_in and accumulates
//   their d_A / d_B. Null (the default): exactly the bits without the argument.
// - Threads: every entry point runs on the calling thread and fans out internally to TBB:
//   matrix products as fixed 256×512 output tiles (one single-threaded cblas_sgemm each),
//   LayerNorm and softmax per row, attention per (batch, head), GELU in chunks. Cap the
//   threads with tbb::global_control or a tbb::task_arena around the call. Calls on disjoint
//   buffers and workspaces may run concurrently; two calls sharing a workspace must not.
// - OpenBLAS: the kernels need it single-threaded (the tiles must not fan out again inside
//   it), so every entry point calls openblas_set_num_threads(1) if it finds another setting.
//   That setting is process-wide; strata does no other BLAS work.
// - Determinism: the same inputs give bit-identical outputs run after run, whatever the TBB
//   thread count and whatever OpenBLAS thread count the caller had set: no float atomics;
//   every reduction (LayerNorm statistics, softmax sums, column sums for bias / LayerNorm /
//   embedding gradients, the loss) runs in a fixed order inside one task; tasks never share an
//   output element; GEMM tiles are fixed by the shapes, never by the thread count. (OpenBLAS
//   0.3.21's own threading is NOT thread-count invariant — measured: thousands of elements of
//   a 256×384×128 product differ between 1 and 2 threads — hence the tiles.) Bit-identity
//   across CPUs that OpenBLAS drives with different kernels (Haswell vs SkylakeX) is not
//   promised.
// - Precision: fp32 storage and products; LayerNorm statistics, softmax / cross-entropy sums and
//   column sums accumulate in double. Checked against a float64 PyTorch GPT-2: loss and every
//   gradient within 1e-5 relative (max|a−b| / max|b| per tensor), typically ~2e-6.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "models/gpt2_shape.h"

namespace strata::reference::gpt2 {

// The shape's vocabulary (Config, BlockWeights, bind_block, ...) is the reference's.
using namespace models::gpt2;
namespace lora = kernels::lora;

// Rows of logits the head materializes at once: ops.h's.
using kernels::kHeadChunkRows;

// Bytes each entry point needs for activation shapes up to `max_shape`.
size_t block_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
size_t head_workspace_size_bytes(const Config& config, const BatchShape& max_shape);
// The largest of the above: one workspace that serves every entry point.
size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape);

// x0[b,t,:] = wte[tokens[b,t], :] + wpe[pos, :], pos = t (or packed.positions[b,t]). Tokens
// must lie in [0, vocab) (asserted). Reads packed.positions only.
void embedding_forward(const Config& config, const BatchShape& shape, const int32_t* tokens,
                       const float* wte, const float* wpe, float* x0, const PackedRows& packed = {});
// d_wte[tokens[b,t], :] += d_x0[b,t,:]; d_wpe[pos, :] += d_x0[b,t,:] (accumulated; repeated
// tokens and positions are summed in (b,t) order). Reads packed.positions only.
void embedding_backward(const Config& config, const BatchShape& shape, const int32_t* tokens,
                        const float* d_x0, float* d_wte, float* d_wpe, const PackedRows& packed = {});

// One transformer block: x_out = block(x_in). x_out must not alias x_in. Leaves the block's
// activations (LayerNorm statistics and outputs, qkv, attention output, MLP pre-activation
// and activation) in `workspace`, where block_backward(recompute = false) can use them.
// With packed.segments, attention stays inside each example (PackedRows); positions unused.
void block_forward(const Config& config, const BatchShape& shape, const BlockWeights& weights,
                   const float* x_in, float* x_out, const Workspace& workspace, const PackedRows& packed = {},
                   const lora::BlockAdapters* adapters = nullptr);

// Back-propagates d_out through the block whose input was x_in: d_in (overwritten) gets
// dLoss/dx_in and `grads` accumulate dLoss/dweights. With recompute = true (the streaming
// trainer's path: only block inputs are kept) it first re-runs the block's forward from x_in
// into `workspace`; with recompute = false the workspace must still hold the activations a
// block_forward call with the same weights, x_in and shape left there. d_in may alias d_out.
// The workspace's contents are clobbered. `packed` as for block_forward (the same one), and
// `adapters` too (the same tensors and mask_key as the forward, plus their grads). Null members
// of `grads` are frozen (skipped; see "Gradients").
void block_backward(const Config& config, const BatchShape& shape, const BlockWeights& weights,
                    const float* x_in, const float* d_out, float* d_in, const BlockGrads& grads,
                    const Workspace& workspace, bool recompute = true, const PackedRows& packed = {},
                    const lora::BlockAdapters* adapters = nullptr);

// Loss masks and the normalizer N (negative targets; loss_normalizer_tokens, 0: this batch's
// count of trained rows): kernels/ops.h's count_trained_targets says them.

// The tied LM head and loss: logits = ln_f(x_final) @ wteᵀ, loss = the cross-entropy against
// `targets` (each < vocab; negative = masked, above) summed over the trained rows and divided
// by N (above). Writes d_x_final (overwritten) and accumulates d_ln_f_* and d_wte. Logits
// exist only kHeadChunkRows rows at a time. Returns the loss (summed in double, in row order);
// with no masks and N = 0 that is the mean over the B·T rows, bit for bit what it always was.
// Null members of `grads` are frozen: a default HeadGrads{} gives d_x_final alone.
float head_forward_backward(const Config& config, const BatchShape& shape,
                            const HeadWeights& weights, const float* x_final,
                            const int32_t* targets, float* d_x_final, const HeadGrads& grads,
                            const Workspace& workspace, int64_t loss_normalizer_tokens = 0);

// Same loss as head_forward_backward with no gradients (evaluation).
float head_loss(const Config& config, const BatchShape& shape, const HeadWeights& weights,
                const float* x_final, const int32_t* targets, const Workspace& workspace,
                int64_t loss_normalizer_tokens = 0);

// For sampling: logits [batch, vocab] of the LAST position of each sequence of x_final
// ([batch, seq_len, C]).
void head_forward(const Config& config, const BatchShape& shape, const HeadWeights& weights,
                  const float* x_final, float* logits, const Workspace& workspace);

// --- Decoding with a KV cache (generation) ---
// One block's cache is a kernels::KvCacheBlock (ops.h) of [max_positions, C] keys and values.
// max_positions <= n_ctx (GPT-2's positions are learned).

// Workspace for block_decode and head_decode with up to `max_rows` new rows per call and a
// cache of `max_positions` (64-byte aligned, as the other entry points).
size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions);

// x0[r] = wte[tokens[r]] + wpe[past + r] for the `rows` new tokens at positions past...
void embedding_decode(const Config& config, int64_t past, int64_t rows, const int32_t* tokens, const float* wte,
                      const float* wpe, float* x0);

// The block for `rows` new positions past..past+rows−1 whose earlier positions 0..past−1 are
// in `cache`: writes the new rows' k and v into the cache, then x_out = block(x_in) exactly as
// block_forward computes those rows of a full sequence (causal attention over the cache). A
// prompt is one call with rows = its length; each sampled token one call with rows = 1. The
// head's logits of the last new row: head_decode. Agrees with a
// full-sequence block_forward to fp32 rounding (tests/gpt2: logits within 1e-5).
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeights& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace);

// logits [vocab] of the last of `rows` rows of x_final: head_forward's math for one row, with
// the logits written straight to `logits` (no kHeadChunkRows × vocab scratch).
void head_decode(const Config& config, int64_t rows, const HeadWeights& weights, const float* x_final, float* logits,
                 const Workspace& workspace);

// --- Decoding on bf16 weights (the store's compute copy as it is) ---
// The same block_decode and head_decode with every weight a bf16 bit pattern, bound like the
// fp32 ones (bind_block on the packed bf16 unit). No unit is widened whole: the 1-D tensors
// (LayerNorm gains and biases, every bias) are widened into `scratch`, and each product reads
// its bf16 matrix once through cpu_math::matmul_bf16 (a register-widening GEMV for a decoded
// token, L2-sized widened pieces for a prompt), whose pieces live in `scratch` too. The
// results equal widening the weights and calling the fp32 ops up to fp32 summation order
// (tests/engine/test_decode_bf16.cpp: logits within 1e-5). `scratch`: decode_bf16_scratch_bytes
// bytes, 64-byte aligned, beside the decode workspace.
// BlockWeightsBf16 / HeadWeightsBf16: gpt2_shape.h.
size_t decode_bf16_scratch_bytes(const Config& config);
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch);
void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& weights, const float* x_final,
                 float* logits, const Workspace& workspace, const Workspace& scratch);

}  // namespace strata::reference::gpt2
