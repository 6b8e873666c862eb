// models/decoder.cpp — the Llama family composed from the backend's operations (decoder.h).
// Each function is tests/reference/llama_reference.cpp's entry point rewritten op by op: the same products
// with the same operands, the same buffers overwritten at the same moments, the same order — the
// CPU backend's ops being those kernels' loops, that is what makes the bits equal.
#include "models/decoder.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>

namespace strata::models::decoder {
namespace {

namespace kn = kernels;
namespace ops = kernels::ops;
namespace lk = models::llama;
namespace target = models::llama::lora_target;

using Carver = kernels::WorkspaceCarver;

// What block_forward leaves behind and block_backward reads (N = B·T rows).
struct BlockLayout {
  float* n1;     // [N, C]  rms_1 output; the backward's d_n1
  float* rstd1;  // [N]
  float* q;      // [N, H·D] after RoPE
  float* k;      // [N, KV·D] after RoPE
  float* v;      // [N, KV·D]
  float* att;    // [N, H·D] attention output before o_proj; the backward's d_att
  float* h;      // [N, C]  residual stream after attention
  float* n2;     // [N, C]; the backward's d_n2
  float* rstd2;  // [N]
  float* gate;   // [N, I]; its own gradient in the backward
  float* up;     // [N, I]; its own gradient in the backward
  float* act;    // [N, I]  f(gate)·up; the backward's d_act
  float* dq;     // [N, H·D]  backward only
  float* dk;     // [N, KV·D]
  float* dv;     // [N, KV·D]
  float* cos;    // [T, D/2] each
  float* sin;
  kn::Workspace attention;  // the backend's attention_scratch_bytes
  size_t size_bytes;
};


BlockLayout block_layout(const lk::Config& config, const kn::BatchShape& shape, size_t attention_bytes,
                         float* base) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  Carver carve(base);
  BlockLayout l{};
  l.n1 = carve.take(n * c);
  l.rstd1 = carve.take(n);
  l.q = carve.take(n * config.q_width());
  l.k = carve.take(n * config.kv_width());
  l.v = carve.take(n * config.kv_width());
  l.att = carve.take(n * config.q_width());
  l.h = carve.take(n * c);
  l.n2 = carve.take(n * c);
  l.rstd2 = carve.take(n);
  l.gate = carve.take(n * inter);
  l.up = carve.take(n * inter);
  l.act = carve.take(n * inter);
  l.dq = carve.take(n * config.q_width());
  l.dk = carve.take(n * config.kv_width());
  l.dv = carve.take(n * config.kv_width());
  l.cos = carve.take(ops::rope_table_floats(shape.seq_len, config.head_dim));
  l.sin = carve.take(ops::rope_table_floats(shape.seq_len, config.head_dim));
  const auto attention_floats = static_cast<int64_t>((attention_bytes + sizeof(float) - 1) / sizeof(float));
  l.attention = kn::Workspace{carve.take(attention_floats), attention_bytes};
  l.size_bytes = carve.used_bytes();
  return l;
}

// The head's buffers for one chunk of kHeadChunkRows rows.
struct HeadLayout {
  float* normed;    // [R, C]
  float* rstd;      // [R]
  float* logits;    // [R, vocab]; becomes dLoss/dlogits in place
  float* d_normed;  // [R, C]
  float* row_loss;  // [R]
  size_t size_bytes;
};

HeadLayout head_layout(const lk::Config& config, float* base) {
  const int64_t r = kn::kHeadChunkRows;
  Carver carve(base);
  HeadLayout l{};
  l.normed = carve.take(r * config.n_embd);
  l.rstd = carve.take(r);
  l.logits = carve.take(r * config.vocab_size);
  l.d_normed = carve.take(r * config.n_embd);
  l.row_loss = carve.take(r);
  l.size_bytes = carve.used_bytes();
  return l;
}

size_t workspace_bytes(const lk::Config& config, const kn::BatchShape& max_shape, size_t attention_bytes) {
  return std::max(block_layout(config, max_shape, attention_bytes, nullptr).size_bytes,
                  head_layout(config, nullptr).size_bytes);
}

void check_workspace(const kn::Workspace& workspace, size_t needed_bytes) {
  assert(workspace.data != nullptr && workspace.size_bytes >= needed_bytes);
  assert(reinterpret_cast<uintptr_t>(workspace.data) % 64 == 0);
  (void)workspace;
  (void)needed_bytes;
}

void check_shape(const lk::Config& config, const kn::BatchShape& shape) {
  assert(config.n_head > 0 && config.n_kv_head > 0 && config.n_head % config.n_kv_head == 0);
  assert(config.head_dim % 2 == 0);
  assert(shape.batch > 0 && shape.seq_len > 0 && shape.seq_len <= config.n_ctx);
  (void)config;
  (void)shape;
}

using lk::rope_spec;  // llama_shape.h

// One block's composition: the config, options, shape and layout every op of it shares.
class Block {
 public:
  Block(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
        const kn::BatchShape& shape, const kn::Workspace& workspace, const kn::lora::BlockAdapters* adapters)
      : b_(backend),
        config_(config),
        options_(options),
        shape_(shape),
        adapters_(adapters),
        ws_(block_layout(config, shape,
                         backend.attention_scratch_bytes(shape, config.n_head, config.head_dim), workspace.data)) {
    check_shape(config, shape);
    check_workspace(workspace, ws_.size_bytes);
  }

