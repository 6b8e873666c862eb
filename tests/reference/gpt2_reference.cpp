// tests/reference/gpt2_reference.cpp — the reference CPU GPT-2: cblas_sgemm for the products,
// TBB for the rest.
// Every parallel loop writes disjoint outputs and every reduction runs sequentially inside one
// task, which is what makes the results independent of how TBB schedules the tasks.
#include "tests/reference/gpt2_reference.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include <cblas.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/lora/lora.h"
#include "kernels/op_math.h"
#include "tests/reference/decode_layout.h"

namespace strata::reference::gpt2 {

namespace cpu_math = kernels::cpu_math;
using kernels::WorkspaceCarver;
using kernels::cpu_rows::axpy;
using kernels::cpu_rows::cross_entropy_row;
using kernels::cpu_rows::LayerNormStats;
using kernels::cpu_rows::masked_row;
using kernels::cpu_rows::resolve_loss_normalizer;
using kernels::cpu_rows::softmax_scaled_inplace;
using kernels::op_math::gelu_tanh;
using kernels::op_math::gelu_tanh_derivative;
using reference::decode_layout_after;
using reference::head_decode_scratch_bytes;

namespace {

using cpu_math::column_sums_accumulate;
using cpu_math::for_rows;
using cpu_math::kColumnBlock;
using cpu_math::kRowGrain;
using cpu_math::pin_blas_to_one_thread;
using cpu_math::sgemm;

// ---------------------------------------------------------------------------------------------
// Workspace layout: one description shared by the sizing functions and the entry points, so
// the two can never disagree.
// ---------------------------------------------------------------------------------------------

using Carver = WorkspaceCarver;

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
  float* key_t;      // [B, H, head_dim, T]  per-head transposed keys
  float* value_t;    // [B, H, head_dim, T]  per-head transposed values
  float* rows;       // [B, H, 2, T]  one score row and one probability-gradient row per head
  size_t size_bytes;
};

BlockLayout block_layout(const Config& config, const BatchShape& shape, float* base) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  Carver carve(base);
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
  layout.key_t = carve.take(n * c);
  layout.value_t = carve.take(n * c);
  layout.rows = carve.take(shape.batch * config.n_head * 2 * shape.seq_len);
  layout.size_bytes = carve.used_bytes();
  return layout;
}

struct HeadLayout {
  float* ln_out;     // [R, C]
  float* mean;       // [R]
  float* rstd;       // [R]
  float* logits;     // [R, vocab]; becomes dLoss/dlogits in place
  float* d_ln_out;   // [R, C]
  float* row_loss;   // [R]
  size_t size_bytes;
};

