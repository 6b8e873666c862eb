// models/gpt2.cpp — the GPT-2 definition (model.h): its units, init, workspace layout and training ops,
// composed of the backend's operations (kernels/ops.h) in the order kernels/gpt2 ran them, so the
// CPU gives the same bits. Decoding and the host ops still call the GPT-2 kernels.
#include "models/definitions.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "kernels/gpt2/gpt2.h"
#include "kernels/gpt2/gpt2_math.h"  // WorkspaceCarver, kLayerNormEps
#include "kernels/lora/lora.h"
#include "kernels/ops.h"
#include "models/definitions.h"

namespace strata::models {
namespace {

namespace gk = kernels::gpt2;

// --- GPT-2's training workspace ----------------------------------------------------------------
// The model's own layout (the ops allocate nothing): one description that the sizing functions
// and the ops carve alike, so the two can never disagree. It is kernels/gpt2's layout with the
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
  gk::WorkspaceCarver carve(base);
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
  const int64_t r = gk::kHeadChunkRows;
  gk::WorkspaceCarver carve(base);
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

// --- GPT-2 ---------------------------------------------------------------------------------
// Units embed (wte, wpe), h.{i}, ln_f. Init as GPT-2's: normal(0, init_std), residual
// projections scaled by 1/sqrt(2·n_layer), biases 0, LayerNorm weights 1.
class Gpt2 final : public ModelDefinition {
 public:
  explicit Gpt2(const ModelConfig& model) : ModelDefinition(model) {
    kc_ = gpt2_kernel_config(model);
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
    return kernels::decode_workspace_size_bytes(kind, kc_, max_rows, max_positions);
  }
  Status embedding_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const int32_t* tokens,
                          const float* token_table, int64_t table_rows, const float* positions,
                          float* x0) const override {
    gk::Config piece = kc_;
    piece.vocab_size = table_rows;
    return backend.embedding_decode(piece, past, rows, tokens, token_table, positions, x0);
  }
  Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const float* block,
                      const float* x_in, float* x_out, const gk::KvCacheBlock& cache,
                      const Workspace& workspace) const override {
    return backend.block_decode(kc_, past, rows, gk::bind_block(kc_, block), x_in, x_out, cache, workspace);
  }
  Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* ln_f, const float* projection,
                     int64_t projection_rows, const float* x_final, float* logits,
                     const Workspace& workspace) const override {
    gk::Config piece = kc_;
    piece.vocab_size = projection_rows;
    return backend.head_logits(piece, rows, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, projection}, x_final, logits,
                               workspace);
  }
  size_t decode_bf16_scratch_bytes(device::Kind kind) const override {
    return kernels::decode_bf16_scratch_bytes(kind, kc_);
  }
  Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const uint16_t* block,
                           const float* x_in, float* x_out, const gk::KvCacheBlock& cache, const Workspace& workspace,
                           const Workspace& scratch) const override {
    return backend.block_decode_bf16(kc_, past, rows, gk::bind_block(kc_, block), x_in, x_out, cache, workspace,
                                     scratch);
  }
  Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows, const uint16_t* ln_f,
                          const uint16_t* projection, const float* x_final, float* logits, const Workspace& workspace,
                          const Workspace& scratch) const override {
    return backend.head_logits_bf16(kc_, rows, gk::HeadWeightsBf16{ln_f, ln_f + kc_.n_embd, projection}, x_final,
                                    logits, workspace, scratch);
  }
  size_t host_workspace_size_bytes(const BatchShape& shape) const override {
    return gk::workspace_size_bytes(kc_, shape);
  }
  void host_embedding_forward(const BatchShape& shape, const int32_t* tokens, const float* embed,
                              float* x0) const override {
    gk::embedding_forward(kc_, shape, tokens, embed, wpe(embed), x0);
  }
  void host_block_forward(const BatchShape& shape, const float* block, const float* x_in, float* x_out,
                          const Workspace& workspace) const override {
    gk::block_forward(kc_, shape, gk::bind_block(kc_, block), x_in, x_out, workspace);
  }
  void host_head_forward(const BatchShape& shape, const float* ln_f, const float* embed, const float* x_final,
                         float* logits, const Workspace& workspace) const override {
    gk::head_forward(kc_, shape, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, embed}, x_final, logits, workspace);
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
    namespace target = kernels::lora::gpt2_target;
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

  gk::Config kc_;
};

Status Gpt2::block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                            const float* x_in, const float* d_out, float* d_in, float* grads,
                            const Workspace& workspace, bool recompute,
                            const kernels::lora::BlockAdapters* adapters) const {
  namespace target = kernels::lora::gpt2_target;
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
  for (int64_t r0 = 0; r0 < n; r0 += gk::kHeadChunkRows) {
    const int64_t rows = std::min(gk::kHeadChunkRows, n - r0);
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