  // llama_reference.cpp's block_forward_into; x_out null (the backward's recompute) stops before down_proj.
  Status forward(const lk::BlockWeights& w, const float* x_in, float* x_out) {
    const int64_t n = shape_.rows();
    const int64_t c = config_.n_embd;
    const int64_t inter = config_.intermediate_size;
    const int64_t qw = config_.q_width();
    const int64_t kvw = config_.kv_width();
    STRATA_RETURN_IF_ERROR(norm_forward(x_in, w.input_layernorm, ws_.n1, ws_.rstd1));
    STRATA_RETURN_IF_ERROR(linear(ws_.n1, w.q_proj, nullptr, c, qw, ws_.q));
    if (config_.qkv_bias) STRATA_RETURN_IF_ERROR(b_.add_bias({ws_.q, w.q_proj_bias, n, qw}));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::q_proj, ws_.n1, n, c, qw, ws_.q));
    STRATA_RETURN_IF_ERROR(linear(ws_.n1, w.k_proj, nullptr, c, kvw, ws_.k));
    if (config_.qkv_bias) STRATA_RETURN_IF_ERROR(b_.add_bias({ws_.k, w.k_proj_bias, n, kvw}));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::k_proj, ws_.n1, n, c, kvw, ws_.k));
    STRATA_RETURN_IF_ERROR(linear(ws_.n1, w.v_proj, nullptr, c, kvw, ws_.v));
    if (config_.qkv_bias) STRATA_RETURN_IF_ERROR(b_.add_bias({ws_.v, w.v_proj_bias, n, kvw}));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::v_proj, ws_.n1, n, c, kvw, ws_.v));
    // The tables once per forward (a recompute rebuilds them: the backward's inverse reads them).
    STRATA_RETURN_IF_ERROR(b_.rope_tables({rope_spec(config_), 0, shape_.seq_len, ws_.cos, ws_.sin}));
    STRATA_RETURN_IF_ERROR(rope(ws_.q, config_.n_head, false));
    STRATA_RETURN_IF_ERROR(rope(ws_.k, config_.n_kv_head, false));
    STRATA_RETURN_IF_ERROR(b_.attention_forward(attention()));
    STRATA_RETURN_IF_ERROR(linear(ws_.att, w.o_proj, x_in, qw, c, ws_.h));
    if (config_.o_bias) STRATA_RETURN_IF_ERROR(b_.add_bias({ws_.h, w.o_proj_bias, n, c}));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::o_proj, ws_.att, n, qw, c, ws_.h));
    STRATA_RETURN_IF_ERROR(norm_forward(ws_.h, w.post_attention_layernorm, ws_.n2, ws_.rstd2));
    STRATA_RETURN_IF_ERROR(linear(ws_.n2, w.gate_proj, nullptr, c, inter, ws_.gate));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::gate_proj, ws_.n2, n, c, inter, ws_.gate));
    STRATA_RETURN_IF_ERROR(linear(ws_.n2, w.up_proj, nullptr, c, inter, ws_.up));
    STRATA_RETURN_IF_ERROR(b_.lora_forward(adapters_, target::up_proj, ws_.n2, n, c, inter, ws_.up));
    STRATA_RETURN_IF_ERROR(b_.gated_forward({options_.gate, ws_.gate, ws_.up, ws_.act, n * inter}));
    if (x_out == nullptr) return Status();
    STRATA_RETURN_IF_ERROR(linear(ws_.act, w.down_proj, ws_.h, inter, c, x_out));
    return b_.lora_forward(adapters_, target::down_proj, ws_.act, n, inter, c, x_out);
  }

  // llama_reference.cpp's block_backward after its optional recompute.
  Status backward(const lk::BlockWeights& w, const float* x_in, const float* d_out, float* d_in,
                  const lk::BlockGrads& g) {
    const int64_t n = shape_.rows();
    const int64_t c = config_.n_embd;
    const int64_t inter = config_.intermediate_size;
    const int64_t qw = config_.q_width();
    const int64_t kvw = config_.kv_width();

    // MLP: x_out = h + act·Wdᵀ. d_act overwrites act once dWd (and the adapter's d_A, d_B) have
    // read it; each adapter's dx share joins its projection's dx after the base's.
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::down_proj, ws_.act, n, inter, c, d_out, 0));
    STRATA_RETURN_IF_ERROR(weight_grad(d_out, ws_.act, inter, c, g.down_proj));
    float* d_act = ws_.act;
    STRATA_RETURN_IF_ERROR(input_grad(d_out, w.down_proj, c, inter, 0.0f, d_act));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::down_proj, n, inter, d_act, 0));
    // gate and up become their own gradients in place.
    STRATA_RETURN_IF_ERROR(b_.gated_backward({options_.gate, d_act, ws_.gate, ws_.up, n * inter}));
    // d_n2 overwrites n2 once dWg and dWu have read it (the norm's backward reads h, not n2).
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::gate_proj, ws_.n2, n, c, inter, ws_.gate, 0));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::up_proj, ws_.n2, n, c, inter, ws_.up, 1));
    STRATA_RETURN_IF_ERROR(weight_grad(ws_.gate, ws_.n2, c, inter, g.gate_proj));
    STRATA_RETURN_IF_ERROR(weight_grad(ws_.up, ws_.n2, c, inter, g.up_proj));
    float* d_n2 = ws_.n2;
    STRATA_RETURN_IF_ERROR(input_grad(ws_.gate, w.gate_proj, inter, c, 0.0f, d_n2));
    STRATA_RETURN_IF_ERROR(input_grad(ws_.up, w.up_proj, inter, c, 1.0f, d_n2));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::gate_proj, n, c, d_n2, 0));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::up_proj, n, c, d_n2, 1));
    // d_h = d_out (the residual) + the second norm's backward, built in d_in.
    STRATA_RETURN_IF_ERROR(b_.rows_init({d_in, nullptr, d_out, n, c}));
    STRATA_RETURN_IF_ERROR(norm_backward(d_n2, ws_.h, ws_.rstd2, w.post_attention_layernorm, d_in,
                                         g.post_attention_layernorm));

    // Attention: h = x_in + att·Woᵀ (+ bo). d_att overwrites att once dWo has read it.
    if (config_.o_bias && g.o_proj_bias != nullptr)
      STRATA_RETURN_IF_ERROR(b_.column_sums({d_in, n, c, g.o_proj_bias}));
    float* d_att = ws_.att;
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::o_proj, ws_.att, n, qw, c, d_in, 0));
    STRATA_RETURN_IF_ERROR(weight_grad(d_in, ws_.att, qw, c, g.o_proj));
    STRATA_RETURN_IF_ERROR(input_grad(d_in, w.o_proj, c, qw, 0.0f, d_att));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::o_proj, n, qw, d_att, 0));
    ops::AttentionBackward attention_grad;
    attention_grad.forward = attention();
    attention_grad.d_out = d_att;
    attention_grad.dq = ws_.dq;
    attention_grad.dk = ws_.dk;
    attention_grad.dv = ws_.dv;
    STRATA_RETURN_IF_ERROR(b_.attention_backward(attention_grad));
    // Back through RoPE (its transpose) to the projections' outputs.
    STRATA_RETURN_IF_ERROR(rope(ws_.dq, config_.n_head, true));
    STRATA_RETURN_IF_ERROR(rope(ws_.dk, config_.n_kv_head, true));
    // The biases' gradients: the projections' output gradients summed over the rows.
    if (config_.qkv_bias) {
      if (g.q_proj_bias != nullptr) STRATA_RETURN_IF_ERROR(b_.column_sums({ws_.dq, n, qw, g.q_proj_bias}));
      if (g.k_proj_bias != nullptr) STRATA_RETURN_IF_ERROR(b_.column_sums({ws_.dk, n, kvw, g.k_proj_bias}));
      if (g.v_proj_bias != nullptr) STRATA_RETURN_IF_ERROR(b_.column_sums({ws_.dv, n, kvw, g.v_proj_bias}));
    }
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::q_proj, ws_.n1, n, c, qw, ws_.dq, 0));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::k_proj, ws_.n1, n, c, kvw, ws_.dk, 1));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_params(adapters_, target::v_proj, ws_.n1, n, c, kvw, ws_.dv, 2));
    STRATA_RETURN_IF_ERROR(weight_grad(ws_.dq, ws_.n1, c, qw, g.q_proj));
    STRATA_RETURN_IF_ERROR(weight_grad(ws_.dk, ws_.n1, c, kvw, g.k_proj));
    STRATA_RETURN_IF_ERROR(weight_grad(ws_.dv, ws_.n1, c, kvw, g.v_proj));
    // d_n1 overwrites n1 once the three weight gradients (and the adapters') have read it.
    float* d_n1 = ws_.n1;
    STRATA_RETURN_IF_ERROR(input_grad(ws_.dq, w.q_proj, qw, c, 0.0f, d_n1));
    STRATA_RETURN_IF_ERROR(input_grad(ws_.dk, w.k_proj, kvw, c, 1.0f, d_n1));
    STRATA_RETURN_IF_ERROR(input_grad(ws_.dv, w.v_proj, kvw, c, 1.0f, d_n1));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::q_proj, n, c, d_n1, 0));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::k_proj, n, c, d_n1, 1));
    STRATA_RETURN_IF_ERROR(b_.lora_backward_input(adapters_, target::v_proj, n, c, d_n1, 2));
    return norm_backward(d_n1, x_in, ws_.rstd1, w.input_layernorm, d_in, g.input_layernorm);
  }

 private:
  // RMSNorm of N dense rows.
  Status norm_forward(const float* x, const float* weight, float* y, float* rstd) {
    ops::NormForward op;
    op.kind = ops::NormKind::rms;
    op.x = x;
    op.x_stride = config_.n_embd;
    op.weight = weight;
    op.weight_offset = options_.norm_weight_offset;
    op.eps = config_.norm_eps;
    op.rows = shape_.rows();
    op.width = config_.n_embd;
    op.y = y;
    op.rstd = rstd;
    return b_.norm_forward(op);
  }
  // dx += the norm's input gradient (the residual stream already in dx); d_weight += Σ dy·x̂.
  Status norm_backward(const float* dy, const float* x, const float* rstd, const float* weight, float* dx,
                       float* d_weight) {
    ops::NormBackward op;
    op.kind = ops::NormKind::rms;
    op.dy = dy;
    op.x = x;
    op.rstd = rstd;
    op.weight = weight;
    op.weight_offset = options_.norm_weight_offset;
    op.rows = shape_.rows();
    op.width = config_.n_embd;
    op.dx = dx;
    op.accumulate = true;
    op.d_weight = d_weight;
    return b_.norm_backward(op);
  }
  // nn.Linear without its bias: y = x·Wᵀ, W [out, in] — with a residual, y starts as it and the
  // product adds (beta 1).
  Status linear(const float* x, const float* weight, const float* residual, int64_t in, int64_t out, float* y) {
    const int64_t n = shape_.rows();
    if (residual != nullptr) STRATA_RETURN_IF_ERROR(b_.rows_init({y, nullptr, residual, n, out}));
    return b_.gemm({false, true, n, out, in, x, in, weight, in, residual != nullptr ? 1.0f : 0.0f, y, out});
  }
  // dW [out, in] += dyᵀ·x; skipped when frozen (null).
  Status weight_grad(const float* dy, const float* x, int64_t in, int64_t out, float* d_weight) {
    if (d_weight == nullptr) return Status();
    const int64_t n = shape_.rows();
    return b_.gemm({true, false, out, in, n, dy, out, x, in, 1.0f, d_weight, in});
  }
  // dx [N, in] = dy·W (beta 0) or += (beta 1).
  Status input_grad(const float* dy, const float* weight, int64_t out, int64_t in, float beta, float* dx) {
    const int64_t n = shape_.rows();
    return b_.gemm({false, false, n, in, out, dy, out, weight, in, beta, dx, in});
  }
  Status rope(float* x, int64_t heads, bool inverse) {
    ops::Rope op;
    op.spec = rope_spec(config_);
    op.x = x;
    op.shape = shape_;
    op.heads = heads;
    op.first_position = 0;
    op.inverse = inverse;
    op.use_step_positions = true;
    op.cos = ws_.cos;
    op.sin = ws_.sin;
    return b_.rope(op);
  }
  ops::Attention attention() const {
    ops::Attention op;
    op.shape = shape_;
    op.n_head = config_.n_head;
    op.n_kv_head = config_.n_kv_head;
    op.head_dim = config_.head_dim;
    op.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
    op.q = ws_.q;
    op.q_stride = config_.q_width();
    op.k = ws_.k;
    op.v = ws_.v;
    op.kv_stride = config_.kv_width();
    op.out = ws_.att;
    op.out_stride = config_.q_width();
    op.use_step_segments = true;
    op.scratch = ws_.attention;
    return op;
  }

  kn::ComputeBackend& b_;
  const lk::Config& config_;
  const DecoderOptions& options_;
  kn::BatchShape shape_;
  const kn::lora::BlockAdapters* adapters_;
  BlockLayout ws_;
};

}  // namespace