HeadLayout head_layout(const Config& config, float* base) {
  const int64_t r = kHeadChunkRows;
  Carver carve(base);
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

// Every entry point starts here: checks the shape, and pins BLAS to one thread.
void begin_entry_point(const Config& config, const BatchShape& shape) {
  pin_blas_to_one_thread();
  assert(config.n_head > 0 && config.n_embd % config.n_head == 0);
  assert(shape.batch > 0 && shape.seq_len > 0 && shape.seq_len <= config.n_ctx);
  (void)config;
  (void)shape;
}

void check_workspace(const Workspace& workspace, size_t needed_bytes) {
  assert(workspace.data != nullptr && workspace.size_bytes >= needed_bytes);
  assert(reinterpret_cast<uintptr_t>(workspace.data) % 64 == 0);
  (void)workspace;
  (void)needed_bytes;
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

// Row r of y = b (+ residual row r when given): where a linear's product is then added.
void start_row_with_bias(const float* bias, const float* residual, int64_t r, int64_t out, float* y) {
  float* y_row = y + r * out;
  if (residual == nullptr) {
    std::memcpy(y_row, bias, static_cast<size_t>(out) * sizeof(float));
  } else {
    const float* res_row = residual + r * out;
    for (int64_t j = 0; j < out; ++j) y_row[j] = res_row[j] + bias[j];
  }
}

// y = x @ W + b (+ residual when given): rows start as b (+ residual), then sgemm adds x @ W.
void linear_forward(const float* x, const float* weight, const float* bias, const float* residual,
                    int64_t rows, int64_t in, int64_t out, float* y) {
  for_rows(rows, kRowGrain * 4, [&](int64_t r) { start_row_with_bias(bias, residual, r, out, y); });
  sgemm(false, false, rows, out, in, x, in, weight, out, 1.0f, y, out);
}

// dW += xᵀ·dy and db += Σ_rows dy (each skipped when null: frozen), and (when dx is given)
// dx = dy·Wᵀ.
void linear_backward(const float* x, const float* weight, const float* dy, int64_t rows,
                     int64_t in, int64_t out, float* dx, float* d_weight, float* d_bias) {
  if (d_weight != nullptr) sgemm(true, false, in, out, rows, x, in, dy, out, 1.0f, d_weight, out);
  if (d_bias != nullptr) column_sums_accumulate(dy, rows, out, d_bias);
  if (dx != nullptr) sgemm(false, true, rows, in, out, dy, out, weight, out, 0.0f, dx, in);
}

// Each targeted linear's adapter (lora.h's block entry points; nothing for an untargeted one).
using lora::adapter_backward_input;
using lora::adapter_backward_params;
using lora::adapter_forward;

// y = (x - mean)·rstd·w + b per row; statistics in double, biased variance, eps 1e-5.
// x rows are x_stride floats apart (so the head can pick the last position of each sequence).
void layernorm_forward(const float* x, int64_t x_stride, const float* weight, const float* bias,
                       int64_t rows, int64_t c, float* y, float* mean, float* rstd) {
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const float* x_row = x + r * x_stride;
    const LayerNormStats stats = kernels::cpu_rows::layernorm_stats(x_row, c, kLayerNormEps);
    float* y_row = y + r * c;
    for (int64_t j = 0; j < c; ++j) {
      y_row[j] = (x_row[j] - stats.mean) * stats.rstd * weight[j] + bias[j];
    }
    mean[r] = stats.mean;
    rstd[r] = stats.rstd;
  });
}

// dx (+)= rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂)) with dŷ = dy·w; dw += Σ dy·x̂; db += Σ dy
// (dw and db both null: frozen, skipped).
// x̂ is recomputed from x and the saved statistics rather than stored.
void layernorm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                        const float* weight, int64_t rows, int64_t c, float* dx, bool accumulate,
                        float* d_weight, float* d_bias) {
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const float* dy_row = dy + r * c;
    const float* x_row = x + r * c;
    const float mu = mean[r];
    const float rs = rstd[r];
    double sum_dxhat = 0.0;
    double sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const float dxhat = dy_row[j] * weight[j];
      const float xhat = (x_row[j] - mu) * rs;
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
    }
    const float mean_dxhat = static_cast<float>(sum_dxhat / static_cast<double>(c));
    const float mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    float* dx_row = dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x_row[j] - mu) * rs;
      const float g = rs * (dy_row[j] * weight[j] - mean_dxhat - xhat * mean_dxhat_xhat);
      dx_row[j] = accumulate ? dx_row[j] + g : g;
    }
  });
  assert((d_weight == nullptr) == (d_bias == nullptr));
  if (d_weight == nullptr) return;  // frozen
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    double acc_w[kColumnBlock] = {};
    double acc_b[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* dy_row = dy + r * c + c0;
      const float* x_row = x + r * c + c0;
      for (int64_t j = 0; j < width; ++j) {
        acc_w[j] += static_cast<double>(dy_row[j]) * ((x_row[j] - mean[r]) * rstd[r]);
        acc_b[j] += dy_row[j];
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      d_weight[c0 + j] += static_cast<float>(acc_w[j]);
      d_bias[c0 + j] += static_cast<float>(acc_b[j]);
    }
  });
}

// One (batch, head) inside the fused qkv rows: q, k and v share the row stride 3C.
// `segments`: the batch's (PackedRows), or null.
cpu_math::AttentionHead head_slice(const Config& config, const BatchShape& shape, const float* qkv, int64_t b,
                                   int64_t h, const int32_t* segments) {
  const int64_t c = config.n_embd;
  const int64_t hd = config.head_dim();
  const float* base = qkv + b * shape.seq_len * 3 * c + h * hd;
  return {shape.seq_len, hd, base, 3 * c, base + c, base + 2 * c, 3 * c,
          segments == nullptr ? nullptr : segments + b * shape.seq_len};
}

