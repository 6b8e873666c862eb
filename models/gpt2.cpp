// models/gpt2.cpp — the GPT-2 definition (model.h): its units, init, workspace layout and training ops,
// composed of the backend's operations (kernels/ops.h) in the order the reference kernels
// (tests/reference/gpt2_reference.cpp) run them, so the CPU gives the same bits; decoding with
// a KV cache too (fp32 and bf16 weights).
#include "models/definitions.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "models/gpt2_shape.h"
#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "models/definitions.h"

namespace strata::models {
namespace {

namespace gk = models::gpt2;

// --- GPT-2's training workspace ----------------------------------------------------------------
// The model's own layout (the ops allocate nothing): one description that the sizing functions
// and the ops carve alike, so the two can never disagree. It is the reference's layout with the
// attention's private scratch (there: transposed keys and values and two rows per head) one
// region of the backend's attention_scratch_bytes, since what attention keeps is the backend's
// business (CUDA keeps the [B, H, T, T] probabilities there).

// What block_forward leaves behind and block_backward reads; the backward's temporaries reuse
// slices whose contents are dead by then (noted at each use).
struct BlockLayout {
  float* ln1_out;    // [N, C]
  float* ln1_mean;   // [N]
  float* ln1_rstd;   // [N]
  float* qkv;        // [N, 3C]
  float* att;        // [N, C]   attention output before c_proj
  float* x1;         // [N, C]   residual stream after attention
  float* ln2_out;    // [N, C]
  float* ln2_mean;   // [N]
  float* ln2_rstd;   // [N]
  float* fc_pre;     // [N, 4C]  c_fc output before GELU
  float* fc_act;     // [N, 4C]  after GELU
  Workspace attention;  // ops::Attention::scratch, untouched from a forward to its backward
  size_t size_bytes;
};

BlockLayout block_layout(const gk::Config& config, const BatchShape& shape, size_t attention_bytes, float* base) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  kernels::WorkspaceCarver carve(base);
  BlockLayout layout{};
  layout.ln1_out = carve.take(n * c);
  layout.ln1_mean = carve.take(n);
  layout.ln1_rstd = carve.take(n);
  layout.qkv = carve.take(n * 3 * c);
  layout.att = carve.take(n * c);
  layout.x1 = carve.take(n * c);
  layout.ln2_out = carve.take(n * c);
  layout.ln2_mean = carve.take(n);
  layout.ln2_rstd = carve.take(n);
  layout.fc_pre = carve.take(n * 4 * c);
  layout.fc_act = carve.take(n * 4 * c);
  const auto attention_floats = static_cast<int64_t>((attention_bytes + sizeof(float) - 1) / sizeof(float));
  layout.attention = Workspace{carve.take(attention_floats), attention_bytes};
  layout.size_bytes = carve.used_bytes();
  return layout;
}

// The head's chunk: kHeadChunkRows rows of everything, so its logits are kHeadChunkRows × vocab
// floats whatever B·T is (and d_wte's chunks add up in one fixed order).
struct HeadLayout {
  float* ln_out;    // [R, C]
  float* mean;      // [R]
  float* rstd;      // [R]
  float* logits;    // [R, vocab]; becomes dLoss/dlogits in place (ops::CrossEntropy)
  float* d_ln_out;  // [R, C]
  float* row_loss;  // [R]  ops::CrossEntropy's
  size_t size_bytes;
};

HeadLayout head_layout(const gk::Config& config, float* base) {
  const int64_t r = kernels::kHeadChunkRows;
  kernels::WorkspaceCarver carve(base);
  HeadLayout layout{};
  layout.ln_out = carve.take(r * config.n_embd);
  layout.mean = carve.take(r);
  layout.rstd = carve.take(r);
  layout.logits = carve.take(r * config.vocab_size);
  layout.d_ln_out = carve.take(r * config.n_embd);
  layout.row_loss = carve.take(r);
  layout.size_bytes = carve.used_bytes();
  return layout;
}

// --- GPT-2's decoding workspace and bf16 scratch --------------------------------------------
// A decode call's block is the training block's layout for `rows` new rows (shape {1, rows}),
// its attention region the backend's attention_decode scratch (score rows over the cache): one
// description for sizing and carving. The head needs only its one row's LayerNorm output and
// statistics, in the same workspace (ordered by the stream).
struct HeadDecodeLayout {
  float* ln_out;  // [C]
  float* mean;    // [1]
  float* rstd;    // [1]
  size_t size_bytes;
};

HeadDecodeLayout head_decode_layout(const gk::Config& config, float* base) {
  kernels::WorkspaceCarver carve(base);
  HeadDecodeLayout layout{};
  layout.ln_out = carve.take(config.n_embd);
  layout.mean = carve.take(1);
  layout.rstd = carve.take(1);
  layout.size_bytes = carve.used_bytes();
  return layout;
}

// The bf16 decode scratch: a block's 1-D tensors (LayerNorm gains and biases, every bias)
// widened to fp32 in canonical order — the matrices stay bf16 and are multiplied as stored —
// then matmul_bf16's scratch. The head widens ln_f's weight and bias into the first two C-float
// slices (ln_1's).
struct Bf16Scratch {
  gk::BlockWeights vectors;  // the 1-D members only; the matrices stay null
  Workspace matmul;
  size_t size_bytes;
};

Bf16Scratch bf16_scratch(const gk::Config& config, size_t matmul_bytes, float* base) {
  kernels::WorkspaceCarver carve(base);
  Bf16Scratch layout{};
  const auto specs = gk::block_param_specs(config);
  for (int i = 0; i < gk::kBlockParamCount; ++i)
    if (specs[i].rank == 1) layout.vectors.at(i) = carve.take(specs[i].numel());
  const auto matmul_floats = static_cast<int64_t>((matmul_bytes + sizeof(float) - 1) / sizeof(float));
  layout.matmul = Workspace{carve.take(matmul_floats), matmul_bytes};
  layout.size_bytes = carve.used_bytes();
  return layout;
}

// The largest matmul_bf16 scratch any of GPT-2's bf16 products needs — the block's four
// (in, out) and the head's (C, vocab) — by `bytes(in, out)` (a backend's, or a device kind's):
// a backend may size by either dimension (CUDA bands whole rows of the wider one).
template <typename Bytes>
size_t matmul_bf16_bytes(const gk::Config& config, Bytes bytes) {
  const int64_t c = config.n_embd;
  const int64_t products[][2] = {{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}, {c, config.vocab_size}};
  size_t largest = 0;
  for (const auto& p : products) largest = std::max(largest, static_cast<size_t>(bytes(p[0], p[1])));
  return largest;
}

// GPT-2's LayerNorm (eps the float 1e-5f: the kernels always added it to the double variance
// as a float, and the bits follow it).
kernels::ops::NormForward layer_norm(const float* x, const float* weight, const float* bias, int64_t rows,
                                     int64_t width, float* y, float* mean, float* rstd) {
  return kernels::ops::NormForward{kernels::ops::NormKind::layer,
                                   x,
                                   width,
                                   weight,
                                   bias,
                                   0.0f,
                                   static_cast<double>(gk::kLayerNormEps),
                                   rows,
                                   width,
                                   y,
                                   mean,
                                   rstd};
}
// Its backward: dx (+)= the input gradient; the gains' gradients when given (both null: frozen).
kernels::ops::NormBackward layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                                               const float* weight, int64_t rows, int64_t width, float* dx,
                                               bool accumulate, float* d_weight, float* d_bias) {
  return kernels::ops::NormBackward{kernels::ops::NormKind::layer,
                                    dy,
                                    x,
                                    mean,
                                    rstd,
                                    weight,
                                    0.0f,
                                    rows,
                                    width,
                                    dx,
                                    accumulate,
                                    d_weight,
                                    d_bias};
}

