// tests/reference/llama_reference.cpp — the reference CPU Llama: the shared fixed-tile GEMM and
// attention head of kernels/cpu/cpu_math.h, with RMSNorm, RoPE and SwiGLU here. Every parallel
// loop writes disjoint outputs and every reduction runs in one task in a fixed order
// (llama_reference.h).
#include "tests/reference/llama_reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/lora/lora.h"
#include "kernels/op_math.h"
#include "tests/reference/decode_layout.h"

namespace strata::reference::llama {

namespace cpu_math = kernels::cpu_math;
namespace cpu_rows = kernels::cpu_rows;
using kernels::op_math::rope_cos_sin;
using kernels::op_math::rope_rotate_pair;
using kernels::op_math::silu_sigmoid;

using cpu_math::column_sums_accumulate;
using cpu_math::for_rows;
using cpu_math::kColumnBlock;
using cpu_math::kRowGrain;
using cpu_math::sgemm;
using kernels::kHeadChunkRows;

void rope_inverse_frequencies(const Config& config, double* inv_freq) {
  const kernels::ops::RopeSpec spec = rope_spec(config);
  for (int64_t i = 0; i < config.head_dim / 2; ++i) inv_freq[i] = kernels::op_math::rope_inverse_frequency(spec, i);
}

namespace {

using Carver = kernels::WorkspaceCarver;

// What block_forward leaves behind and block_backward reads (N = B·T rows).
struct BlockLayout {
  float* n1;      // [N, C]  rms_1 output
  float* rstd1;   // [N]
  float* q;       // [N, H·D] after RoPE
  float* k;       // [N, KV·D] after RoPE
  float* v;       // [N, KV·D]
  float* att;     // [N, H·D] attention output before o_proj
  float* h;       // [N, C]  residual stream after attention
  float* n2;      // [N, C]
  float* rstd2;   // [N]
  float* gate;    // [N, I]
  float* up;      // [N, I]
  float* act;     // [N, I]  silu(gate)·up
  float* dq;      // [N, H·D]  backward only
  float* dk;      // [N, KV·D]
  float* dv;      // [N, KV·D]
  float* cos;     // [T, D/2]
  float* sin;     // [T, D/2]
  float* key_t;   // [B, H, D, T]
  float* value_t; // [B, H, D, T]
  float* rows;    // [B, H, 2, T]
  size_t size_bytes;
};

BlockLayout block_layout(const Config& config, const BatchShape& shape, float* base) {
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t bh = shape.batch * config.n_head;
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
  l.gate = carve.take(n * config.intermediate_size);
  l.up = carve.take(n * config.intermediate_size);
  l.act = carve.take(n * config.intermediate_size);
  l.dq = carve.take(n * config.q_width());
  l.dk = carve.take(n * config.kv_width());
  l.dv = carve.take(n * config.kv_width());
  l.cos = carve.take(shape.seq_len * config.head_dim / 2);
  l.sin = carve.take(shape.seq_len * config.head_dim / 2);
  l.key_t = carve.take(bh * config.head_dim * shape.seq_len);
  l.value_t = carve.take(bh * config.head_dim * shape.seq_len);
  l.rows = carve.take(bh * 2 * shape.seq_len);
  l.size_bytes = carve.used_bytes();
  return l;
}

struct HeadLayout {
  float* normed;    // [R, C]
  float* rstd;      // [R]
  float* logits;    // [R, vocab]; becomes dLoss/dlogits in place
  float* d_normed;  // [R, C]
  float* row_loss;  // [R]
  size_t size_bytes;
};

HeadLayout head_layout(const Config& config, float* base) {
  const int64_t r = kHeadChunkRows;
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

void begin_entry_point(const Config& config, const BatchShape& shape) {
  cpu_math::pin_blas_to_one_thread();
  assert(config.n_head > 0 && config.n_kv_head > 0 && config.n_head % config.n_kv_head == 0);
  assert(config.head_dim % 2 == 0);
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

// y = x · Wᵀ (+ residual when given), W [out, in] as nn.Linear stores it.
void linear_forward(const float* x, const float* weight, const float* residual, int64_t rows, int64_t in, int64_t out,
                    float* y) {
  if (residual != nullptr) std::memcpy(y, residual, static_cast<size_t>(rows * out) * sizeof(float));
  sgemm(false, true, rows, out, in, x, in, weight, in, residual != nullptr ? 1.0f : 0.0f, y, out);
}

// dW += dyᵀ · x (skipped when d_weight is null: frozen); dx = dy · W (beta 0) or dx += dy · W
// (accumulate).
void linear_backward(const float* x, const float* weight, const float* dy, int64_t rows, int64_t in, int64_t out,
                     float* dx, bool accumulate, float* d_weight) {
  if (d_weight != nullptr) sgemm(true, false, out, in, rows, dy, out, x, in, 1.0f, d_weight, in);
  if (dx != nullptr) sgemm(false, false, rows, in, out, dy, out, weight, in, accumulate ? 1.0f : 0.0f, dx, in);
}

// Each targeted linear's adapter (lora.h's block entry points; nothing for an untargeted one).
using lora::adapter_backward_input;
using lora::adapter_backward_params;
using lora::adapter_forward;

// y[r, :] += bias for each of `rows` rows of `width`: nn.Linear's bias, added after the
// product (a separate step, so a projection's GEMM is the same with or without one).
void add_bias(float* y, const float* bias, int64_t rows, int64_t width) {
  for_rows(rows, kRowGrain, [&](int64_t r) {
    float* y_row = y + r * width;
    for (int64_t j = 0; j < width; ++j) y_row[j] += bias[j];
  });
}

// y = w · x · rstd per row, rstd = 1/sqrt(mean(x²) + eps) with the mean in double. x rows are
// x_stride floats apart (the head picks the last position of each sequence).
void rmsnorm_forward(const float* x, int64_t x_stride, const float* weight, int64_t rows, int64_t c, double eps,
                     float* y, float* rstd) {
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const float* x_row = x + r * x_stride;
    double sq = 0.0;
    for (int64_t j = 0; j < c; ++j) sq += static_cast<double>(x_row[j]) * x_row[j];
    const auto rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(c) + eps));
    float* y_row = y + r * c;
    for (int64_t j = 0; j < c; ++j) y_row[j] = weight[j] * (x_row[j] * rs);
    rstd[r] = rs;
  });
}

