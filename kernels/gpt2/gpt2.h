// strata/kernels/gpt2/gpt2.h — GPT-2 forward and backward on the CPU, one block at a time.
//
// Contract
// - Math: exactly Hugging Face's GPT2LMHeadModel with dropout off. x0 = wte[token] + wpe[pos];
//   each block is pre-LayerNorm: x1 = x + c_proj(causal_attention(c_attn(ln_1(x)))),
//   x_out = x1 + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x1)))); then ln_f; logits = ln_f(x) @ wteᵀ
//   (the head is tied to the token embedding); loss = mean cross-entropy over all B·T
//   positions. LayerNorm eps 1e-5 (biased variance); attention scores scaled by
//   1/sqrt(head_dim); GELU is HF's "gelu_new" (tanh approximation).
// - Layout: every tensor fp32, row-major, exactly as in GPT-2's safetensors files. Conv1D
//   weights are stored [in, out] (y = x @ W + b). Names are HF's without the `transformer.`
//   prefix: `wte.weight` [vocab, C], `wpe.weight` [n_ctx, C], `h.{i}.<suffix>` for block
//   tensors (block_param_specs lists the suffixes in their canonical order), `ln_f.weight`,
//   `ln_f.bias`. Activations are [B, T, C] row-major; tokens and targets are int32 [B, T].
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
// - LoRA: block_forward / block_backward take an optional `lora::BlockAdapters` (lora.h) for
//   c_attn (0), attn.c_proj (1), mlp.c_fc (2) and mlp.c_proj (3): each targeted linear adds
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

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/ops.h"

namespace strata::kernels::lora {
struct BlockAdapters;  // kernels/lora/lora.h
}  // namespace strata::kernels::lora

namespace strata::kernels::gpt2 {

// Model dimensions (the shape of the weights).
struct Config {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;      // C; must be a multiple of n_head
  int64_t vocab_size = 0;
  int64_t n_ctx = 0;       // number of learned positions (rows of wpe)
  int64_t head_dim() const { return n_embd / n_head; }
};

// Activation shape of one call (seq_len <= n_ctx) and caller-allocated scratch: kernels/ops.h's.
using kernels::BatchShape;
using kernels::Workspace;

// One parameter tensor as the store and trainer lay it out.
struct ParamSpec {
  std::string_view name_suffix;     // e.g. "attn.c_attn.weight" (block) or "wte.weight"
  std::array<int64_t, 2> shape;     // shape[1] == 0 for 1-D tensors
  int rank;                         // 1 or 2
  bool weight_decay;                // AdamW decay: 2-D tensors yes, biases and LayerNorm no
  int64_t numel() const { return rank == 1 ? shape[0] : shape[0] * shape[1]; }
};

inline constexpr int kBlockParamCount = 12;
// A block's tensors in canonical order (the order of BlockTensors' members):
// ln_1.weight, ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
// attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias,
// mlp.c_proj.weight, mlp.c_proj.bias.
std::array<ParamSpec, kBlockParamCount> block_param_specs(const Config& config);
// "h.{layer}.{suffix}".
std::string block_param_name(int64_t layer, std::string_view name_suffix);
// The non-block tensors: wte.weight, wpe.weight, ln_f.weight, ln_f.bias.
inline constexpr int kOuterParamCount = 4;
std::array<ParamSpec, kOuterParamCount> outer_param_specs(const Config& config);
// Elements of one block's tensors together / of the whole model.
int64_t block_param_count(const Config& config);
int64_t model_param_count(const Config& config);

// Pointers to one block's tensors (weights: const float; gradients: float), in the memory of
// whichever backend runs the definition's operations (models/gpt2.cpp).
template <typename T>
struct BlockTensors {
  T* ln_1_weight = nullptr;         // [C]
  T* ln_1_bias = nullptr;           // [C]
  T* attn_c_attn_weight = nullptr;  // [C, 3C]
  T* attn_c_attn_bias = nullptr;    // [3C]
  T* attn_c_proj_weight = nullptr;  // [C, C]
  T* attn_c_proj_bias = nullptr;    // [C]
  T* ln_2_weight = nullptr;         // [C]
  T* ln_2_bias = nullptr;           // [C]
  T* mlp_c_fc_weight = nullptr;     // [C, 4C]
  T* mlp_c_fc_bias = nullptr;       // [4C]
  T* mlp_c_proj_weight = nullptr;   // [4C, C]
  T* mlp_c_proj_bias = nullptr;     // [C]