// GPT-2's Conv1D, y = x·W + b (+ residual) with W [in, out]: the rows start as the bias (plus
// the residual), then the product adds in — the order the kernels always summed in — then the
// adapter of `target` (none when `adapters` does not target it) adds its term.
Status linear_forward(kernels::ComputeBackend& backend, const float* x, const float* weight, const float* bias,
                      const float* residual, int64_t rows, int64_t in, int64_t out, float* y,
                      const kernels::lora::BlockAdapters* adapters, int target) {
  STRATA_RETURN_IF_ERROR(backend.rows_init(kernels::ops::RowsInit{y, bias, residual, rows, out}));
  STRATA_RETURN_IF_ERROR(backend.gemm(kernels::ops::Gemm{false, false, rows, out, in, x, in, weight, out, 1.0f, y, out}));
  return backend.lora_forward(adapters, target, x, rows, in, out, y);
}
// dW += xᵀ·dy and db += Σ_rows dy, each skipped when null (frozen).
Status linear_backward_params(kernels::ComputeBackend& backend, const float* x, const float* dy, int64_t rows,
                              int64_t in, int64_t out, float* d_weight, float* d_bias) {
  if (d_weight != nullptr)
    STRATA_RETURN_IF_ERROR(
        backend.gemm(kernels::ops::Gemm{true, false, in, out, rows, x, in, dy, out, 1.0f, d_weight, out}));
  if (d_bias != nullptr) STRATA_RETURN_IF_ERROR(backend.column_sums(kernels::ops::ColumnSums{dy, rows, out, d_bias}));
  return Status();
}
// dx = dy·Wᵀ (overwritten).
Status linear_backward_input(kernels::ComputeBackend& backend, const float* dy, const float* weight, int64_t rows,
                             int64_t in, int64_t out, float* dx) {
  return backend.gemm(kernels::ops::Gemm{false, true, rows, in, out, dy, out, weight, out, 0.0f, dx, in});
}