// g = dy·w; dx (+)= rstd·g − x·rstd³·mean(g·x); dw += Σ_rows dy·x·rstd (skipped when null).
void rmsnorm_backward(const float* dy, const float* x, const float* rstd, const float* weight, int64_t rows, int64_t c,
                      float* dx, bool accumulate, float* d_weight) {
  for_rows(rows, kRowGrain, [&](int64_t r) {
    const float* dy_row = dy + r * c;
    const float* x_row = x + r * c;
    const float rs = rstd[r];
    double dot = 0.0;
    for (int64_t j = 0; j < c; ++j) dot += static_cast<double>(dy_row[j] * weight[j]) * x_row[j];
    const auto coef = static_cast<float>(dot / static_cast<double>(c) * rs * rs * rs);
    float* dx_row = dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float g = rs * (dy_row[j] * weight[j]) - x_row[j] * coef;
      dx_row[j] = accumulate ? dx_row[j] + g : g;
    }
  });
  if (d_weight == nullptr) return;  // frozen
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    double acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* dy_row = dy + r * c + c0;
      const float* x_row = x + r * c + c0;
      for (int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(dy_row[j]) * (x_row[j] * rstd[r]);
    }
    for (int64_t j = 0; j < width; ++j) d_weight[c0 + j] += static_cast<float>(acc[j]);
  });
}

// cos/sin [T, D/2] of the angles at positions first..first+T−1 (op_math.h's rope_cos_sin).
void rope_tables(const Config& config, int64_t first_position, int64_t t_len, float* cos_table, float* sin_table) {
  const int64_t half = config.head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  rope_inverse_frequencies(config, inv_freq.data());
  for (int64_t t = 0; t < t_len; ++t)
    for (int64_t i = 0; i < half; ++i)
      rope_cos_sin(inv_freq[static_cast<size_t>(i)], first_position + t, cos_table + t * half + i,
                   sin_table + t * half + i);
}

// rotate_half RoPE on every head of [N, heads·D] rows in place, row r at table row r % T (or
// positions[r] for packed rows, each in [0, T)); `inverse` applies the transpose (the
// backward: the rotation by −angle).
void rope_apply(const Config& config, const BatchShape& shape, float* x, int64_t heads, const float* cos_table,
                const float* sin_table, bool inverse, const int32_t* positions) {
  const int64_t d = config.head_dim;
  const int64_t half = d / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for_rows(shape.rows(), kRowGrain, [&](int64_t r) {
    const int64_t t = positions == nullptr ? r % shape.seq_len : positions[r];
    assert(t >= 0 && t < shape.seq_len);
    const float* c_row = cos_table + t * half;
    const float* s_row = sin_table + t * half;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) rope_rotate_pair(x + (r * heads + h) * d, i, half, c_row[i], sign * s_row[i]);
  });
}