size_t workspace_size_bytes(const kn::ComputeBackend& backend, const lk::Config& config,
                            const kn::BatchShape& max_shape) {
  return workspace_bytes(config, max_shape,
                         backend.attention_scratch_bytes(max_shape, config.n_head, config.head_dim));
}

size_t workspace_size_bytes(device::Kind kind, const lk::Config& config, const kn::BatchShape& max_shape) {
  return workspace_bytes(config, max_shape,
                         kn::attention_scratch_bytes(kind, max_shape, config.n_head, config.head_dim));
}

Status embedding_forward(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                         const kn::BatchShape& shape, const float* embed, float* x0) {
  check_shape(config, shape);
  ops::Embedding op;
  op.shape = shape;
  op.width = config.n_embd;
  op.vocab = config.vocab_size;
  op.table = embed;
  op.scale = options.embedding_scale;
  op.x = x0;
  return backend.embedding_lookup(op);
}

Status embedding_backward(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                          const kn::BatchShape& shape, const float* d_x0, float* d_embed) {
  check_shape(config, shape);
  ops::EmbeddingBackward op;
  op.forward.shape = shape;
  op.forward.width = config.n_embd;
  op.forward.vocab = config.vocab_size;
  op.forward.scale = options.embedding_scale;
  op.d_x = d_x0;
  op.d_table = d_embed;
  return backend.embedding_lookup_backward(op);
}