// att rows of (b, h): att_i = Σ_{j≤i} p_ij v_j.
void attention_forward_head(const Config& config, const BatchShape& shape, const float* qkv,
                            int64_t b, int64_t h, const int32_t* segments, float* key_t, float* p, float* att) {
  const cpu_math::AttentionHead s = head_slice(config, shape, qkv, b, h, segments);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t c = config.n_embd;
  cpu_math::attention_forward_head(s, scale, key_t, p, att + b * s.t_len * c + h * s.head_dim, c);
}

// Gradients of (b, h)'s q, k, v slices of d_qkv from d_att. All of (b, h)'s outputs belong to
// this task, and i runs in order, so the sums are fixed.
void attention_backward_head(const Config& config, const BatchShape& shape, const float* qkv,
                             const float* d_att, int64_t b, int64_t h, const int32_t* segments,
                             float* key_t, float* value_t, float* p, float* dp, float* d_qkv) {
  const cpu_math::AttentionHead s = head_slice(config, shape, qkv, b, h, segments);
  const cpu_math::AttentionHead ds = head_slice(config, shape, d_qkv, b, h, nullptr);
  float* dq = const_cast<float*>(ds.q);
  float* dk = const_cast<float*>(ds.k);
  float* dv = const_cast<float*>(ds.v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t c = config.n_embd;
  for (int64_t j = 0; j < s.t_len; ++j) {
    std::fill(dk + j * s.kv_stride, dk + j * s.kv_stride + s.head_dim, 0.0f);
    std::fill(dv + j * s.kv_stride, dv + j * s.kv_stride + s.head_dim, 0.0f);
  }
  cpu_math::attention_backward_head(s, scale, d_att + b * s.t_len * c + h * s.head_dim, c, key_t, value_t, p, dp, dq,
                                    s.q_stride, dk, dv);
}

void attention_forward(const Config& config, const BatchShape& shape, const BlockLayout& ws,
                       const int32_t* segments) {
  const int64_t heads = config.n_head;
  const int64_t t = shape.seq_len;
  const int64_t hd = config.head_dim();
  for_rows(shape.batch * heads, 1, [&](int64_t bh) {
    const int64_t b = bh / heads;
    const int64_t h = bh % heads;
    attention_forward_head(config, shape, ws.qkv, b, h, segments, ws.key_t + bh * hd * t,
                           ws.rows + bh * 2 * t, ws.att);
  });
}

void attention_backward(const Config& config, const BatchShape& shape, const BlockLayout& ws,
                        const float* d_att, const int32_t* segments, float* d_qkv) {
  const int64_t heads = config.n_head;
  const int64_t t = shape.seq_len;
  const int64_t hd = config.head_dim();
  for_rows(shape.batch * heads, 1, [&](int64_t bh) {
    const int64_t b = bh / heads;
    const int64_t h = bh % heads;
    float* rows = ws.rows + bh * 2 * t;
    attention_backward_head(config, shape, ws.qkv, d_att, b, h, segments, ws.key_t + bh * hd * t,
                            ws.value_t + bh * hd * t, rows, rows + t, d_qkv);
  });
}

// The forward of one block into the workspace; x_out skipped when null (recompute only needs
// the activations, not the block's output).
void block_forward_into(const Config& config, const BatchShape& shape, const BlockWeights& w,
                        const float* x_in, float* x_out, const BlockLayout& ws, const int32_t* segments,
                        const lora::BlockAdapters* adapters) {
  namespace target = models::gpt2::lora_target;
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  layernorm_forward(x_in, c, w.ln_1_weight, w.ln_1_bias, n, c, ws.ln1_out, ws.ln1_mean,
                    ws.ln1_rstd);
  linear_forward(ws.ln1_out, w.attn_c_attn_weight, w.attn_c_attn_bias, nullptr, n, c, 3 * c,
                 ws.qkv);
  adapter_forward(adapters, target::c_attn, ws.ln1_out, n, c, 3 * c, ws.qkv);
  attention_forward(config, shape, ws, segments);
  linear_forward(ws.att, w.attn_c_proj_weight, w.attn_c_proj_bias, x_in, n, c, c, ws.x1);
  adapter_forward(adapters, target::attn_c_proj, ws.att, n, c, c, ws.x1);
  layernorm_forward(ws.x1, c, w.ln_2_weight, w.ln_2_bias, n, c, ws.ln2_out, ws.ln2_mean,
                    ws.ln2_rstd);
  linear_forward(ws.ln2_out, w.mlp_c_fc_weight, w.mlp_c_fc_bias, nullptr, n, c, 4 * c,
                 ws.fc_pre);
  adapter_forward(adapters, target::c_fc, ws.ln2_out, n, c, 4 * c, ws.fc_pre);
  const int64_t hidden = n * 4 * c;
  for_rows((hidden + 1023) / 1024, 4, [&](int64_t chunk) {
    const int64_t begin = chunk * 1024;
    const int64_t end = std::min(hidden, begin + 1024);
    for (int64_t i = begin; i < end; ++i) ws.fc_act[i] = gelu_tanh(ws.fc_pre[i]);
  });
  if (x_out != nullptr) {
    linear_forward(ws.fc_act, w.mlp_c_proj_weight, w.mlp_c_proj_bias, ws.x1, n, 4 * c, c,
                   x_out);
    adapter_forward(adapters, target::mlp_c_proj, ws.fc_act, n, 4 * c, c, x_out);
  }
}

}  // namespace

