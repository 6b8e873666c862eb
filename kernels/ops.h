// strata/kernels/ops.h — the operations a model is made of: the arguments of the compute
// backend's op-level seam (kernels/backend.h, "the operations"). No model is named here or in
// any backend: a model definition (models/) composes these into its embedding, blocks and head.
//
// Contract (every op; backend.h's ordering, memory and error rules hold)
// - Pointers are the backend's memory (host on the cpu device; device memory on CUDA and on the
//   emulated device), fp32 row-major unless a member says otherwise. `*_stride` members count
//   floats between consecutive rows.
// - Accumulation is explicit: a member named `accumulate` (or `beta` for the GEMM) says whether
//   an output is added to or overwritten; parameter gradients are always ACCUMULATED (+=) and a
//   null parameter-gradient pointer is a frozen tensor whose product is skipped, nothing else
//   changing (LoRA's frozen base).
// - Determinism: every op gives the same bits run after run on one backend and machine,
//   whatever its thread count (no float atomics; each reduction in a fixed order inside one
//   task). The CPU backend's ops are the fused loops the CPU kernels always ran, so a model
//   composed of them gives the bits the per-model CPU kernels gave; CUDA's agree with the CPU's
//   to fp32 rounding (tests/backend/test_ops.cpp states each op's tolerance).
// - The step's batch (backend.h `begin_step`): the ops that need tokens, targets, positions or
//   segments read the step's — the model never passes them, so CUDA copies them to the device
//   once per step. `use_step_positions` / `use_step_segments` say whether an op applies the
//   step's packing (both false: plain rows, even in a packed step).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::kernels {

// Activation shape of one call: batch rows of seq_len tokens each.
struct BatchShape {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t rows() const { return batch * seq_len; }
};

// Caller-allocated scratch in the backend's memory (64-byte aligned).
struct Workspace {
  float* data = nullptr;
  size_t size_bytes = 0;
};

// Packed rows (fine-tuning packs several short examples into one seq_len row), per token of the
// [B, T] batch, in the memory of the backend that reads them. Both null is an unpacked batch,
// and every op gives exactly the bits it gives without them.
// - positions: the token's position within its example, in [0, seq_len). A learned-position
//   embedding looks its row up at it, RoPE rotates q and k by it; null: position = t, the index
//   in the row.
// - segments: the token's example id. Ids never decrease along a row, so an example is one
//   contiguous run; a new id starts a new example. Attention is block-diagonal: query t sees key
//   u only when u <= t and segments[u] == segments[t]. Null: one example per row (plain causal).
// The two are independent (either may be null); the backend checks them (check_packing,
// backend.h) before any kernel indexes by them; the kernels only assert.
struct PackedRows {
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
};

// One block's KV cache for decoding: the keys and values of every position so far, each
// [max_positions, kv width] row-major (k/v head g in columns g·head_dim..), owned by the caller.
// Positions are absolute: row t holds position t's k / v (after RoPE where the model rotates).
struct KvCacheBlock {
  float* keys = nullptr;
  float* values = nullptr;
  int64_t max_positions = 0;
};

// Loss masks: a row whose target is negative (-1, or any negative: PyTorch's ignore_index with
// every negative ignored) is not trained — it adds exactly 0 to the loss and its logits'
// gradient row is exactly 0. The loss and the gradients are divided by N = the caller's
// `loss_normalizer_tokens`, or, when that is 0, by this batch's count of trained rows
// (targets >= 0): torch's cross_entropy(ignore_index, reduction='sum') / N. A caller that splits
// one batch into micro-batches passes the whole batch's count as N, so the micro-batches' losses
// and gradients add up to the whole batch's. N = 0 with no trained row gives loss 0 and no
// gradient (never 0/0). This counts the trained rows of `rows` targets.
int64_t count_trained_targets(const int32_t* targets, int64_t rows);

// Hands out 64-byte aligned slices of a workspace (only offsets when base is null), so a
// model's sizing function and the code that carves its workspace share one layout description.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(float* base) : base_(base) {}
  float* take(int64_t count_floats) {
    float* slice = base_ == nullptr ? nullptr : base_ + used_floats_;
    used_floats_ += (count_floats + 15) / 16 * 16;
    return slice;
  }
  size_t used_bytes() const { return static_cast<size_t>(used_floats_) * sizeof(float); }

 private:
  float* base_;
  int64_t used_floats_ = 0;
};

// Rows of [rows, vocab] logits a head materializes at once: it works through the B·T rows in
// chunks of this many, so its logits scratch is kHeadChunkRows × vocab floats whatever B·T is.
// Fixed (not derived from the thread count) so the order in which the chunks add into the
// output projection's gradient — and so the result — never changes.
inline constexpr int64_t kHeadChunkRows = 256;

namespace ops {

// c[m, n] = op(a)·op(b) + beta·c (row-major; op = transpose when trans_*). beta 0 never reads c.
// The CPU runs fixed 256×512 output tiles of single-threaded OpenBLAS (cpu_math.h), CUDA cuBLAS
// in pedantic fp32 (no TF32).
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
};