// A decode step's Conv1D product, y = x·W + b (+ residual): the rows start as the bias (plus
// the residual), then the product adds in — fp32 W by the beta-1 GEMM, bf16 W multiplied as
// stored (matmul_bf16, accumulating), the order the reference's decode summed in. No adapters:
// generation runs merged weights.
Status decode_linear(kernels::ComputeBackend& backend, const float* x, const float* weight, const float* bias,
                     const float* residual, int64_t rows, int64_t in, int64_t out, float* y,
                     const Workspace& /*matmul_scratch*/) {
  STRATA_RETURN_IF_ERROR(backend.rows_init(kernels::ops::RowsInit{y, bias, residual, rows, out}));
  return backend.gemm(kernels::ops::Gemm{false, false, rows, out, in, x, in, weight, out, 1.0f, y, out});
}
Status decode_linear(kernels::ComputeBackend& backend, const float* x, const uint16_t* weight, const float* bias,
                     const float* residual, int64_t rows, int64_t in, int64_t out, float* y,
                     const Workspace& matmul_scratch) {
  STRATA_RETURN_IF_ERROR(backend.rows_init(kernels::ops::RowsInit{y, bias, residual, rows, out}));
  kernels::ops::MatmulBf16 op;
  op.rows = rows;
  op.in = in;
  op.out = out;
  op.x = x;
  op.w = weight;
  op.accumulate = true;
  op.y = y;
  op.scratch = matmul_scratch;
  return backend.matmul_bf16(op);
}