size_t block_workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  return block_layout(config, max_shape, nullptr).size_bytes;
}

size_t head_workspace_size_bytes(const Config& config, const BatchShape& /*max_shape*/) {
  return head_layout(config, nullptr).size_bytes;
}

size_t workspace_size_bytes(const Config& config, const BatchShape& max_shape) {
  return std::max(block_workspace_size_bytes(config, max_shape),
                  head_workspace_size_bytes(config, max_shape));
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

namespace {
// The wpe row of token r: its position within its example when packed, else within the row.
int64_t position_of(const PackedRows& packed, const BatchShape& shape, int64_t r) {
  if (packed.positions == nullptr) return r % shape.seq_len;
  assert(packed.positions[r] >= 0 && packed.positions[r] < shape.seq_len);
  return packed.positions[r];
}
}  // namespace

void embedding_forward(const Config& config, const BatchShape& shape, const int32_t* tokens,
                       const float* wte, const float* wpe, float* x0, const PackedRows& packed) {
  begin_entry_point(config, shape);
  const int64_t c = config.n_embd;
  for_rows(shape.rows(), kRowGrain, [&](int64_t r) {
    const int32_t token = tokens[r];
    assert(token >= 0 && token < config.vocab_size);
    const float* tok_row = wte + static_cast<int64_t>(token) * c;
    const float* pos_row = wpe + position_of(packed, shape, r) * c;
    float* out = x0 + r * c;
    for (int64_t j = 0; j < c; ++j) out[j] = tok_row[j] + pos_row[j];
  });
}

void embedding_backward(const Config& config, const BatchShape& shape, const int32_t* tokens,
                        const float* d_x0, float* d_wte, float* d_wpe, const PackedRows& packed) {
  begin_entry_point(config, shape);
  const int64_t c = config.n_embd;
  const int64_t rows = shape.rows();
  // Tasks own column blocks of every row of d_wte and d_wpe and walk the B·T rows in order,
  // so repeated tokens (and the batch sum for positions) add up in one fixed order.
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t token = tokens[r];
      assert(token >= 0 && token < config.vocab_size);
      const float* g = d_x0 + r * c + c0;
      float* tok_row = d_wte + static_cast<int64_t>(token) * c + c0;
      float* pos_row = d_wpe + position_of(packed, shape, r) * c + c0;
      for (int64_t j = 0; j < width; ++j) {
        tok_row[j] += g[j];
        pos_row[j] += g[j];
      }
    }
  });
}

void block_forward(const Config& config, const BatchShape& shape, const BlockWeights& weights,
                   const float* x_in, float* x_out, const Workspace& workspace, const PackedRows& packed,
                   const lora::BlockAdapters* adapters) {
  begin_entry_point(config, shape);
  assert(x_out != nullptr && x_out != x_in);
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  block_forward_into(config, shape, weights, x_in, x_out, ws, packed.segments, adapters);
}