void block_forward_into(const Config& config, const BatchShape& shape, const BlockWeights& w, const float* x_in,
                        float* x_out, const BlockLayout& ws, const PackedRows& packed,
                        const lora::BlockAdapters* adapters) {
  namespace target = models::llama::lora_target;
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  rmsnorm_forward(x_in, c, w.input_layernorm, n, c, config.norm_eps, ws.n1, ws.rstd1);
  linear_forward(ws.n1, w.q_proj, nullptr, n, c, config.q_width(), ws.q);
  if (config.qkv_bias) add_bias(ws.q, w.q_proj_bias, n, config.q_width());
  adapter_forward(adapters, target::q_proj, ws.n1, n, c, config.q_width(), ws.q);
  linear_forward(ws.n1, w.k_proj, nullptr, n, c, config.kv_width(), ws.k);
  if (config.qkv_bias) add_bias(ws.k, w.k_proj_bias, n, config.kv_width());
  adapter_forward(adapters, target::k_proj, ws.n1, n, c, config.kv_width(), ws.k);
  linear_forward(ws.n1, w.v_proj, nullptr, n, c, config.kv_width(), ws.v);
  if (config.qkv_bias) add_bias(ws.v, w.v_proj_bias, n, config.kv_width());
  adapter_forward(adapters, target::v_proj, ws.n1, n, c, config.kv_width(), ws.v);
  rope_tables(config, 0, shape.seq_len, ws.cos, ws.sin);
  rope_apply(config, shape, ws.q, config.n_head, ws.cos, ws.sin, false, packed.positions);
  rope_apply(config, shape, ws.k, config.n_kv_head, ws.cos, ws.sin, false, packed.positions);
  const int64_t t = shape.seq_len;
  const int64_t d = config.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for_rows(shape.batch * config.n_head, 1, [&](int64_t bh) {
    const int64_t b = bh / config.n_head;
    const int64_t h = bh % config.n_head;
    const int64_t kv = kv_head_of(config, h);
    const cpu_math::AttentionHead s{t,
                                    d,
                                    ws.q + b * t * config.q_width() + h * d,
                                    config.q_width(),
                                    ws.k + b * t * config.kv_width() + kv * d,
                                    ws.v + b * t * config.kv_width() + kv * d,
                                    config.kv_width(),
                                    packed.segments == nullptr ? nullptr : packed.segments + b * t};
    cpu_math::attention_forward_head(s, scale, ws.key_t + bh * d * t, ws.rows + bh * 2 * t,
                                     ws.att + b * t * config.q_width() + h * d, config.q_width());
  });
  linear_forward(ws.att, w.o_proj, x_in, n, config.q_width(), c, ws.h);
  if (config.o_bias) add_bias(ws.h, w.o_proj_bias, n, c);
  adapter_forward(adapters, target::o_proj, ws.att, n, config.q_width(), c, ws.h);
  rmsnorm_forward(ws.h, c, w.post_attention_layernorm, n, c, config.norm_eps, ws.n2, ws.rstd2);
  linear_forward(ws.n2, w.gate_proj, nullptr, n, c, inter, ws.gate);
  adapter_forward(adapters, target::gate_proj, ws.n2, n, c, inter, ws.gate);
  linear_forward(ws.n2, w.up_proj, nullptr, n, c, inter, ws.up);
  adapter_forward(adapters, target::up_proj, ws.n2, n, c, inter, ws.up);
  const int64_t hidden = n * inter;
  for_rows((hidden + 1023) / 1024, 4, [&](int64_t chunk) {
    const int64_t end = std::min(hidden, chunk * 1024 + 1024);
    for (int64_t i = chunk * 1024; i < end; ++i) ws.act[i] = ws.gate[i] * silu_sigmoid(ws.gate[i]) * ws.up[i];
  });
  if (x_out != nullptr) {
    linear_forward(ws.act, w.down_proj, ws.h, n, inter, c, x_out);
    adapter_forward(adapters, target::down_proj, ws.act, n, inter, c, x_out);
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
  return std::max(block_workspace_size_bytes(config, max_shape), head_workspace_size_bytes(config, max_shape));
}

void embedding_forward(const Config& config, const BatchShape& shape, const int32_t* tokens, const float* embed,
                       float* x0) {
  begin_entry_point(config, shape);
  const int64_t c = config.n_embd;
  for_rows(shape.rows(), kRowGrain, [&](int64_t r) {
    const int32_t token = tokens[r];
    assert(token >= 0 && token < config.vocab_size);
    std::memcpy(x0 + r * c, embed + static_cast<int64_t>(token) * c, static_cast<size_t>(c) * sizeof(float));
  });
}

void embedding_backward(const Config& config, const BatchShape& shape, const int32_t* tokens, const float* d_x0,
                        float* d_embed) {
  begin_entry_point(config, shape);
  const int64_t c = config.n_embd;
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  // Column blocks per task, rows in order: repeated tokens add up in one fixed order.
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    for (int64_t r = 0; r < shape.rows(); ++r) {
      const float* g = d_x0 + r * c + c0;
      float* row = d_embed + static_cast<int64_t>(tokens[r]) * c + c0;
      for (int64_t j = 0; j < width; ++j) row[j] += g[j];
    }
  });
}