// y[r, :] = bias (+ residual[r, :]) — where a Conv1D-style product then adds (a Conv1D linear:
// the bias first, then beta-1 GEMM); bias null: y = residual (nn.Linear's residual start).
// y may alias residual.
struct RowsInit {
  float* y = nullptr;
  const float* bias = nullptr;
  const float* residual = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// y[r, :] += bias (nn.Linear's bias, added after its product).
struct AddBias {
  float* y = nullptr;
  const float* bias = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// out[j] += Σ_r in[r, j] in row order, summed in double (a bias's gradient).
struct ColumnSums {
  const float* in = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  float* out = nullptr;
};

// --- normalisation (statistics in double) ---
// LayerNorm: y = (x − mean)·rstd·w + b, biased variance. RMSNorm: y = (w + weight_offset)·x·rstd,
// rstd = 1/sqrt(mean(x²) + eps) (weight_offset 1: x·(1 + w); 0: plain w, the same bits
// as no offset). x rows are x_stride floats apart (a head picks each sequence's last row); y,
// mean and rstd are dense. mean is LayerNorm's only; bias too (RMSNorm: null).
enum class NormKind { layer, rms };
struct NormForward {
  NormKind kind = NormKind::layer;
  const float* x = nullptr;
  int64_t x_stride = 0;
  const float* weight = nullptr;
  const float* bias = nullptr;
  float weight_offset = 0.0f;
  double eps = 1e-5;
  int64_t rows = 0;
  int64_t width = 0;
  float* y = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
};
// dx (+)= the norm's input gradient from dy (x̂ recomputed from x and the saved statistics);
// d_weight (and LayerNorm's d_bias) += their column sums — both null: frozen, skipped.
struct NormBackward {
  NormKind kind = NormKind::layer;
  const float* dy = nullptr;
  const float* x = nullptr;  // dense rows (width apart)
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* weight = nullptr;
  float weight_offset = 0.0f;
  int64_t rows = 0;
  int64_t width = 0;
  float* dx = nullptr;
  bool accumulate = false;
  float* d_weight = nullptr;
  float* d_bias = nullptr;
};

// --- rotary position embedding (Hugging Face's rotate_half) ---
// Pair (i, i + D/2) of each head rotated by position·inv_freq_i, inv_freq_i = theta^(−2i/D),
// with the llama3 rope_scaling form when factor > 0. The angle is computed in double and its
// cos and sin rounded to fp32, so a decode step at position p rotates as a full forward's row p.
struct RopeSpec {
  int64_t head_dim = 0;  // even
  double theta = 10000.0;
  double factor = 0.0;  // llama3 scaling; 0: none
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
};
// The inverse frequency of pair i: op_math.h's rope_inverse_frequency (host and device).
// The tables a backend may use for positions first_position..first_position + t_len − 1: cos
// and sin [t_len, D/2] each (rope_table_floats floats each); a backend that computes angles in
// its kernel (CUDA) leaves them untouched.
inline int64_t rope_table_floats(int64_t t_len, int64_t head_dim) { return t_len * (head_dim / 2); }
struct RopeTables {
  RopeSpec spec;
  int64_t first_position = 0;
  int64_t t_len = 0;
  float* cos = nullptr;
  float* sin = nullptr;
};
// Rotates every head of x [shape.rows(), heads·D] in place: row r at position first_position +
// r % seq_len, or the step's packed position when use_step_positions (and the step has them;
// packing is training's, so first_position is then 0);
// `inverse` applies the transpose (the backward). The tables must be rope_tables' for
// (first_position, shape.seq_len).
struct Rope {
  RopeSpec spec;
  float* x = nullptr;
  BatchShape shape;
  int64_t heads = 0;
  int64_t first_position = 0;
  bool inverse = false;
  bool use_step_positions = false;
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// --- causal attention (multi-head or grouped-query) ---
// For each batch row b and query head h (reading k/v head h / (n_head / n_kv_head)): out row i =
// Σ_{first ≤ j ≤ i} softmax_j(scale·q_i·k_j) v_j, first the start of i's example when
// use_step_segments (the step's segment ids; block-diagonal packing), else 0. Token rows of q
// are q_stride floats apart, of k and v kv_stride, of out out_stride; head h's slice starts at
// column h·head_dim. `scratch` (attention_scratch_bytes) may keep what the backward reuses
// (CUDA: the [B, H, T, T] probabilities): untouched between a forward and its backward.
struct Attention {
  BatchShape shape;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  bool use_step_segments = false;
  Workspace scratch;
};
// The backward of the same call (the same q, k, v, scratch): dq OVERWRITTEN (q_stride apart),
// dk and dv OVERWRITTEN (kv_stride apart; the query heads of one group summed in head order)
// from d_out (out_stride apart).
struct AttentionBackward {
  Attention forward;
  const float* d_out = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
};

// --- activations (n elements) ---
// GELU, tanh form (HF "gelu_new" / "gelu_pytorch_tanh"): out = gelu(in); backward d *= gelu'(pre).
struct Gelu {
  const float* in = nullptr;
  float* out = nullptr;
  int64_t n = 0;
};
struct GeluBackward {
  float* d = nullptr;
  const float* pre = nullptr;
  int64_t n = 0;
};
// Gated MLP: act = f(gate)·up, f = SiLU (SwiGLU) or tanh-GELU (GeGLU). The
// backward turns gate and up into their own gradients in place from d_act.
enum class GateKind { silu, gelu_tanh };
struct Gated {
  GateKind kind = GateKind::silu;
  const float* gate = nullptr;
  const float* up = nullptr;
  float* act = nullptr;
  int64_t n = 0;
};
struct GatedBackward {
  GateKind kind = GateKind::silu;
  const float* d_act = nullptr;
  float* gate = nullptr;
  float* up = nullptr;
  int64_t n = 0;
};

// --- embedding (the step's tokens) ---
// x[r, :] = scale·table[token_r, :] (+ positions[pos_r, :], pos_r the row's position, or the
// step's packed one when use_step_positions; scale must then be 1). scale 1 multiplies nothing;
// a √C scale is rounded to fp32 first, as Hugging Face's normalizer in the hidden dtype.
// Decoding passes its own tokens: `tokens` (HOST memory, shape.rows() of them; the backend copies
// them where it must) instead of the step's, and `first_position` (the cache's length): row r's
// learned position is first_position + r % seq_len.
struct Embedding {
  BatchShape shape;
  int64_t width = 0;
  int64_t vocab = 0;
  const float* table = nullptr;
  const float* positions = nullptr;  // learned positions [*, width], or null
  bool use_step_positions = false;
  float scale = 1.0f;
  float* x = nullptr;
  const int32_t* tokens = nullptr;  // null: the step's
  int64_t first_position = 0;
};
// d_table[token_r, :] += scale·d_x[r, :] and d_positions[pos_r, :] += d_x[r, :], every row in
// row order (repeated tokens summed in a fixed order). Either gradient null: skipped.
struct EmbeddingBackward {
  Embedding forward;  // its table, positions and x unused
  const float* d_x = nullptr;
  float* d_table = nullptr;
  float* d_positions = nullptr;
};

// --- the loss (the step's targets) ---
// logits [rows, vocab] of the step's rows first_row..first_row + rows − 1: adds each row's
// cross-entropy against its target (negative: masked — 0, and a zero gradient row) to the step's
// loss sum, in row order, in double; with `gradient`, overwrites the logits with dLoss/dlogits
// divided by the step's normaliser N (backend.h StepBatch). The step's loss (end_step) is that
// sum over N, rounded to fp32.
// `row_loss` is [rows] scratch the backend may use to sum the rows in order (the CPU does; CUDA
// keeps a buffer of the whole step's row losses of its own and leaves it untouched).
struct CrossEntropy {
  float* logits = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t first_row = 0;
  bool gradient = false;
  float* row_loss = nullptr;
};

// --- decoding with a KV cache ---
// dst rows (dst_stride apart) = src rows (src_stride apart), `cols` floats each: a new
// position's k and v into a block's cache.
struct CopyRows {
  float* dst = nullptr;
  int64_t dst_stride = 0;
  const float* src = nullptr;
  int64_t src_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};
// Attention of `rows` new positions past..past + rows − 1 over a cache whose rows 0..past + rows − 1
// already hold k and v (kv_stride floats per position; k/v head g at column g·head_dim): new row
// r, query head h (k/v head h / (n_head / n_kv_head)) attends to cache rows 0..past + r — what
// the full forward computes for those rows. `scratch`: attention_decode_scratch_bytes.
struct AttentionDecode {
  int64_t past = 0;
  int64_t rows = 0;
  int64_t max_positions = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t kv_stride = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  Workspace scratch;
};
// y[rows, out] (+)= x[rows, in]·W for W as bf16 bit patterns, stored [in, out] (x·W) or, with
// w_out_major, [out, in] (x·Wᵀ: nn.Linear, a head): the store's bf16 compute copy multiplied as
// it is. The CPU reads W once (cpu_math::matmul_bf16: a register-widening GEMV for a decoded
// token, L2-sized widened pieces otherwise); CUDA widens bounded pieces into `scratch` and runs
// its fp32 GEMM. Equal to widening W and the fp32 GEMM up to fp32 summation order.
// `scratch`: matmul_bf16_scratch_bytes for the largest (in, out) the caller multiplies.
struct MatmulBf16 {
  bool w_out_major = false;
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  const float* x = nullptr;
  const uint16_t* w = nullptr;
  bool accumulate = false;
  float* y = nullptr;
  Workspace scratch;
};

}  // namespace ops
}  // namespace strata::kernels