Status block_forward(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                     const kn::BatchShape& shape, const lk::BlockWeights& weights, const float* x_in, float* x_out,
                     const kn::Workspace& workspace, const kn::lora::BlockAdapters* adapters) {
  assert(x_out != nullptr && x_out != x_in);
  Block block(backend, config, options, shape, workspace, adapters);
  return block.forward(weights, x_in, x_out);
}

Status block_backward(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                      const kn::BatchShape& shape, const lk::BlockWeights& weights, const float* x_in,
                      const float* d_out, float* d_in, const lk::BlockGrads& grads, const kn::Workspace& workspace,
                      bool recompute, const kn::lora::BlockAdapters* adapters) {
  Block block(backend, config, options, shape, workspace, adapters);
  if (recompute) STRATA_RETURN_IF_ERROR(block.forward(weights, x_in, nullptr));
  return block.backward(weights, x_in, d_out, d_in, grads);
}

// llama_reference.cpp's head_run: each chunk normed, projected, its loss added (and, training, its
// logits turned into their gradient), then back through the projection and the norm.
Status head_forward_backward(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                             const kn::BatchShape& shape, const lk::HeadWeights& w, const float* x_final,
                             float* d_x_final, const lk::HeadGrads& grads, const kn::Workspace& workspace) {
  check_shape(config, shape);
  const HeadLayout ws = head_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const bool gradient = d_x_final != nullptr;
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t vocab = config.vocab_size;
  for (int64_t r0 = 0; r0 < n; r0 += kn::kHeadChunkRows) {
    const int64_t rows = std::min(kn::kHeadChunkRows, n - r0);
    const float* x = x_final + r0 * c;
    ops::NormForward norm;
    norm.kind = ops::NormKind::rms;
    norm.x = x;
    norm.x_stride = c;
    norm.weight = w.norm_weight;
    norm.weight_offset = options.norm_weight_offset;
    norm.eps = config.norm_eps;
    norm.rows = rows;
    norm.width = c;
    norm.y = ws.normed;
    norm.rstd = ws.rstd;
    STRATA_RETURN_IF_ERROR(backend.norm_forward(norm));
    STRATA_RETURN_IF_ERROR(backend.gemm({false, true, rows, vocab, c, ws.normed, c, w.lm_head, c, 0.0f, ws.logits,
                                         vocab}));
    STRATA_RETURN_IF_ERROR(backend.cross_entropy({ws.logits, rows, vocab, r0, gradient, ws.row_loss}));
    if (!gradient) continue;
    STRATA_RETURN_IF_ERROR(backend.gemm({false, false, rows, c, vocab, ws.logits, vocab, w.lm_head, c, 0.0f,
                                         ws.d_normed, c}));
    if (grads.d_lm_head != nullptr)
      STRATA_RETURN_IF_ERROR(backend.gemm({true, false, vocab, c, rows, ws.logits, vocab, ws.normed, c, 1.0f,
                                           grads.d_lm_head, c}));
    // d(norm weight) needs dy·x·rstd, which the norm's backward forms from x and rstd.
    ops::NormBackward norm_grad;
    norm_grad.kind = ops::NormKind::rms;
    norm_grad.dy = ws.d_normed;
    norm_grad.x = x;
    norm_grad.rstd = ws.rstd;
    norm_grad.weight = w.norm_weight;
    norm_grad.weight_offset = options.norm_weight_offset;
    norm_grad.rows = rows;
    norm_grad.width = c;
    norm_grad.dx = d_x_final + r0 * c;
    norm_grad.accumulate = false;
    norm_grad.d_weight = grads.d_norm_weight;
    STRATA_RETURN_IF_ERROR(backend.norm_backward(norm_grad));
  }
  return Status();
}