void block_forward(const Config& config, const BatchShape& shape, const BlockWeights& weights, const float* x_in,
                   float* x_out, const Workspace& workspace, const PackedRows& packed,
                   const lora::BlockAdapters* adapters) {
  begin_entry_point(config, shape);
  assert(x_out != nullptr && x_out != x_in);
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  block_forward_into(config, shape, weights, x_in, x_out, ws, packed, adapters);
}

void block_backward(const Config& config, const BatchShape& shape, const BlockWeights& w, const float* x_in,
                    const float* d_out, float* d_in, const BlockGrads& g, const Workspace& workspace, bool recompute,
                    const PackedRows& packed, const lora::BlockAdapters* adapters) {
  namespace target = models::llama::lora_target;
  begin_entry_point(config, shape);
  const BlockLayout ws = block_layout(config, shape, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  if (recompute) block_forward_into(config, shape, w, x_in, nullptr, ws, packed, adapters);
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();

  // MLP: x_out = h + act·Wdᵀ. d_act overwrites act once dWd (and the adapter's d_A, d_B) have
  // read it; each adapter's dx share joins its projection's dx after the base's.
  adapter_backward_params(adapters, target::down_proj, ws.act, n, inter, c, d_out, 0);
  if (g.down_proj != nullptr) sgemm(true, false, c, inter, n, d_out, c, ws.act, inter, 1.0f, g.down_proj, inter);
  float* d_act = ws.act;
  sgemm(false, false, n, inter, c, d_out, c, w.down_proj, inter, 0.0f, d_act, inter);
  adapter_backward_input(adapters, target::down_proj, n, inter, d_act, 0);
  // act = silu(gate)·up: gate and up become their own gradients in place.
  const int64_t hidden = n * inter;
  for_rows((hidden + 1023) / 1024, 4, [&](int64_t chunk) {
    const int64_t end = std::min(hidden, chunk * 1024 + 1024);
    for (int64_t i = chunk * 1024; i < end; ++i) {
      const float x = ws.gate[i];
      const float s = silu_sigmoid(x);
      const float da = d_act[i];
      ws.gate[i] = da * ws.up[i] * (s * (1.0f + x * (1.0f - s)));
      ws.up[i] = da * x * s;
    }
  });
  // d_n2 overwrites n2 once dWg and dWu have read it (RMSNorm's backward reads h, not n2).
  adapter_backward_params(adapters, target::gate_proj, ws.n2, n, c, inter, ws.gate, 0);
  adapter_backward_params(adapters, target::up_proj, ws.n2, n, c, inter, ws.up, 1);
  if (g.gate_proj != nullptr) sgemm(true, false, inter, c, n, ws.gate, inter, ws.n2, c, 1.0f, g.gate_proj, c);
  if (g.up_proj != nullptr) sgemm(true, false, inter, c, n, ws.up, inter, ws.n2, c, 1.0f, g.up_proj, c);
  float* d_n2 = ws.n2;
  sgemm(false, false, n, c, inter, ws.gate, inter, w.gate_proj, c, 0.0f, d_n2, c);
  sgemm(false, false, n, c, inter, ws.up, inter, w.up_proj, c, 1.0f, d_n2, c);
  adapter_backward_input(adapters, target::gate_proj, n, c, d_n2, 0);
  adapter_backward_input(adapters, target::up_proj, n, c, d_n2, 1);
  // d_h = d_out (residual) + RMSNorm-2 backward, built in d_in.
  if (d_in != d_out) std::memcpy(d_in, d_out, static_cast<size_t>(n * c) * sizeof(float));
  rmsnorm_backward(d_n2, ws.h, ws.rstd2, w.post_attention_layernorm, n, c, d_in, true, g.post_attention_layernorm);

  // Attention: h = x_in + att·Woᵀ (+ bo). d_att overwrites att once dWo has read it.
  if (config.o_bias && g.o_proj_bias != nullptr) column_sums_accumulate(d_in, n, c, g.o_proj_bias);
  float* d_att = ws.att;
  adapter_backward_params(adapters, target::o_proj, ws.att, n, qw, c, d_in, 0);
  if (g.o_proj != nullptr) sgemm(true, false, c, qw, n, d_in, c, ws.att, qw, 1.0f, g.o_proj, qw);
  sgemm(false, false, n, qw, c, d_in, c, w.o_proj, qw, 0.0f, d_att, qw);
  adapter_backward_input(adapters, target::o_proj, n, qw, d_att, 0);
  const int64_t t = shape.seq_len;
  const int64_t d = config.head_dim;
  const int64_t group = config.n_head / config.n_kv_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, k/v head): its query heads add into dk and dv in head order.
  for_rows(shape.batch * config.n_kv_head, 1, [&](int64_t bkv) {
    const int64_t b = bkv / config.n_kv_head;
    const int64_t kv = bkv % config.n_kv_head;
    float* dk = ws.dk + b * t * kvw + kv * d;
    float* dv = ws.dv + b * t * kvw + kv * d;
    for (int64_t j = 0; j < t; ++j) {
      std::fill(dk + j * kvw, dk + j * kvw + d, 0.0f);
      std::fill(dv + j * kvw, dv + j * kvw + d, 0.0f);
    }
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const int64_t bh = b * config.n_head + h;
      const cpu_math::AttentionHead s{t,
                                      d,
                                      ws.q + b * t * qw + h * d,
                                      qw,
                                      ws.k + b * t * kvw + kv * d,
                                      ws.v + b * t * kvw + kv * d,
                                      kvw,
                                      packed.segments == nullptr ? nullptr : packed.segments + b * t};
      float* rows = ws.rows + bh * 2 * t;
      cpu_math::attention_backward_head(s, scale, d_att + b * t * qw + h * d, qw, ws.key_t + bh * d * t,
                                        ws.value_t + bh * d * t, rows, rows + t, ws.dq + b * t * qw + h * d, qw, dk, dv);
    }
  });
  // Back through RoPE (its transpose) to the projections' outputs.
  rope_apply(config, shape, ws.dq, config.n_head, ws.cos, ws.sin, true, packed.positions);
  rope_apply(config, shape, ws.dk, config.n_kv_head, ws.cos, ws.sin, true, packed.positions);
  // The biases' gradients: the projections' output gradients summed over the rows.
  if (config.qkv_bias) {
    if (g.q_proj_bias != nullptr) column_sums_accumulate(ws.dq, n, qw, g.q_proj_bias);
    if (g.k_proj_bias != nullptr) column_sums_accumulate(ws.dk, n, kvw, g.k_proj_bias);
    if (g.v_proj_bias != nullptr) column_sums_accumulate(ws.dv, n, kvw, g.v_proj_bias);
  }
  adapter_backward_params(adapters, target::q_proj, ws.n1, n, c, qw, ws.dq, 0);
  adapter_backward_params(adapters, target::k_proj, ws.n1, n, c, kvw, ws.dk, 1);
  adapter_backward_params(adapters, target::v_proj, ws.n1, n, c, kvw, ws.dv, 2);
  linear_backward(ws.n1, w.q_proj, ws.dq, n, c, qw, nullptr, false, g.q_proj);
  linear_backward(ws.n1, w.k_proj, ws.dk, n, c, kvw, nullptr, false, g.k_proj);
  linear_backward(ws.n1, w.v_proj, ws.dv, n, c, kvw, nullptr, false, g.v_proj);
  // d_n1 overwrites n1 once the three weight gradients (and the adapters') have read it.
  float* d_n1_out = ws.n1;
  sgemm(false, false, n, c, qw, ws.dq, qw, w.q_proj, c, 0.0f, d_n1_out, c);
  sgemm(false, false, n, c, kvw, ws.dk, kvw, w.k_proj, c, 1.0f, d_n1_out, c);
  sgemm(false, false, n, c, kvw, ws.dv, kvw, w.v_proj, c, 1.0f, d_n1_out, c);
  adapter_backward_input(adapters, target::q_proj, n, c, d_n1_out, 0);
  adapter_backward_input(adapters, target::k_proj, n, c, d_n1_out, 1);
  adapter_backward_input(adapters, target::v_proj, n, c, d_n1_out, 2);
  rmsnorm_backward(d_n1_out, x_in, ws.rstd1, w.input_layernorm, n, c, d_in, true, g.input_layernorm);
}