void block_backward(const Config& config, const BatchShape& shape, const BlockWeights& w,
                    const float* x_in, const float* d_out, float* d_in, const BlockGrads& g,
                    const Workspace& workspace, bool recompute, const PackedRows& packed,
                    const lora::BlockAdapters* adapters) {
  namespace target = models::gpt2::lora_target;
  begin_entry_point(config, shape);
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  if (recompute) block_forward_into(config, shape, w, x_in, nullptr, ws, packed.segments, adapters);
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;

  // MLP: x_out = x1 + fc_act·W2 + b2. d_fc_act overwrites fc_act once dW2 (and the adapter's
  // d_A, d_B) have read it; each adapter's dx share joins its linear's dx after the base's.
  float* d_fc = ws.fc_act;
  adapter_backward_params(adapters, target::mlp_c_proj, ws.fc_act, n, 4 * c, c, d_out);
  if (g.mlp_c_proj_weight != nullptr)
    sgemm(true, false, 4 * c, c, n, ws.fc_act, 4 * c, d_out, c, 1.0f, g.mlp_c_proj_weight, c);
  if (g.mlp_c_proj_bias != nullptr) column_sums_accumulate(d_out, n, c, g.mlp_c_proj_bias);
  sgemm(false, true, n, 4 * c, c, d_out, c, w.mlp_c_proj_weight, c, 0.0f, d_fc, 4 * c);
  adapter_backward_input(adapters, target::mlp_c_proj, n, 4 * c, d_fc);
  const int64_t hidden = n * 4 * c;
  for_rows((hidden + 1023) / 1024, 4, [&](int64_t chunk) {
    const int64_t begin = chunk * 1024;
    const int64_t end = std::min(hidden, begin + 1024);
    for (int64_t i = begin; i < end; ++i) d_fc[i] *= gelu_tanh_derivative(ws.fc_pre[i]);
  });
  // d_ln2_out overwrites ln2_out once dW_fc has read it (LayerNorm backward recomputes x̂).
  float* d_ln2 = ws.ln2_out;
  adapter_backward_params(adapters, target::c_fc, ws.ln2_out, n, c, 4 * c, d_fc);
  if (g.mlp_c_fc_weight != nullptr)
    sgemm(true, false, c, 4 * c, n, ws.ln2_out, c, d_fc, 4 * c, 1.0f, g.mlp_c_fc_weight, 4 * c);
  if (g.mlp_c_fc_bias != nullptr) column_sums_accumulate(d_fc, n, 4 * c, g.mlp_c_fc_bias);
  sgemm(false, true, n, c, 4 * c, d_fc, 4 * c, w.mlp_c_fc_weight, 4 * c, 0.0f, d_ln2, c);
  adapter_backward_input(adapters, target::c_fc, n, c, d_ln2);
  // d_x1 = d_out (residual) + LayerNorm-2 backward; built in d_in (d_out is not read again).
  if (d_in != d_out) std::memcpy(d_in, d_out, static_cast<size_t>(n * c) * sizeof(float));
  layernorm_backward(d_ln2, ws.x1, ws.ln2_mean, ws.ln2_rstd, w.ln_2_weight, n, c, d_in, true,
                     g.ln_2_weight, g.ln_2_bias);

  // Attention: x1 = x_in + att·Wp + bp. d_att overwrites att once dWp has read it.
  float* d_att = ws.att;
  adapter_backward_params(adapters, target::attn_c_proj, ws.att, n, c, c, d_in);
  linear_backward(ws.att, w.attn_c_proj_weight, d_in, n, c, c, nullptr, g.attn_c_proj_weight,
                  g.attn_c_proj_bias);
  sgemm(false, true, n, c, c, d_in, c, w.attn_c_proj_weight, c, 0.0f, d_att, c);
  adapter_backward_input(adapters, target::attn_c_proj, n, c, d_att);
  float* d_qkv = ws.fc_pre;  // free since the GELU backward
  attention_backward(config, shape, ws, d_att, packed.segments, d_qkv);
  float* d_ln1 = ws.ln1_out;  // overwritten once dW_qkv has read ln1_out
  adapter_backward_params(adapters, target::c_attn, ws.ln1_out, n, c, 3 * c, d_qkv);
  if (g.attn_c_attn_weight != nullptr)
    sgemm(true, false, c, 3 * c, n, ws.ln1_out, c, d_qkv, 3 * c, 1.0f, g.attn_c_attn_weight, 3 * c);
  if (g.attn_c_attn_bias != nullptr) column_sums_accumulate(d_qkv, n, 3 * c, g.attn_c_attn_bias);
  sgemm(false, true, n, c, 3 * c, d_qkv, 3 * c, w.attn_c_attn_weight, 3 * c, 0.0f, d_ln1, c);
  adapter_backward_input(adapters, target::c_attn, n, c, d_ln1);
  layernorm_backward(d_ln1, x_in, ws.ln1_mean, ws.ln1_rstd, w.ln_1_weight, n, c, d_in, true,
                     g.ln_1_weight, g.ln_1_bias);
}