// ---------------------------------------------------------------------------------------------
// Decoding with a KV cache: llama_reference.cpp's block_decode_with / head_decode, op by op.
// ---------------------------------------------------------------------------------------------

namespace {

// A decode call's buffers for `rows` new rows: the training block's layout for shape {1, rows}
// (as GPT-2's decoding does; cos and sin then hold positions past..past + rows − 1), its
// attention region the backend's attention_decode scratch. The backward's dq/dk/dv stay unused,
// which changes no bits.
BlockLayout decode_layout(const lk::Config& config, int64_t rows, size_t attention_bytes, float* base) {
  return block_layout(config, kn::BatchShape{1, rows}, attention_bytes, base);
}

// The head's: the last row normed, and its rstd.
struct HeadDecodeLayout {
  float* normed;  // [C]
  float* rstd;    // [1]
  size_t size_bytes;
};

HeadDecodeLayout head_decode_layout(const lk::Config& config, float* base) {
  Carver carve(base);
  HeadDecodeLayout l{};
  l.normed = carve.take(config.n_embd);
  l.rstd = carve.take(1);
  l.size_bytes = carve.used_bytes();
  return l;
}

size_t decode_bytes(const lk::Config& config, int64_t max_rows, size_t attention_bytes) {
  return std::max(decode_layout(config, max_rows, attention_bytes, nullptr).size_bytes,
                  head_decode_layout(config, nullptr).size_bytes);
}

// The largest product a bf16 decode multiplies, as matmul_bf16_scratch_bytes' (in, out): the
// block's projections and the whole head ([vocab, C]).
int64_t bf16_max_in(const lk::Config& config) {
  return std::max({config.n_embd, config.q_width(), config.intermediate_size});
}
int64_t bf16_max_out(const lk::Config& config) {
  return std::max({config.q_width(), config.kv_width(), config.n_embd, config.intermediate_size, config.vocab_size});
}

// decode_bf16_scratch_bytes' layout: the two RMSNorm gains (the first also the head's final
// norm) and any attention biases widened, then the backend's matmul_bf16 scratch.
struct Bf16Scratch {
  float* norm_1;  // [C]
  float* norm_2;  // [C]
  float* q_bias;  // [H·D] with qkv_bias
  float* k_bias;  // [KV·D] with qkv_bias
  float* v_bias;  // [KV·D] with qkv_bias
  float* o_bias;  // [C] with o_bias
  kn::Workspace matmul;
  size_t size_bytes;
};

Bf16Scratch bf16_scratch(const lk::Config& config, size_t matmul_bytes, float* base) {
  Carver carve(base);
  Bf16Scratch l{};
  l.norm_1 = carve.take(config.n_embd);
  l.norm_2 = carve.take(config.n_embd);
  l.q_bias = carve.take(config.qkv_bias ? config.q_width() : 0);
  l.k_bias = carve.take(config.qkv_bias ? config.kv_width() : 0);
  l.v_bias = carve.take(config.qkv_bias ? config.kv_width() : 0);
  l.o_bias = carve.take(config.o_bias ? config.n_embd : 0);
  const auto matmul_floats = static_cast<int64_t>((matmul_bytes + sizeof(float) - 1) / sizeof(float));
  l.matmul = kn::Workspace{carve.take(matmul_floats), matmul_bytes};
  l.size_bytes = carve.used_bytes();
  return l;
}

size_t matmul_bf16_bytes(const kn::ComputeBackend& backend, const lk::Config& config) {
  return backend.matmul_bf16_scratch_bytes(bf16_max_in(config), bf16_max_out(config));
}

// A block's 1-D tensors as fp32 (the weights' own, or widened from bf16): the RMSNorm gains and
// the attention biases (null where the config has none).
struct SmallTensors {
  const float* norm_1 = nullptr;
  const float* norm_2 = nullptr;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* o_bias = nullptr;
};

// RMSNorm of `rows` rows x_stride apart into dense y.
Status rms_norm(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options, const float* x,
                int64_t x_stride, const float* weight, int64_t rows, float* y, float* rstd) {
  ops::NormForward op;
  op.kind = ops::NormKind::rms;
  op.x = x;
  op.x_stride = x_stride;
  op.weight = weight;
  op.weight_offset = options.norm_weight_offset;
  op.eps = config.norm_eps;
  op.rows = rows;
  op.width = config.n_embd;
  op.y = y;
  op.rstd = rstd;
  return backend.norm_forward(op);
}

// y = x·Wᵀ (+ residual: y starts as it and the product adds), W [out, in]: llama_reference.cpp's
// decode_linear — fp32 through the GEMM (linear_forward's), bf16 through matmul_bf16.
Status decode_linear(kn::ComputeBackend& backend, const float* x, const float* weight, const float* residual,
                     int64_t rows, int64_t in, int64_t out, float* y, const kn::Workspace& /*matmul*/) {
  if (residual != nullptr) STRATA_RETURN_IF_ERROR(backend.rows_init({y, nullptr, residual, rows, out}));
  return backend.gemm({false, true, rows, out, in, x, in, weight, in, residual != nullptr ? 1.0f : 0.0f, y, out});
}
Status decode_linear(kn::ComputeBackend& backend, const float* x, const uint16_t* weight, const float* residual,
                     int64_t rows, int64_t in, int64_t out, float* y, const kn::Workspace& matmul) {
  if (residual != nullptr) STRATA_RETURN_IF_ERROR(backend.rows_init({y, nullptr, residual, rows, out}));
  ops::MatmulBf16 op;
  op.w_out_major = true;  // nn.Linear's [out, in]
  op.rows = rows;
  op.in = in;
  op.out = out;
  op.x = x;
  op.w = weight;
  op.accumulate = residual != nullptr;
  op.y = y;
  op.scratch = matmul;
  return backend.matmul_bf16(op);
}

// llama_reference.cpp's block_decode_with: the matrices from `mats` (fp32 or bf16), the rest from `small`.
template <typename W>
Status block_decode_with(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                         int64_t past, int64_t rows, const lk::BlockTensors<const W>& mats, const SmallTensors& small,
                         const float* x_in, float* x_out, const kn::KvCacheBlock& cache,
                         const kn::Workspace& workspace, const kn::Workspace& matmul) {
  assert(config.n_head > 0 && config.n_kv_head > 0 && config.n_head % config.n_kv_head == 0);
  assert(config.head_dim % 2 == 0);
  assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
  const BlockLayout ws = decode_layout(
      config, rows, backend.attention_decode_scratch_bytes(rows, config.n_head, cache.max_positions), workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  STRATA_RETURN_IF_ERROR(rms_norm(backend, config, options, x_in, c, small.norm_1, rows, ws.n1, ws.rstd1));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.n1, mats.q_proj, nullptr, rows, c, qw, ws.q, matmul));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(backend.add_bias({ws.q, small.q_bias, rows, qw}));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.n1, mats.k_proj, nullptr, rows, c, kvw, ws.k, matmul));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(backend.add_bias({ws.k, small.k_bias, rows, kvw}));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.n1, mats.v_proj, nullptr, rows, c, kvw, ws.v, matmul));
  if (config.qkv_bias) STRATA_RETURN_IF_ERROR(backend.add_bias({ws.v, small.v_bias, rows, kvw}));
  // The new rows are one sequence of `rows` at positions past…: table row r (= r % rows) holds
  // position past + r, and CUDA's in-kernel angle is first_position + r % seq_len, the same.
  const ops::RopeSpec spec = rope_spec(config);
  STRATA_RETURN_IF_ERROR(backend.rope_tables({spec, past, rows, ws.cos, ws.sin}));
  ops::Rope rope;
  rope.spec = spec;
  rope.shape = kn::BatchShape{1, rows};
  rope.first_position = past;
  rope.cos = ws.cos;
  rope.sin = ws.sin;
  rope.x = ws.q;
  rope.heads = config.n_head;
  STRATA_RETURN_IF_ERROR(backend.rope(rope));
  rope.x = ws.k;
  rope.heads = config.n_kv_head;
  STRATA_RETURN_IF_ERROR(backend.rope(rope));
  STRATA_RETURN_IF_ERROR(backend.copy_rows({cache.keys + past * kvw, kvw, ws.k, kvw, rows, kvw}));
  STRATA_RETURN_IF_ERROR(backend.copy_rows({cache.values + past * kvw, kvw, ws.v, kvw, rows, kvw}));
  ops::AttentionDecode attention;
  attention.past = past;
  attention.rows = rows;
  attention.max_positions = cache.max_positions;
  attention.n_head = config.n_head;
  attention.n_kv_head = config.n_kv_head;
  attention.head_dim = config.head_dim;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  attention.q = ws.q;
  attention.q_stride = qw;
  attention.keys = cache.keys;
  attention.values = cache.values;
  attention.kv_stride = kvw;
  attention.out = ws.att;
  attention.out_stride = qw;
  attention.scratch = ws.attention;
  STRATA_RETURN_IF_ERROR(backend.attention_decode(attention));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.att, mats.o_proj, x_in, rows, qw, c, ws.h, matmul));
  if (config.o_bias) STRATA_RETURN_IF_ERROR(backend.add_bias({ws.h, small.o_bias, rows, c}));
  STRATA_RETURN_IF_ERROR(rms_norm(backend, config, options, ws.h, c, small.norm_2, rows, ws.n2, ws.rstd2));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.n2, mats.gate_proj, nullptr, rows, c, inter, ws.gate, matmul));
  STRATA_RETURN_IF_ERROR(decode_linear(backend, ws.n2, mats.up_proj, nullptr, rows, c, inter, ws.up, matmul));
  STRATA_RETURN_IF_ERROR(backend.gated_forward({options.gate, ws.gate, ws.up, ws.act, rows * inter}));
  return decode_linear(backend, ws.act, mats.down_proj, ws.h, rows, inter, c, x_out, matmul);
}

}  // namespace