namespace {

float head_run(const Config& config, const BatchShape& shape, const HeadWeights& w, const float* x_final,
               const int32_t* targets, float* d_x_final, const HeadGrads* grads, const Workspace& workspace,
               int64_t loss_normalizer_tokens) {
  begin_entry_point(config, shape);
  const HeadLayout ws = head_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t n = shape.rows();
  const int64_t c = config.n_embd;
  const int64_t vocab = config.vocab_size;
  const int64_t normalizer = cpu_rows::resolve_loss_normalizer(targets, n, loss_normalizer_tokens);
  const float inv_rows = normalizer > 0 ? 1.0f / static_cast<float>(normalizer) : 0.0f;
  double loss_sum = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, n - r0);
    const float* x = x_final + r0 * c;
    rmsnorm_forward(x, c, w.norm_weight, rows, c, config.norm_eps, ws.normed, ws.rstd);
    sgemm(false, true, rows, vocab, c, ws.normed, c, w.lm_head, c, 0.0f, ws.logits, vocab);
    for_rows(rows, 1, [&](int64_t r) {
      const int32_t target = targets[r0 + r];
      assert(target < vocab);
      float* logits = ws.logits + r * vocab;
      ws.row_loss[r] = target < 0 ? cpu_rows::masked_row(logits, vocab, grads != nullptr)
                                  : cpu_rows::cross_entropy_row(logits, vocab, target, grads != nullptr, inv_rows);
    });
    for (int64_t r = 0; r < rows; ++r) loss_sum += ws.row_loss[r];
    if (grads == nullptr) continue;
    sgemm(false, false, rows, c, vocab, ws.logits, vocab, w.lm_head, c, 0.0f, ws.d_normed, c);
    if (grads->d_lm_head != nullptr)
      sgemm(true, false, vocab, c, rows, ws.logits, vocab, ws.normed, c, 1.0f, grads->d_lm_head, c);
    // d(norm weight) needs dy·x·rstd, which is what rmsnorm_backward forms from x and rstd.
    rmsnorm_backward(ws.d_normed, x, ws.rstd, w.norm_weight, rows, c, d_x_final + r0 * c, false, grads->d_norm_weight);
  }
  return normalizer > 0 ? static_cast<float>(loss_sum / static_cast<double>(normalizer)) : 0.0f;
}

}  // namespace