// --- GPT-2 ---------------------------------------------------------------------------------
// Units embed (wte, wpe), h.{i}, ln_f. Init as GPT-2's: normal(0, init_std), residual
// projections scaled by 1/sqrt(2·n_layer), biases 0, LayerNorm weights 1.
class Gpt2 final : public ModelDefinition {
 public:
  explicit Gpt2(const ModelConfig& model) : ModelDefinition(model) {
    kc_ = gpt2_shape_config(model);
    const double residual_std = model.init_std / std::sqrt(2.0 * model.n_layer);
    auto add = [](Unit& unit, std::string name, const gk::ParamSpec& spec, double std_dev, float value) {
      add_tensor(unit, std::move(name), shape_of(spec), spec.weight_decay, std_dev, value);
    };
    auto outer = gk::outer_param_specs(kc_);  // wte, wpe, ln_f.w, ln_f.b
    Unit embed{"embed", -1, {}, 0};
    add(embed, std::string(outer[0].name_suffix), outer[0], model.init_std, 0.0f);
    embed.tensors.back().token_embedding = true;  // wte
    add(embed, std::string(outer[1].name_suffix), outer[1], model.init_std, 0.0f);
    units_.push_back(std::move(embed));
    const auto block_specs = gk::block_param_specs(kc_);
    for (int64_t layer = 0; layer < kc_.n_layer; ++layer) {
      Unit block{"h." + std::to_string(layer), layer, {}, 0};
      for (const auto& spec : block_specs) {
        std::string_view suffix = spec.name_suffix;
        const bool is_layer_norm_weight = suffix.starts_with("ln_") && suffix.ends_with(".weight");
        const bool is_bias = suffix.ends_with(".bias");
        const bool is_residual_projection = suffix.ends_with("c_proj.weight");
        const double std_dev = is_bias || is_layer_norm_weight ? 0.0
                               : is_residual_projection        ? residual_std
                                                               : model.init_std;
        add(block, gk::block_param_name(layer, suffix), spec, std_dev, is_layer_norm_weight ? 1.0f : 0.0f);
      }
      units_.push_back(std::move(block));
    }
    Unit ln_f{"ln_f", -1, {}, 0};
    add(ln_f, std::string(outer[2].name_suffix), outer[2], 0.0, 1.0f);
    add(ln_f, std::string(outer[3].name_suffix), outer[3], 0.0, 0.0f);
    units_.push_back(std::move(ln_f));
    find_linears({"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}, /*conv1d=*/true);
  }

  const char* arch() const override { return "gpt2"; }
  size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const BatchShape& shape) const override {
    return workspace_bytes(backend.attention_scratch_bytes(shape, kc_.n_head, kc_.head_dim()), shape);
  }
  size_t workspace_size_bytes(device::Kind kind, const BatchShape& shape) const override {
    return workspace_bytes(kernels::attention_scratch_bytes(kind, shape, kc_.n_head, kc_.head_dim()), shape);
  }
  // x0 = wte[token] + wpe[position]: the step's packed position when it has them.
  Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* embed,
                           float* x0) const override {
    return backend.embedding_lookup(embedding_op(shape, embed, x0));
  }
  Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* d_x0,
                            float* grads) const override {
    kernels::ops::EmbeddingBackward op{embedding_op(shape, nullptr, nullptr), d_x0, grads,
                                       grads == nullptr ? nullptr : wpe(grads)};
    return backend.embedding_lookup_backward(op);
  }
  Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                       const float* x_in, float* x_out, const Workspace& workspace,
                       const kernels::lora::BlockAdapters* adapters) const override {
    const BlockLayout ws = block_layout_for(backend, shape, workspace);
    return block_forward_into(backend, shape, gk::bind_block(kc_, block), x_in, x_out, ws, adapters);
  }
  Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                        const float* x_in, const float* d_out, float* d_in, float* grads, const Workspace& workspace,
                        bool recompute, const kernels::lora::BlockAdapters* adapters) const override;
  Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* ln_f,
                               const float* embed, const float* x_final, float* d_x_final, float* ln_f_grads,
                               float* embed_grads, const Workspace& workspace) const override;
  int64_t kv_cache_width() const override { return kc_.n_embd; }
  int64_t learned_positions() const override { return kc_.n_ctx; }
  uint64_t final_norm_elements() const override { return uint64_t(2 * kc_.n_embd); }
  bool head_tied() const override { return true; }
  size_t decode_workspace_size_bytes(device::Kind kind, int64_t max_rows, int64_t max_positions) const override {
    const size_t attention_bytes =
        kernels::attention_decode_scratch_bytes(kind, max_rows, kc_.n_head, max_positions);
    return std::max(block_layout(kc_, BatchShape{1, max_rows}, attention_bytes, nullptr).size_bytes,
                    head_decode_layout(kc_, nullptr).size_bytes);
  }
  // x0[r] = token_table[tokens[r]] + positions[past + r] (tokens: host memory).
  Status embedding_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const int32_t* tokens,
                          const float* token_table, int64_t table_rows, const float* positions,
                          float* x0) const override {
    assert(past >= 0 && rows > 0 && past + rows <= kc_.n_ctx);
    kernels::ops::Embedding op;
    op.shape = BatchShape{1, rows};
    op.width = kc_.n_embd;
    op.vocab = table_rows;
    op.table = token_table;
    op.positions = positions;
    op.x = x0;
    op.tokens = tokens;
    op.first_position = past;
    return backend.embedding_lookup(op);
  }
  Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const float* block,
                      const float* x_in, float* x_out, const gk::KvCacheBlock& cache,
                      const Workspace& workspace) const override {
    const gk::BlockWeights w = gk::bind_block(kc_, block);
    return block_decode_with(backend, past, rows, w, w, x_in, x_out, cache, workspace, Workspace{});
  }
  // Logits of projection_rows rows for the last new row: ln_f, then its product with each
  // projection row (the tied wte, or a piece of it).
  Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* ln_f, const float* projection,
                     int64_t projection_rows, const float* x_final, float* logits,
                     const Workspace& workspace) const override {
    const HeadDecodeLayout ws = head_decode_layout_for(workspace);
    const int64_t c = kc_.n_embd;
    STRATA_RETURN_IF_ERROR(backend.norm_forward(
        layer_norm(x_final + (rows - 1) * c, ln_f, ln_f + c, 1, c, ws.ln_out, ws.mean, ws.rstd)));
    return backend.gemm(kernels::ops::Gemm{false, true, 1, projection_rows, c, ws.ln_out, c, projection, c, 0.0f,
                                           logits, projection_rows});
  }
  size_t decode_bf16_scratch_bytes(device::Kind kind) const override {
    const size_t matmul_bytes = matmul_bf16_bytes(
        kc_, [kind](int64_t in, int64_t out) { return kernels::matmul_bf16_scratch_bytes(kind, in, out); });
    return bf16_scratch(kc_, matmul_bytes, nullptr).size_bytes;
  }
  // The block on its bf16 unit as stored: the 1-D tensors widened into `scratch` each call, the
  // matrices multiplied as bf16.
  Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const uint16_t* block,
                           const float* x_in, float* x_out, const gk::KvCacheBlock& cache, const Workspace& workspace,
                           const Workspace& scratch) const override {
    const Bf16Scratch layout = bf16_scratch_for(backend, scratch);
    const gk::BlockWeightsBf16 weights = gk::bind_block(kc_, block);
    const auto specs = gk::block_param_specs(kc_);
    for (int i = 0; i < gk::kBlockParamCount; ++i)
      if (specs[i].rank == 1)
        STRATA_RETURN_IF_ERROR(backend.cast_bf16_to_fp32(weights.at(i), const_cast<float*>(layout.vectors.at(i)),
                                                         static_cast<uint64_t>(specs[i].numel())));
    return block_decode_with(backend, past, rows, weights, layout.vectors, x_in, x_out, cache, workspace,
                             layout.matmul);
  }
  // The head on bf16 ln_f and wte as stored: ln_f widened into the scratch, the logits of all
  // vocab_size rows by matmul_bf16 against wte [vocab, C] (out-major).
  Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows, const uint16_t* ln_f,
                          const uint16_t* projection, const float* x_final, float* logits, const Workspace& workspace,
                          const Workspace& scratch) const override {
    const HeadDecodeLayout ws = head_decode_layout_for(workspace);
    const Bf16Scratch layout = bf16_scratch_for(backend, scratch);
    const int64_t c = kc_.n_embd;
    auto* gain = const_cast<float*>(layout.vectors.ln_1_weight);  // scratch slices of C floats each
    auto* bias = const_cast<float*>(layout.vectors.ln_1_bias);
    STRATA_RETURN_IF_ERROR(backend.cast_bf16_to_fp32(ln_f, gain, static_cast<uint64_t>(c)));
    STRATA_RETURN_IF_ERROR(backend.cast_bf16_to_fp32(ln_f + c, bias, static_cast<uint64_t>(c)));
    STRATA_RETURN_IF_ERROR(
        backend.norm_forward(layer_norm(x_final + (rows - 1) * c, gain, bias, 1, c, ws.ln_out, ws.mean, ws.rstd)));
    kernels::ops::MatmulBf16 op;
    op.w_out_major = true;
    op.rows = 1;
    op.in = c;
    op.out = kc_.vocab_size;
    op.x = ws.ln_out;
    op.w = projection;
    op.accumulate = false;
    op.y = logits;
    op.scratch = layout.matmul;
    return backend.matmul_bf16(op);
  }

 private:
  // wpe follows wte in the embedding unit.
  template <typename T>
  T* wpe(T* embed) const {
    return embed + kc_.vocab_size * kc_.n_embd;
  }
  // The workspace for `shape` with an attention scratch of `attention_bytes`: the block's or
  // the head's, whichever is larger (one workspace serves both, ordered by the stream).
  size_t workspace_bytes(size_t attention_bytes, const BatchShape& shape) const {
    return std::max(block_layout(kc_, shape, attention_bytes, nullptr).size_bytes,
                    head_layout(kc_, nullptr).size_bytes);
  }
  BlockLayout block_layout_for(const kernels::ComputeBackend& backend, const BatchShape& shape,
                               const Workspace& workspace) const {
    const BlockLayout ws = block_layout(kc_, shape, backend.attention_scratch_bytes(shape, kc_.n_head, kc_.head_dim()),
                                        workspace.data);
    assert(workspace.data != nullptr && workspace.size_bytes >= ws.size_bytes);
    return ws;
  }
  HeadDecodeLayout head_decode_layout_for(const Workspace& workspace) const {
    const HeadDecodeLayout ws = head_decode_layout(kc_, workspace.data);
    assert(workspace.data != nullptr && workspace.size_bytes >= ws.size_bytes);
    return ws;
  }
  Bf16Scratch bf16_scratch_for(const kernels::ComputeBackend& backend, const Workspace& scratch) const {
    const size_t matmul_bytes = matmul_bf16_bytes(
        kc_, [&backend](int64_t in, int64_t out) { return backend.matmul_bf16_scratch_bytes(in, out); });
    const Bf16Scratch layout = bf16_scratch(kc_, matmul_bytes, scratch.data);
    assert(scratch.data != nullptr && scratch.size_bytes >= layout.size_bytes);
    return layout;
  }
  kernels::ops::Embedding embedding_op(const BatchShape& shape, const float* embed, float* x0) const {
    kernels::ops::Embedding op;
    op.shape = shape;
    op.width = kc_.n_embd;
    op.vocab = kc_.vocab_size;
    op.table = embed;  // wte
    op.positions = embed == nullptr ? nullptr : wpe(embed);
    op.use_step_positions = true;
    op.x = x0;
    return op;
  }
  // GPT-2's causal self-attention inside the fused qkv rows (q, k, v at columns 0, C, 2C, rows
  // 3C apart) into att, within each packed example.
  kernels::ops::Attention attention_op(const BatchShape& shape, const BlockLayout& ws) const {
    const int64_t c = kc_.n_embd;
    kernels::ops::Attention op;
    op.shape = shape;
    op.n_head = kc_.n_head;
    op.n_kv_head = kc_.n_head;
    op.head_dim = kc_.head_dim();
    op.scale = 1.0f / std::sqrt(static_cast<float>(kc_.head_dim()));
    op.q = ws.qkv;
    op.q_stride = 3 * c;
    op.k = ws.qkv + c;
    op.v = ws.qkv + 2 * c;
    op.kv_stride = 3 * c;
    op.out = ws.att;
    op.out_stride = c;
    op.use_step_segments = true;
    op.scratch = ws.attention;
    return op;
  }
  // The forward of one block into the workspace; x_out skipped when null (recompute only needs
  // the activations, not the block's output).
  Status block_forward_into(kernels::ComputeBackend& backend, const BatchShape& shape, const gk::BlockWeights& w,
                            const float* x_in, float* x_out, const BlockLayout& ws,
                            const kernels::lora::BlockAdapters* adapters) const {
    namespace target = models::gpt2::lora_target;
    const int64_t n = shape.rows();
    const int64_t c = kc_.n_embd;
    STRATA_RETURN_IF_ERROR(backend.norm_forward(
        layer_norm(x_in, w.ln_1_weight, w.ln_1_bias, n, c, ws.ln1_out, ws.ln1_mean, ws.ln1_rstd)));
    STRATA_RETURN_IF_ERROR(linear_forward(backend, ws.ln1_out, w.attn_c_attn_weight, w.attn_c_attn_bias, nullptr, n,
                                          c, 3 * c, ws.qkv, adapters, target::c_attn));
    STRATA_RETURN_IF_ERROR(backend.attention_forward(attention_op(shape, ws)));
    STRATA_RETURN_IF_ERROR(linear_forward(backend, ws.att, w.attn_c_proj_weight, w.attn_c_proj_bias, x_in, n, c, c,
                                          ws.x1, adapters, target::attn_c_proj));
    STRATA_RETURN_IF_ERROR(backend.norm_forward(
        layer_norm(ws.x1, w.ln_2_weight, w.ln_2_bias, n, c, ws.ln2_out, ws.ln2_mean, ws.ln2_rstd)));
    STRATA_RETURN_IF_ERROR(linear_forward(backend, ws.ln2_out, w.mlp_c_fc_weight, w.mlp_c_fc_bias, nullptr, n, c,
                                          4 * c, ws.fc_pre, adapters, target::c_fc));
    STRATA_RETURN_IF_ERROR(backend.gelu_forward(kernels::ops::Gelu{ws.fc_pre, ws.fc_act, n * 4 * c}));
    if (x_out == nullptr) return Status();
    return linear_forward(backend, ws.fc_act, w.mlp_c_proj_weight, w.mlp_c_proj_bias, ws.x1, n, 4 * c, c, x_out,
                          adapters, target::mlp_c_proj);
  }

  // The block for `rows` new positions past..past + rows − 1 (gpt2_reference.h's block_decode):
  // their k and v join the cache first, then each new row attends over cache rows 0..its position.
  // The matrices come from `mats` (fp32 or bf16), the LayerNorm parameters and biases from
  // `vectors` (fp32); `matmul_scratch` serves the bf16 products.
  template <typename W>
  Status block_decode_with(kernels::ComputeBackend& backend, int64_t past, int64_t rows,
                           const gk::BlockTensors<const W>& mats, const gk::BlockWeights& vectors, const float* x_in,
                           float* x_out, const gk::KvCacheBlock& cache, const Workspace& workspace,
                           const Workspace& matmul_scratch) const {
    assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
    const BlockLayout ws = block_layout(
        kc_, BatchShape{1, rows}, backend.attention_decode_scratch_bytes(rows, kc_.n_head, cache.max_positions),
        workspace.data);
    assert(workspace.data != nullptr && workspace.size_bytes >= ws.size_bytes);
    const int64_t c = kc_.n_embd;
    const gk::BlockWeights& w = vectors;
    STRATA_RETURN_IF_ERROR(backend.norm_forward(
        layer_norm(x_in, w.ln_1_weight, w.ln_1_bias, rows, c, ws.ln1_out, ws.ln1_mean, ws.ln1_rstd)));
    STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.ln1_out, mats.attn_c_attn_weight, w.attn_c_attn_bias, nullptr,
                                         rows, c, 3 * c, ws.qkv, matmul_scratch));
    // k and v of the new rows (columns C and 2C of each qkv row) into cache rows past…
    STRATA_RETURN_IF_ERROR(
        backend.copy_rows(kernels::ops::CopyRows{cache.keys + past * c, c, ws.qkv + c, 3 * c, rows, c}));
    STRATA_RETURN_IF_ERROR(
        backend.copy_rows(kernels::ops::CopyRows{cache.values + past * c, c, ws.qkv + 2 * c, 3 * c, rows, c}));
    kernels::ops::AttentionDecode attention;
    attention.past = past;
    attention.rows = rows;
    attention.max_positions = cache.max_positions;
    attention.n_head = kc_.n_head;
    attention.n_kv_head = kc_.n_head;
    attention.head_dim = kc_.head_dim();
    attention.scale = 1.0f / std::sqrt(static_cast<float>(kc_.head_dim()));
    attention.q = ws.qkv;
    attention.q_stride = 3 * c;
    attention.keys = cache.keys;
    attention.values = cache.values;
    attention.kv_stride = c;
    attention.out = ws.att;
    attention.out_stride = c;
    attention.scratch = ws.attention;
    STRATA_RETURN_IF_ERROR(backend.attention_decode(attention));
    STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.att, mats.attn_c_proj_weight, w.attn_c_proj_bias, x_in, rows, c,
                                         c, ws.x1, matmul_scratch));
    STRATA_RETURN_IF_ERROR(backend.norm_forward(
        layer_norm(ws.x1, w.ln_2_weight, w.ln_2_bias, rows, c, ws.ln2_out, ws.ln2_mean, ws.ln2_rstd)));
    STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.ln2_out, mats.mlp_c_fc_weight, w.mlp_c_fc_bias, nullptr, rows, c,
                                         4 * c, ws.fc_pre, matmul_scratch));
    STRATA_RETURN_IF_ERROR(backend.gelu_forward(kernels::ops::Gelu{ws.fc_pre, ws.fc_act, rows * 4 * c}));
    return decode_linear(backend, ws.fc_act, mats.mlp_c_proj_weight, w.mlp_c_proj_bias, ws.x1, rows, 4 * c, c, x_out,
                         matmul_scratch);
  }

  gk::Config kc_;
};