namespace {

// Loss (and, when grads is non-null, every gradient) of the head, kHeadChunkRows rows at a time.
float head_run(const Config& config, const BatchShape& shape, const HeadWeights& w,
               const float* x_final, const int32_t* targets, float* d_x_final,
               const HeadGrads* grads, const Workspace& workspace, int64_t loss_normalizer_tokens) {
  begin_entry_point(config, shape);
  const HeadLayout ws = head_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t vocab = config.vocab_size;
  const int64_t normalizer = resolve_loss_normalizer(targets, n, loss_normalizer_tokens);
  const float inv_rows = normalizer > 0 ? 1.0f / static_cast<float>(normalizer) : 0.0f;
  double loss_sum = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, n - r0);
    const float* x = x_final + r0 * c;
    layernorm_forward(x, c, w.ln_f_weight, w.ln_f_bias, rows, c, ws.ln_out, ws.mean, ws.rstd);
    sgemm(false, true, rows, vocab, c, ws.ln_out, c, w.wte, c, 0.0f, ws.logits, vocab);
    for_rows(rows, 1, [&](int64_t r) {
      float* logits = ws.logits + r * vocab;
      const int32_t target = targets[r0 + r];
      assert(target < vocab);
      ws.row_loss[r] = target < 0 ? masked_row(logits, vocab, grads != nullptr)
                                  : cross_entropy_row(logits, vocab, target, grads != nullptr, inv_rows);
    });
    for (int64_t r = 0; r < rows; ++r) loss_sum += ws.row_loss[r];
    if (grads == nullptr) continue;
    // ws.logits now holds dLoss/dlogits.
    sgemm(false, false, rows, c, vocab, ws.logits, vocab, w.wte, c, 0.0f, ws.d_ln_out, c);
    if (grads->d_wte != nullptr)
      sgemm(true, false, vocab, c, rows, ws.logits, vocab, ws.ln_out, c, 1.0f, grads->d_wte, c);
    layernorm_backward(ws.d_ln_out, x, ws.mean, ws.rstd, w.ln_f_weight, rows, c,
                       d_x_final + r0 * c, false, grads->d_ln_f_weight, grads->d_ln_f_bias);
  }
  return normalizer > 0 ? static_cast<float>(loss_sum / static_cast<double>(normalizer)) : 0.0f;
}

}  // namespace

float head_forward_backward(const Config& config, const BatchShape& shape,
                            const HeadWeights& weights, const float* x_final,
                            const int32_t* targets, float* d_x_final, const HeadGrads& grads,
                            const Workspace& workspace, int64_t loss_normalizer_tokens) {
  assert(d_x_final != nullptr);
  return head_run(config, shape, weights, x_final, targets, d_x_final, &grads, workspace, loss_normalizer_tokens);
}

float head_loss(const Config& config, const BatchShape& shape, const HeadWeights& weights,
                const float* x_final, const int32_t* targets, const Workspace& workspace,
                int64_t loss_normalizer_tokens) {
  return head_run(config, shape, weights, x_final, targets, nullptr, nullptr, workspace, loss_normalizer_tokens);
}

void head_forward(const Config& config, const BatchShape& shape, const HeadWeights& w,
                  const float* x_final, float* logits, const Workspace& workspace) {
  begin_entry_point(config, shape);
  const HeadLayout ws = head_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t c = config.n_embd;
  const int64_t stride = shape.seq_len * c;  // one row per sequence: its last position
  for (int64_t b0 = 0; b0 < shape.batch; b0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, shape.batch - b0);
    layernorm_forward(x_final + b0 * stride + (shape.seq_len - 1) * c, stride, w.ln_f_weight,
                      w.ln_f_bias, rows, c, ws.ln_out, ws.mean, ws.rstd);
    sgemm(false, true, rows, config.vocab_size, c, ws.ln_out, c, w.wte, c, 0.0f,
          logits + b0 * config.vocab_size, config.vocab_size);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding with a KV cache (generation)
// ---------------------------------------------------------------------------------------------

namespace {

auto decode_layout(const Config& config, int64_t rows, int64_t max_positions, float* base) {
  return decode_layout_after(block_layout(config, BatchShape{1, rows}, base), config.n_head * max_positions, base);
}

size_t head_decode_size_bytes(const Config& config) { return head_decode_scratch_bytes(config.n_embd, 2); }

}  // namespace

size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions) {
  return std::max(decode_layout(config, max_rows, max_positions, nullptr).size_bytes, head_decode_size_bytes(config));
}