float head_forward_backward(const Config& config, const BatchShape& shape, const HeadWeights& weights,
                            const float* x_final, const int32_t* targets, float* d_x_final, const HeadGrads& grads,
                            const Workspace& workspace, int64_t loss_normalizer_tokens) {
  assert(d_x_final != nullptr);
  return head_run(config, shape, weights, x_final, targets, d_x_final, &grads, workspace, loss_normalizer_tokens);
}

float head_loss(const Config& config, const BatchShape& shape, const HeadWeights& weights, const float* x_final,
                const int32_t* targets, const Workspace& workspace, int64_t loss_normalizer_tokens) {
  return head_run(config, shape, weights, x_final, targets, nullptr, nullptr, workspace, loss_normalizer_tokens);
}

void head_forward(const Config& config, const BatchShape& shape, const HeadWeights& w, const float* x_final,
                  float* logits, const Workspace& workspace) {
  begin_entry_point(config, shape);
  const HeadLayout ws = head_layout(config, workspace.data);
  check_workspace(workspace, ws.size_bytes);
  const int64_t c = config.n_embd;
  const int64_t stride = shape.seq_len * c;
  for (int64_t b0 = 0; b0 < shape.batch; b0 += kHeadChunkRows) {
    const int64_t rows = std::min(kHeadChunkRows, shape.batch - b0);
    rmsnorm_forward(x_final + b0 * stride + (shape.seq_len - 1) * c, stride, w.norm_weight, rows, c, config.norm_eps,
                    ws.normed, ws.rstd);
    sgemm(false, true, rows, config.vocab_size, c, ws.normed, c, w.lm_head, c, 0.0f, logits + b0 * config.vocab_size,
          config.vocab_size);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding with a KV cache (generation)
// ---------------------------------------------------------------------------------------------

namespace {

auto decode_layout(const Config& config, int64_t rows, int64_t max_positions, float* base) {
  return reference::decode_layout_after(block_layout(config, BatchShape{1, rows}, base), config.n_head * max_positions,
                                        base);
}

size_t head_decode_size_bytes(const Config& config) { return reference::head_decode_scratch_bytes(config.n_embd, 1); }

}  // namespace

size_t decode_workspace_size_bytes(const Config& config, int64_t max_rows, int64_t max_positions) {
  return std::max(decode_layout(config, max_rows, max_positions, nullptr).size_bytes, head_decode_size_bytes(config));
}

void embedding_decode(const Config& config, int64_t rows, const int32_t* tokens, const float* embed, float* x0) {
  embedding_forward(config, BatchShape{1, rows}, tokens, embed, x0);
}

namespace {

// A decode step's product y = x · Wᵀ (+ residual): fp32 weights through linear_forward (the
// fp32 path's bits are today's), bf16 ones through cpu_math::matmul_bf16.
void decode_linear(const float* x, const float* weight, const float* residual, int64_t rows, int64_t in, int64_t out,
                   float* y, float* /*pieces*/) {
  linear_forward(x, weight, residual, rows, in, out, y);
}
void decode_linear(const float* x, const uint16_t* weight, const float* residual, int64_t rows, int64_t in,
                   int64_t out, float* y, float* pieces) {
  if (residual != nullptr) std::memcpy(y, residual, static_cast<size_t>(rows * out) * sizeof(float));
  cpu_math::matmul_bf16(true, rows, in, out, x, weight, residual != nullptr, y, pieces);
}

// A block's small tensors as fp32 (the weights' own, or widened from bf16): the RMSNorm gains
// and the attention biases (nullptr where the config has none).
struct SmallTensors {
  const float* norm_1 = nullptr;
  const float* norm_2 = nullptr;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* o_bias = nullptr;
};

// block_decode's math; the matrices from `mats` (fp32 or bf16), the rest from `small`.
template <typename W>
void block_decode_with(const Config& config, int64_t past, int64_t rows, const BlockTensors<const W>& mats,
                       const SmallTensors& small, const float* x_in, float* x_out, const KvCacheBlock& cache,
                       const Workspace& workspace, float* pieces) {
  assert(config.n_head > 0 && config.n_kv_head > 0 && config.n_head % config.n_kv_head == 0);
  assert(past >= 0 && rows > 0 && past + rows <= cache.max_positions && x_out != x_in);
  const auto layout = decode_layout(config, rows, cache.max_positions, workspace.data);
  check_workspace(workspace, layout.size_bytes);
  const BlockLayout& ws = layout.block;
  const BatchShape shape{1, rows};
  const int64_t c = config.n_embd;
  const int64_t inter = config.intermediate_size;
  const int64_t d = config.head_dim;
  const int64_t qw = config.q_width();
  const int64_t kvw = config.kv_width();
  rmsnorm_forward(x_in, c, small.norm_1, rows, c, config.norm_eps, ws.n1, ws.rstd1);
  decode_linear(ws.n1, mats.q_proj, nullptr, rows, c, qw, ws.q, pieces);
  if (config.qkv_bias) add_bias(ws.q, small.q_bias, rows, qw);
  decode_linear(ws.n1, mats.k_proj, nullptr, rows, c, kvw, ws.k, pieces);
  if (config.qkv_bias) add_bias(ws.k, small.k_bias, rows, kvw);
  decode_linear(ws.n1, mats.v_proj, nullptr, rows, c, kvw, ws.v, pieces);
  if (config.qkv_bias) add_bias(ws.v, small.v_bias, rows, kvw);
  rope_tables(config, past, rows, ws.cos, ws.sin);
  rope_apply(config, shape, ws.q, config.n_head, ws.cos, ws.sin, false, nullptr);
  rope_apply(config, shape, ws.k, config.n_kv_head, ws.cos, ws.sin, false, nullptr);
  std::memcpy(cache.keys + past * kvw, ws.k, static_cast<size_t>(rows * kvw) * sizeof(float));
  std::memcpy(cache.values + past * kvw, ws.v, static_cast<size_t>(rows * kvw) * sizeof(float));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per query head: its score row is its own, and each output element is one head's.
  for_rows(config.n_head, 1, [&](int64_t h) {
    const int64_t kv = kv_head_of(config, h);
    float* p = layout.scores + h * cache.max_positions;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t count = past + r + 1;
      const float* q = ws.q + r * qw + h * d;
      for (int64_t j = 0; j < count; ++j) {
        const float* k = cache.keys + j * kvw + kv * d;
        float dot = 0.0f;
        for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
        p[j] = dot;
      }
      cpu_rows::softmax_scaled_inplace(p, count, scale);
      float* out = ws.att + r * qw + h * d;
      std::fill(out, out + d, 0.0f);
      for (int64_t j = 0; j < count; ++j) cpu_rows::axpy(p[j], cache.values + j * kvw + kv * d, out, d);
    }
  });
  decode_linear(ws.att, mats.o_proj, x_in, rows, qw, c, ws.h, pieces);
  if (config.o_bias) add_bias(ws.h, small.o_bias, rows, c);
  rmsnorm_forward(ws.h, c, small.norm_2, rows, c, config.norm_eps, ws.n2, ws.rstd2);
  decode_linear(ws.n2, mats.gate_proj, nullptr, rows, c, inter, ws.gate, pieces);
  decode_linear(ws.n2, mats.up_proj, nullptr, rows, c, inter, ws.up, pieces);
  const int64_t hidden = rows * inter;
  for (int64_t i = 0; i < hidden; ++i) ws.act[i] = ws.gate[i] * silu_sigmoid(ws.gate[i]) * ws.up[i];
  decode_linear(ws.act, mats.down_proj, ws.h, rows, inter, c, x_out, pieces);
}

// decode_bf16_scratch_bytes' layout: the two RMSNorm gains and any attention biases widened,
// then matmul_bf16's pieces.
struct Bf16Scratch {
  float* norm_1;  // [C]; the head's final norm too
  float* norm_2;  // [C]
  float* q_bias;  // [H·D] with qkv_bias
  float* k_bias;  // [KV·D] with qkv_bias
  float* v_bias;  // [KV·D] with qkv_bias
  float* o_bias;  // [C] with o_bias
  float* pieces;
  size_t size_bytes;
};

Bf16Scratch bf16_scratch(const Config& config, float* base) {
  Carver carve(base);
  Bf16Scratch layout{};
  layout.norm_1 = carve.take(config.n_embd);
  layout.norm_2 = carve.take(config.n_embd);
  layout.q_bias = carve.take(config.qkv_bias ? config.q_width() : 0);
  layout.k_bias = carve.take(config.qkv_bias ? config.kv_width() : 0);
  layout.v_bias = carve.take(config.qkv_bias ? config.kv_width() : 0);
  layout.o_bias = carve.take(config.o_bias ? config.n_embd : 0);
  layout.pieces = carve.take(cpu_math::kBf16PiecesFloats);
  layout.size_bytes = carve.used_bytes();
  return layout;
}

}  // namespace

void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeights& w, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace) {
  cpu_math::pin_blas_to_one_thread();
  const SmallTensors small{w.input_layernorm, w.post_attention_layernorm, w.q_proj_bias, w.k_proj_bias,
                           w.v_proj_bias, w.o_proj_bias};
  block_decode_with(config, past, rows, w, small, x_in, x_out, cache, workspace, nullptr);
}