Status Gpt2::block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                            const float* x_in, const float* d_out, float* d_in, float* grads,
                            const Workspace& workspace, bool recompute,
                            const kernels::lora::BlockAdapters* adapters) const {
  namespace target = models::gpt2::lora_target;
  const gk::BlockWeights w = gk::bind_block(kc_, block);
  const gk::BlockGrads g = grads == nullptr ? gk::BlockGrads{} : gk::bind_block(kc_, grads);  // null: frozen
  const BlockLayout ws = block_layout_for(backend, shape, workspace);
  if (recompute) STRATA_RETURN_IF_ERROR(block_forward_into(backend, shape, w, x_in, nullptr, ws, adapters));
  const int64_t n = shape.rows();
  const int64_t c = kc_.n_embd;

  // MLP: x_out = x1 + fc_act·W2 + b2. d_fc_act overwrites fc_act once dW2 (and the adapter's
  // d_A, d_B) have read it; each adapter's dx share joins its linear's dx after the base's.
  float* d_fc = ws.fc_act;
  STRATA_RETURN_IF_ERROR(backend.lora_backward_params(adapters, target::mlp_c_proj, ws.fc_act, n, 4 * c, c, d_out, 0));
  STRATA_RETURN_IF_ERROR(
      linear_backward_params(backend, ws.fc_act, d_out, n, 4 * c, c, g.mlp_c_proj_weight, g.mlp_c_proj_bias));
  STRATA_RETURN_IF_ERROR(linear_backward_input(backend, d_out, w.mlp_c_proj_weight, n, 4 * c, c, d_fc));
  STRATA_RETURN_IF_ERROR(backend.lora_backward_input(adapters, target::mlp_c_proj, n, 4 * c, d_fc, 0));
  STRATA_RETURN_IF_ERROR(backend.gelu_backward(kernels::ops::GeluBackward{d_fc, ws.fc_pre, n * 4 * c}));
  // d_ln2_out overwrites ln2_out once dW_fc has read it (LayerNorm backward recomputes x̂).
  float* d_ln2 = ws.ln2_out;
  STRATA_RETURN_IF_ERROR(backend.lora_backward_params(adapters, target::c_fc, ws.ln2_out, n, c, 4 * c, d_fc, 0));
  STRATA_RETURN_IF_ERROR(
      linear_backward_params(backend, ws.ln2_out, d_fc, n, c, 4 * c, g.mlp_c_fc_weight, g.mlp_c_fc_bias));
  STRATA_RETURN_IF_ERROR(linear_backward_input(backend, d_fc, w.mlp_c_fc_weight, n, c, 4 * c, d_ln2));
  STRATA_RETURN_IF_ERROR(backend.lora_backward_input(adapters, target::c_fc, n, c, d_ln2, 0));
  // d_x1 = d_out (residual) + LayerNorm-2 backward; built in d_in (d_out is not read again).
  if (d_in != d_out)
    STRATA_RETURN_IF_ERROR(backend.copy(d_in, d_out, static_cast<uint64_t>(n * c) * sizeof(float)));
  STRATA_RETURN_IF_ERROR(backend.norm_backward(layer_norm_backward(d_ln2, ws.x1, ws.ln2_mean, ws.ln2_rstd,
                                                                   w.ln_2_weight, n, c, d_in, /*accumulate=*/true,
                                                                   g.ln_2_weight, g.ln_2_bias)));

  // Attention: x1 = x_in + att·Wp + bp. d_att overwrites att once dWp has read it.
  float* d_att = ws.att;
  STRATA_RETURN_IF_ERROR(backend.lora_backward_params(adapters, target::attn_c_proj, ws.att, n, c, c, d_in, 0));
  STRATA_RETURN_IF_ERROR(
      linear_backward_params(backend, ws.att, d_in, n, c, c, g.attn_c_proj_weight, g.attn_c_proj_bias));
  STRATA_RETURN_IF_ERROR(linear_backward_input(backend, d_in, w.attn_c_proj_weight, n, c, c, d_att));
  STRATA_RETURN_IF_ERROR(backend.lora_backward_input(adapters, target::attn_c_proj, n, c, d_att, 0));
  float* d_qkv = ws.fc_pre;  // free since the GELU backward
  kernels::ops::AttentionBackward attention{attention_op(shape, ws), d_att, d_qkv, d_qkv + c, d_qkv + 2 * c};
  STRATA_RETURN_IF_ERROR(backend.attention_backward(attention));
  float* d_ln1 = ws.ln1_out;  // overwritten once dW_qkv has read ln1_out
  STRATA_RETURN_IF_ERROR(backend.lora_backward_params(adapters, target::c_attn, ws.ln1_out, n, c, 3 * c, d_qkv, 0));
  STRATA_RETURN_IF_ERROR(
      linear_backward_params(backend, ws.ln1_out, d_qkv, n, c, 3 * c, g.attn_c_attn_weight, g.attn_c_attn_bias));
  STRATA_RETURN_IF_ERROR(linear_backward_input(backend, d_qkv, w.attn_c_attn_weight, n, c, 3 * c, d_ln1));
  STRATA_RETURN_IF_ERROR(backend.lora_backward_input(adapters, target::c_attn, n, c, d_ln1, 0));
  return backend.norm_backward(layer_norm_backward(d_ln1, x_in, ws.ln1_mean, ws.ln1_rstd, w.ln_1_weight, n, c, d_in,
                                                   /*accumulate=*/true, g.ln_1_weight, g.ln_1_bias));
}