void head_decode(const Config& config, int64_t rows, const HeadWeights& w, const float* x_final, float* logits,
                 const Workspace& workspace) {
  pin_blas_to_one_thread();
  check_workspace(workspace, head_decode_size_bytes(config));
  const int64_t c = config.n_embd;
  Carver carve(workspace.data);
  float* ln_out = carve.take(c);
  float* mean = carve.take(1);
  float* rstd = carve.take(1);
  layernorm_forward(x_final + (rows - 1) * c, c, w.ln_f_weight, w.ln_f_bias, 1, c, ln_out, mean, rstd);
  sgemm(false, true, 1, config.vocab_size, c, ln_out, c, w.wte, c, 0.0f, logits, config.vocab_size);
}

void embedding_decode(const Config& config, int64_t past, int64_t rows, const int32_t* tokens, const float* wte,
                      const float* wpe, float* x0) {
  pin_blas_to_one_thread();
  assert(past >= 0 && rows > 0 && past + rows <= config.n_ctx);
  const int64_t c = config.n_embd;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = tokens[r];
    assert(token >= 0 && token < config.vocab_size);
    const float* tok_row = wte + static_cast<int64_t>(token) * c;
    const float* pos_row = wpe + (past + r) * c;
    for (int64_t j = 0; j < c; ++j) x0[r * c + j] = tok_row[j] + pos_row[j];
  }
}

namespace {

// A decode step's product, y = x @ W + b (+ residual): fp32 weights through linear_forward
// (the fp32 path's bits are today's), bf16 ones through cpu_math::matmul_bf16 after the same
// bias (+ residual) start.
void decode_linear(const float* x, const float* weight, const float* bias, const float* residual, int64_t rows,
                   int64_t in, int64_t out, float* y, float* /*pieces*/) {
  linear_forward(x, weight, bias, residual, rows, in, out, y);
}
void decode_linear(const float* x, const uint16_t* weight, const float* bias, const float* residual, int64_t rows,
                   int64_t in, int64_t out, float* y, float* pieces) {
  for (int64_t r = 0; r < rows; ++r) start_row_with_bias(bias, residual, r, out, y);
  cpu_math::matmul_bf16(false, rows, in, out, x, weight, true, y, pieces);
}

// The block's math as block_forward_into, for `rows` new positions past..past+rows-1: their
// k and v join the cache first, then each new row attends over cache rows 0..its position.
// The matrices come from `mats` (fp32 or bf16), the LayerNorm parameters and biases from `w`.
template <typename W>
void block_decode_with(const Config& config, int64_t past, int64_t rows, const BlockTensors<const W>& mats,
                       const BlockWeights& w, const float* x_in, float* x_out, const KvCacheBlock& cache,
                       const Workspace& workspace, float* pieces) {
  assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
  const auto layout = decode_layout(config, rows, cache.max_positions, workspace.data);
  check_workspace(workspace, layout.size_bytes);
  const BlockLayout& ws = layout.block;
  const int64_t c = config.n_embd;
  const int64_t hd = config.head_dim();
  layernorm_forward(x_in, c, w.ln_1_weight, w.ln_1_bias, rows, c, ws.ln1_out, ws.ln1_mean, ws.ln1_rstd);
  decode_linear(ws.ln1_out, mats.attn_c_attn_weight, w.attn_c_attn_bias, nullptr, rows, c, 3 * c, ws.qkv, pieces);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(cache.keys + (past + r) * c, ws.qkv + r * 3 * c + c, static_cast<size_t>(c) * sizeof(float));
    std::memcpy(cache.values + (past + r) * c, ws.qkv + r * 3 * c + 2 * c, static_cast<size_t>(c) * sizeof(float));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One task per head: its score row is its own, and each output element is one head's.
  for_rows(config.n_head, 1, [&](int64_t h) {
    float* p = layout.scores + h * cache.max_positions;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t count = past + r + 1;
      const float* q = ws.qkv + r * 3 * c + h * hd;
      for (int64_t j = 0; j < count; ++j) {
        const float* k = cache.keys + j * c + h * hd;
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += q[d] * k[d];
        p[j] = dot;
      }
      softmax_scaled_inplace(p, count, scale);
      float* out = ws.att + r * c + h * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = 0; j < count; ++j) axpy(p[j], cache.values + j * c + h * hd, out, hd);
    }
  });
  decode_linear(ws.att, mats.attn_c_proj_weight, w.attn_c_proj_bias, x_in, rows, c, c, ws.x1, pieces);
  layernorm_forward(ws.x1, c, w.ln_2_weight, w.ln_2_bias, rows, c, ws.ln2_out, ws.ln2_mean, ws.ln2_rstd);
  decode_linear(ws.ln2_out, mats.mlp_c_fc_weight, w.mlp_c_fc_bias, nullptr, rows, c, 4 * c, ws.fc_pre, pieces);
  const int64_t hidden = rows * 4 * c;
  for (int64_t i = 0; i < hidden; ++i) ws.fc_act[i] = gelu_tanh(ws.fc_pre[i]);
  decode_linear(ws.fc_act, mats.mlp_c_proj_weight, w.mlp_c_proj_bias, ws.x1, rows, 4 * c, c, x_out, pieces);
}