size_t decode_workspace_size_bytes(const kn::ComputeBackend& backend, const lk::Config& config, int64_t max_rows,
                                   int64_t max_positions) {
  return decode_bytes(config, max_rows, backend.attention_decode_scratch_bytes(max_rows, config.n_head, max_positions));
}

size_t decode_workspace_size_bytes(device::Kind kind, const lk::Config& config, int64_t max_rows,
                                   int64_t max_positions) {
  return decode_bytes(config, max_rows,
                      kn::attention_decode_scratch_bytes(kind, max_rows, config.n_head, max_positions));
}

size_t decode_bf16_scratch_bytes(const kn::ComputeBackend& backend, const lk::Config& config) {
  return bf16_scratch(config, matmul_bf16_bytes(backend, config), nullptr).size_bytes;
}

size_t decode_bf16_scratch_bytes(device::Kind kind, const lk::Config& config) {
  return bf16_scratch(config, kn::matmul_bf16_scratch_bytes(kind, bf16_max_in(config), bf16_max_out(config)), nullptr)
      .size_bytes;
}

Status embedding_decode(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                        int64_t rows, const int32_t* tokens, const float* token_table, int64_t table_rows, float* x0) {
  assert(rows > 0 && tokens != nullptr);
  ops::Embedding op;
  op.shape = kn::BatchShape{1, rows};
  op.width = config.n_embd;
  op.vocab = table_rows;
  op.table = token_table;
  op.scale = options.embedding_scale;
  op.x = x0;
  op.tokens = tokens;
  return backend.embedding_lookup(op);
}