// The tied head, kHeadChunkRows rows at a time: ln_f, logits against wte, the loss (the backend
// keeps the step's running sum), then — with d_x_final — dLoss/dlogits back through the head.
// d_x_final null: the loss only. ln_f_grads null: a frozen ln_f; embed_grads null: no d_wte.
Status Gpt2::head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* ln_f,
                                   const float* embed, const float* x_final, float* d_x_final, float* ln_f_grads,
                                   float* embed_grads, const Workspace& workspace) const {
  const HeadLayout ws = head_layout(kc_, workspace.data);
  assert(workspace.data != nullptr && workspace.size_bytes >= ws.size_bytes);
  const bool gradient = d_x_final != nullptr;
  const int64_t n = shape.rows();
  const int64_t c = kc_.n_embd;
  const int64_t vocab = kc_.vocab_size;
  const float* ln_f_weight = ln_f;
  const float* ln_f_bias = ln_f + c;
  float* d_ln_f_weight = gradient ? ln_f_grads : nullptr;
  float* d_ln_f_bias = gradient && ln_f_grads != nullptr ? ln_f_grads + c : nullptr;
  float* d_wte = gradient ? embed_grads : nullptr;
  for (int64_t r0 = 0; r0 < n; r0 += kernels::kHeadChunkRows) {
    const int64_t rows = std::min(kernels::kHeadChunkRows, n - r0);
    const float* x = x_final + r0 * c;
    STRATA_RETURN_IF_ERROR(
        backend.norm_forward(layer_norm(x, ln_f_weight, ln_f_bias, rows, c, ws.ln_out, ws.mean, ws.rstd)));
    STRATA_RETURN_IF_ERROR(
        backend.gemm(kernels::ops::Gemm{false, true, rows, vocab, c, ws.ln_out, c, embed, c, 0.0f, ws.logits, vocab}));
    STRATA_RETURN_IF_ERROR(
        backend.cross_entropy(kernels::ops::CrossEntropy{ws.logits, rows, vocab, r0, gradient, ws.row_loss}));
    if (!gradient) continue;
    // ws.logits now holds dLoss/dlogits.
    STRATA_RETURN_IF_ERROR(
        backend.gemm(kernels::ops::Gemm{false, false, rows, c, vocab, ws.logits, vocab, embed, c, 0.0f, ws.d_ln_out, c}));
    if (d_wte != nullptr)
      STRATA_RETURN_IF_ERROR(
          backend.gemm(kernels::ops::Gemm{true, false, vocab, c, rows, ws.logits, vocab, ws.ln_out, c, 1.0f, d_wte, c}));
    STRATA_RETURN_IF_ERROR(backend.norm_backward(layer_norm_backward(ws.d_ln_out, x, ws.mean, ws.rstd, ln_f_weight,
                                                                     rows, c, d_x_final + r0 * c,
                                                                     /*accumulate=*/false, d_ln_f_weight,
                                                                     d_ln_f_bias)));
  }
  return Status();
}

}  // namespace

std::unique_ptr<const ModelDefinition> make_gpt2_definition(const ModelConfig& config) {
  return std::make_unique<Gpt2>(config);
}

}  // namespace strata::models