// decode_bf16_scratch_bytes' layout: the block's 1-D tensors widened (in canonical order), then
// matmul_bf16's pieces. The head's two ln_f vectors use the first slices.
struct Bf16Scratch {
  BlockWeights vectors;  // the 1-D members only; the matrices stay null
  float* pieces;
  size_t size_bytes;
};

Bf16Scratch bf16_scratch(const Config& config, float* base) {
  Bf16Scratch layout{};
  Carver carve(base);
  const auto specs = block_param_specs(config);
  for (int i = 0; i < kBlockParamCount; ++i)
    if (specs[i].rank == 1) layout.vectors.at(i) = carve.take(specs[i].numel());
  layout.pieces = carve.take(cpu_math::kBf16PiecesFloats);
  layout.size_bytes = carve.used_bytes();
  return layout;
}

}  // namespace

void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeights& w, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace) {
  pin_blas_to_one_thread();
  block_decode_with(config, past, rows, w, w, x_in, x_out, cache, workspace, nullptr);
}

size_t decode_bf16_scratch_bytes(const Config& config) { return bf16_scratch(config, nullptr).size_bytes; }

void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch) {
  pin_blas_to_one_thread();
  const Bf16Scratch layout = bf16_scratch(config, scratch.data);
  check_workspace(scratch, layout.size_bytes);
  const auto specs = block_param_specs(config);
  for (int i = 0; i < kBlockParamCount; ++i)
    if (specs[i].rank == 1)
      cpu_math::widen_bf16(weights.at(i), specs[i].numel(), const_cast<float*>(layout.vectors.at(i)));
  block_decode_with(config, past, rows, weights, layout.vectors, x_in, x_out, cache, workspace, layout.pieces);
}

void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& w, const float* x_final, float* logits,
                 const Workspace& workspace, const Workspace& scratch) {
  pin_blas_to_one_thread();
  check_workspace(workspace, head_decode_size_bytes(config));
  const Bf16Scratch layout = bf16_scratch(config, scratch.data);
  check_workspace(scratch, layout.size_bytes);
  const int64_t c = config.n_embd;
  auto* gain = const_cast<float*>(layout.vectors.ln_1_weight);  // scratch slices of C floats each
  auto* bias = const_cast<float*>(layout.vectors.ln_1_bias);
  cpu_math::widen_bf16(w.ln_f_weight, c, gain);
  cpu_math::widen_bf16(w.ln_f_bias, c, bias);
  Carver carve(workspace.data);
  float* ln_out = carve.take(c);
  float* mean = carve.take(1);
  float* rstd = carve.take(1);
  layernorm_forward(x_final + (rows - 1) * c, c, gain, bias, 1, c, ln_out, mean, rstd);
  cpu_math::matmul_bf16(true, 1, c, config.vocab_size, ln_out, w.wte, false, logits, layout.pieces);
}

}  // namespace strata::reference::gpt2