Status block_decode(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options, int64_t past,
                    int64_t rows, const lk::BlockWeights& w, const float* x_in, float* x_out,
                    const kn::KvCacheBlock& cache, const kn::Workspace& workspace) {
  const SmallTensors small{w.input_layernorm, w.post_attention_layernorm, w.q_proj_bias, w.k_proj_bias,
                           w.v_proj_bias, w.o_proj_bias};
  return block_decode_with(backend, config, options, past, rows, w, small, x_in, x_out, cache, workspace,
                           kn::Workspace{});
}

Status head_logits(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options, int64_t rows,
                   const float* norm_weight, const float* projection, int64_t projection_rows, const float* x_final,
                   float* logits, const kn::Workspace& workspace) {
  assert(rows > 0);
  const HeadDecodeLayout ws = head_decode_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t c = config.n_embd;
  STRATA_RETURN_IF_ERROR(
      rms_norm(backend, config, options, x_final + (rows - 1) * c, c, norm_weight, 1, ws.normed, ws.rstd));
  return backend.gemm({false, true, 1, projection_rows, c, ws.normed, c, projection, c, 0.0f, logits,
                       projection_rows});
}

Status block_decode_bf16(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                         int64_t past, int64_t rows, const lk::BlockWeightsBf16& w, const float* x_in, float* x_out,
                         const kn::KvCacheBlock& cache, const kn::Workspace& workspace,
                         const kn::Workspace& scratch) {
  const Bf16Scratch layout = bf16_scratch(config, matmul_bf16_bytes(backend, config), scratch.data);
  check_workspace(scratch, layout.size_bytes);
  const auto widen = [&](const uint16_t* src, int64_t count, float* dst) {
    return backend.cast_bf16_to_fp32(src, dst, static_cast<uint64_t>(count));
  };
  SmallTensors small{layout.norm_1, layout.norm_2};
  STRATA_RETURN_IF_ERROR(widen(w.input_layernorm, config.n_embd, layout.norm_1));
  STRATA_RETURN_IF_ERROR(widen(w.post_attention_layernorm, config.n_embd, layout.norm_2));
  if (config.qkv_bias) {
    STRATA_RETURN_IF_ERROR(widen(w.q_proj_bias, config.q_width(), layout.q_bias));
    STRATA_RETURN_IF_ERROR(widen(w.k_proj_bias, config.kv_width(), layout.k_bias));
    STRATA_RETURN_IF_ERROR(widen(w.v_proj_bias, config.kv_width(), layout.v_bias));
    small.q_bias = layout.q_bias;
    small.k_bias = layout.k_bias;
    small.v_bias = layout.v_bias;
  }
  if (config.o_bias) {
    STRATA_RETURN_IF_ERROR(widen(w.o_proj_bias, config.n_embd, layout.o_bias));
    small.o_bias = layout.o_bias;
  }
  return block_decode_with(backend, config, options, past, rows, w, small, x_in, x_out, cache, workspace,
                           layout.matmul);
}

Status head_logits_bf16(kn::ComputeBackend& backend, const lk::Config& config, const DecoderOptions& options,
                        int64_t rows, const lk::HeadWeightsBf16& w, const float* x_final, float* logits,
                        const kn::Workspace& workspace, const kn::Workspace& scratch) {
  assert(rows > 0);
  const HeadDecodeLayout ws = head_decode_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const Bf16Scratch layout = bf16_scratch(config, matmul_bf16_bytes(backend, config), scratch.data);
  check_workspace(scratch, layout.size_bytes);
  const int64_t c = config.n_embd;
  STRATA_RETURN_IF_ERROR(backend.cast_bf16_to_fp32(w.norm_weight, layout.norm_1, static_cast<uint64_t>(c)));
  STRATA_RETURN_IF_ERROR(
      rms_norm(backend, config, options, x_final + (rows - 1) * c, c, layout.norm_1, 1, ws.normed, ws.rstd));
  return decode_linear(backend, ws.normed, w.lm_head, nullptr, 1, c, config.vocab_size, logits, layout.matmul);
}

}  // namespace strata::models::decoder