void head_decode(const Config& config, int64_t rows, const HeadWeights& w, const float* x_final, float* logits,
                 const Workspace& workspace) {
  cpu_math::pin_blas_to_one_thread();
  check_workspace(workspace, head_decode_size_bytes(config));
  const int64_t c = config.n_embd;
  Carver carve(workspace.data);
  float* normed = carve.take(c);
  float* rstd = carve.take(1);
  rmsnorm_forward(x_final + (rows - 1) * c, c, w.norm_weight, 1, c, config.norm_eps, normed, rstd);
  sgemm(false, true, 1, config.vocab_size, c, normed, c, w.lm_head, c, 0.0f, logits, config.vocab_size);
}

size_t decode_bf16_scratch_bytes(const Config& config) { return bf16_scratch(config, nullptr).size_bytes; }

void block_decode(const Config& config, int64_t past, int64_t rows, const BlockWeightsBf16& weights, const float* x_in,
                  float* x_out, const KvCacheBlock& cache, const Workspace& workspace, const Workspace& scratch) {
  cpu_math::pin_blas_to_one_thread();
  const Bf16Scratch layout = bf16_scratch(config, scratch.data);
  check_workspace(scratch, layout.size_bytes);
  SmallTensors small{layout.norm_1, layout.norm_2};
  cpu_math::widen_bf16(weights.input_layernorm, config.n_embd, layout.norm_1);
  cpu_math::widen_bf16(weights.post_attention_layernorm, config.n_embd, layout.norm_2);
  if (config.qkv_bias) {
    cpu_math::widen_bf16(weights.q_proj_bias, config.q_width(), layout.q_bias);
    cpu_math::widen_bf16(weights.k_proj_bias, config.kv_width(), layout.k_bias);
    cpu_math::widen_bf16(weights.v_proj_bias, config.kv_width(), layout.v_bias);
    small.q_bias = layout.q_bias;
    small.k_bias = layout.k_bias;
    small.v_bias = layout.v_bias;
  }
  if (config.o_bias) {
    cpu_math::widen_bf16(weights.o_proj_bias, config.n_embd, layout.o_bias);
    small.o_bias = layout.o_bias;
  }
  block_decode_with(config, past, rows, weights, small, x_in, x_out, cache, workspace, layout.pieces);
}

void head_decode(const Config& config, int64_t rows, const HeadWeightsBf16& w, const float* x_final, float* logits,
                 const Workspace& workspace, const Workspace& scratch) {
  cpu_math::pin_blas_to_one_thread();
  check_workspace(workspace, head_decode_size_bytes(config));
  const Bf16Scratch layout = bf16_scratch(config, scratch.data);
  check_workspace(scratch, layout.size_bytes);
  const int64_t c = config.n_embd;
  cpu_math::widen_bf16(w.norm_weight, c, layout.norm_1);
  Carver carve(workspace.data);
  float* normed = carve.take(c);
  float* rstd = carve.take(1);
  rmsnorm_forward(x_final + (rows - 1) * c, c, layout.norm_1, 1, c, config.norm_eps, normed, rstd);
  cpu_math::matmul_bf16(true, 1, c, config.vocab_size, normed, w.lm_head, false, logits, layout.pieces);
}

}  // namespace strata::reference::llama