  // Member i in canonical order (block_param_specs()[i]).
  T*& at(int index);
  T* at(int index) const { return const_cast<BlockTensors*>(this)->at(index); }
};
using BlockWeights = BlockTensors<const float>;
using BlockGrads = BlockTensors<float>;

// Binds a block's tensors packed back to back in canonical order starting at `base`
// (block_param_count floats). Works for weights, gradients, or any per-parameter state.
template <typename T>
BlockTensors<T> bind_block(const Config& config, T* base);

// ln_f and the tied embedding: what the head reads.
struct HeadWeights {
  const float* ln_f_weight = nullptr;  // [C]
  const float* ln_f_bias = nullptr;    // [C]
  const float* wte = nullptr;          // [vocab, C]
};
struct HeadGrads {
  float* d_ln_f_weight = nullptr;  // [C], accumulated
  float* d_ln_f_bias = nullptr;    // [C], accumulated
  float* d_wte = nullptr;          // [vocab, C], accumulated
};

// Packed rows (fine-tuning packs several short examples into one seq_len row), per token of the
// [B, T] batch, host memory here (device memory for the CUDA twin). Both null is an unpacked
// batch, and every op gives exactly the bits it gives without the argument.
// - positions: the token's position within its example, in [0, seq_len). The embedding looks
//   up wpe at it (Llama's block rotates q and k by it); null: position = t, the index in the row.
// - segments: the token's example id. Ids never decrease along a row, so an example is one
//   contiguous run; a new id starts a new example. Attention is block-diagonal: query t sees key
//   u only when u ≤ t and segments[u] == segments[t]. Null: one example per row (plain causal).
// The two are independent (either may be null); the backend checks them
// (kernels::check_packing) before any kernel indexes by them; the kernels only assert.
struct PackedRows {
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
};


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

// Loss masks: a row whose target is negative (-1, or any negative: PyTorch's ignore_index with
// every negative ignored) is not trained — it adds exactly 0 to the loss and its logits'
// gradient row is exactly 0, so nothing of it reaches any parameter gradient. The loss and the
// gradients are divided by N = `loss_normalizer_tokens`, or, when that is 0, by this batch's
// count of trained rows (targets ≥ 0): torch's cross_entropy(ignore_index, reduction='sum') / N.
// A caller that splits one batch into micro-batches passes the whole batch's count as N, so the
// micro-batches' losses and gradients add up to the whole batch's. N = 0 with no trained row
// gives loss 0 and no gradient (never 0/0).
int64_t count_trained_targets(const int32_t* targets, int64_t rows);

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
// One block's cache: the keys and values of every position so far, each [max_positions, C]
// row-major (head h in columns h·head_dim..), owned by the caller. Positions are absolute:
// row t holds position t's k / v. max_positions <= n_ctx (GPT-2's positions are learned).
struct KvCacheBlock {
  float* keys = nullptr;
  float* values = nullptr;
  int64_t max_positions = 0;
};

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
using BlockWeightsBf16 = BlockTensors<const uint16_t>;
struct HeadWeightsBf16 {
  const uint16_t* ln_f_weight = nullptr;  // [C]
  const uint16_t* ln_f_bias = nullptr;    // [C]
  const uint16_t* wte = nullptr;          // [vocab, C]
};
size_t decode_bf16_scratch_bytes(const Config& config);
void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch);
void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& weights, const float* x_final,
                 float* logits, const Workspace& workspace, const Workspace& scratch);

}  // namespace strata::kernels::gpt2
