// kernels/cpu/cpu_ops.cpp — the CPU backend's operations (cpu_ops.h). Each loop is the one the
// CPU model kernels ran before models composed operations, moved here so that one copy serves
// every model: the same tiles, the same per-row and per-column-block reductions, the same order.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/op_math.h"

namespace strata::kernels::cpu_ops {

using cpu_math::for_rows;
using cpu_math::kColumnBlock;
using cpu_math::kRowGrain;
using cpu_rows::LayerNormStats;
using cpu_rows::layernorm_stats;

namespace {

// Element-wise work: fixed 1024-element chunks, four to a task (the thread count never moves a
// chunk boundary, and element-wise results do not depend on it anyway).
constexpr int64_t kElementChunk = 1024;

template <typename Body>
void for_elements(int64_t n, const Body& body) {
  for_rows((n + kElementChunk - 1) / kElementChunk, 4, [&](int64_t chunk) {
    const int64_t begin = chunk * kElementChunk;
    const int64_t end = std::min(n, begin + kElementChunk);
    for (int64_t i = begin; i < end; ++i) body(i);
  });
}

// The norm's gain of column j: w (the same bits as no offset when it is 0) or offset + w.
inline float gain(const float* weight, float offset, int64_t j) {
  return offset == 0.0f ? weight[j] : offset + weight[j];
}

void layernorm_forward(const ops::NormForward& op) {
  const int64_t c = op.width;
  for_rows(op.rows, kRowGrain, [&](int64_t r) {
    const float* x_row = op.x + r * op.x_stride;
    const LayerNormStats stats = layernorm_stats(x_row, c, op.eps);
    float* y_row = op.y + r * c;
    for (int64_t j = 0; j < c; ++j) y_row[j] = (x_row[j] - stats.mean) * stats.rstd * gain(op.weight, op.weight_offset, j) + op.bias[j];
    op.mean[r] = stats.mean;
    op.rstd[r] = stats.rstd;
  });
}

void rmsnorm_forward(const ops::NormForward& op) {
  const int64_t c = op.width;
  for_rows(op.rows, kRowGrain, [&](int64_t r) {
    const float* x_row = op.x + r * op.x_stride;
    double sq = 0.0;
    for (int64_t j = 0; j < c; ++j) sq += static_cast<double>(x_row[j]) * x_row[j];
    const auto rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(c) + op.eps));
    float* y_row = op.y + r * c;
    for (int64_t j = 0; j < c; ++j) y_row[j] = gain(op.weight, op.weight_offset, j) * (x_row[j] * rs);
    op.rstd[r] = rs;
  });
}

// dx (+)= rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂)) with dŷ = dy·w; dw += Σ dy·x̂; db += Σ dy.
void layernorm_backward(const ops::NormBackward& op) {
  const int64_t c = op.width;
  for_rows(op.rows, kRowGrain, [&](int64_t r) {
    const float* dy_row = op.dy + r * c;
    const float* x_row = op.x + r * c;
    const float mu = op.mean[r];
    const float rs = op.rstd[r];
    double sum_dxhat = 0.0;
    double sum_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const float dxhat = dy_row[j] * gain(op.weight, op.weight_offset, j);
      const float xhat = (x_row[j] - mu) * rs;
      sum_dxhat += dxhat;
      sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
    }
    const float mean_dxhat = static_cast<float>(sum_dxhat / static_cast<double>(c));
    const float mean_dxhat_xhat = static_cast<float>(sum_dxhat_xhat / static_cast<double>(c));
    float* dx_row = op.dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float xhat = (x_row[j] - mu) * rs;
      const float g = rs * (dy_row[j] * gain(op.weight, op.weight_offset, j) - mean_dxhat - xhat * mean_dxhat_xhat);
      dx_row[j] = op.accumulate ? dx_row[j] + g : g;
    }
  });
  assert((op.d_weight == nullptr) == (op.d_bias == nullptr));
  if (op.d_weight == nullptr) return;  // frozen
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    double acc_w[kColumnBlock] = {};
    double acc_b[kColumnBlock] = {};
    for (int64_t r = 0; r < op.rows; ++r) {
      const float* dy_row = op.dy + r * c + c0;
      const float* x_row = op.x + r * c + c0;
      for (int64_t j = 0; j < width; ++j) {
        acc_w[j] += static_cast<double>(dy_row[j]) * ((x_row[j] - op.mean[r]) * op.rstd[r]);
        acc_b[j] += dy_row[j];
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      op.d_weight[c0 + j] += static_cast<float>(acc_w[j]);
      op.d_bias[c0 + j] += static_cast<float>(acc_b[j]);
    }
  });
}

// g = dy·w; dx (+)= rstd·g − x·rstd³·mean(g·x); dw += Σ_rows dy·x·rstd (skipped when null).
void rmsnorm_backward(const ops::NormBackward& op) {
  const int64_t c = op.width;
  for_rows(op.rows, kRowGrain, [&](int64_t r) {
    const float* dy_row = op.dy + r * c;
    const float* x_row = op.x + r * c;
    const float rs = op.rstd[r];
    double dot = 0.0;
    for (int64_t j = 0; j < c; ++j)
      dot += static_cast<double>(dy_row[j] * gain(op.weight, op.weight_offset, j)) * x_row[j];
    const auto coef = static_cast<float>(dot / static_cast<double>(c) * rs * rs * rs);
    float* dx_row = op.dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float g = rs * (dy_row[j] * gain(op.weight, op.weight_offset, j)) - x_row[j] * coef;
      dx_row[j] = op.accumulate ? dx_row[j] + g : g;
    }
  });
  if (op.d_weight == nullptr) return;  // frozen
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    double acc[kColumnBlock] = {};
    for (int64_t r = 0; r < op.rows; ++r) {
      const float* dy_row = op.dy + r * c + c0;
      const float* x_row = op.x + r * c + c0;
      for (int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(dy_row[j]) * (x_row[j] * op.rstd[r]);
    }
    for (int64_t j = 0; j < width; ++j) op.d_weight[c0 + j] += static_cast<float>(acc[j]);
  });
}

// The scratch of one (batch, query head) task: transposed keys and values, two rows.
struct AttentionScratch {
  float* key_t;
  float* value_t;
  float* rows;
};
AttentionScratch attention_scratch(const ops::Attention& op, int64_t bh) {
  const int64_t t = op.shape.seq_len;
  const int64_t d = op.head_dim;
  const int64_t tasks = op.shape.batch * op.n_head;
  float* base = op.scratch.data;
  return {base + bh * d * t, base + tasks * d * t + bh * d * t, base + 2 * tasks * d * t + bh * 2 * t};
}

cpu_math::AttentionHead head_of(const ops::Attention& op, int64_t b, int64_t h, const int32_t* segments) {
  const int64_t t = op.shape.seq_len;
  const int64_t kv = h / (op.n_head / op.n_kv_head);
  return {t,
          op.head_dim,
          op.q + b * t * op.q_stride + h * op.head_dim,
          op.q_stride,
          op.k + b * t * op.kv_stride + kv * op.head_dim,
          op.v + b * t * op.kv_stride + kv * op.head_dim,
          op.kv_stride,
          op.use_step_segments && segments != nullptr ? segments + b * t : nullptr};
}

}  // namespace

void gemm(const ops::Gemm& op) {
  cpu_math::sgemm(op.trans_a, op.trans_b, op.m, op.n, op.k, op.a, op.lda, op.b, op.ldb, op.beta, op.c, op.ldc);
}

void rows_init(const ops::RowsInit& op) {
  const int64_t out = op.cols;
  if (op.bias == nullptr) {
    if (op.y != op.residual) std::memcpy(op.y, op.residual, static_cast<size_t>(op.rows * out) * sizeof(float));
    return;
  }
  for_rows(op.rows, kRowGrain * 4, [&](int64_t r) {
    float* y_row = op.y + r * out;
    if (op.residual == nullptr) {
      std::memcpy(y_row, op.bias, static_cast<size_t>(out) * sizeof(float));
    } else {
      const float* res_row = op.residual + r * out;
      for (int64_t j = 0; j < out; ++j) y_row[j] = res_row[j] + op.bias[j];
    }
  });
}

void add_bias(const ops::AddBias& op) {
  for_rows(op.rows, kRowGrain, [&](int64_t r) {
    float* y_row = op.y + r * op.cols;
    for (int64_t j = 0; j < op.cols; ++j) y_row[j] += op.bias[j];
  });
}

void column_sums(const ops::ColumnSums& op) { cpu_math::column_sums_accumulate(op.in, op.rows, op.cols, op.out); }

void norm_forward(const ops::NormForward& op) {
  if (op.kind == ops::NormKind::layer) {
    layernorm_forward(op);
  } else {
    rmsnorm_forward(op);
  }
}

void norm_backward(const ops::NormBackward& op) {
  if (op.kind == ops::NormKind::layer) {
    layernorm_backward(op);
  } else {
    rmsnorm_backward(op);
  }
}

int64_t rope_half(const ops::RopeSpec& spec) { return spec.head_dim / 2; }

void rope_tables(const ops::RopeTables& op) {
  const int64_t half = rope_half(op.spec);
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = op_math::rope_inverse_frequency(op.spec, i);
    for (int64_t t = 0; t < op.t_len; ++t)
      op_math::rope_cos_sin(inv_freq, op.first_position + t, op.cos + t * half + i, op.sin + t * half + i);
  }
}

void rope(const ops::Rope& op, const int32_t* positions) {
  const int64_t d = op.spec.head_dim;
  const int64_t half = d / 2;
  const float sign = op.inverse ? -1.0f : 1.0f;
  const int32_t* packed = op.use_step_positions ? positions : nullptr;
  for_rows(op.shape.rows(), kRowGrain, [&](int64_t r) {
    const int64_t t = packed == nullptr ? r % op.shape.seq_len : packed[r];
    assert(t >= 0 && t < op.shape.seq_len);
    const float* c_row = op.cos + t * half;
    const float* s_row = op.sin + t * half;
    for (int64_t h = 0; h < op.heads; ++h)
      for (int64_t i = 0; i < half; ++i)
        op_math::rope_rotate_pair(op.x + (r * op.heads + h) * d, i, half, c_row[i], sign * s_row[i]);
  });
}

size_t attention_scratch_bytes(const BatchShape& shape, int64_t n_head, int64_t head_dim) {
  const int64_t tasks = shape.batch * n_head;
  const int64_t floats = tasks * (2 * head_dim * shape.seq_len + 2 * shape.seq_len);
  return static_cast<size_t>(floats) * sizeof(float);
}

void attention_forward(const ops::Attention& op, const int32_t* segments) {
  assert(op.scratch.size_bytes >= attention_scratch_bytes(op.shape, op.n_head, op.head_dim));
  for_rows(op.shape.batch * op.n_head, 1, [&](int64_t bh) {
    const int64_t b = bh / op.n_head;
    const int64_t h = bh % op.n_head;
    const AttentionScratch s = attention_scratch(op, bh);
    cpu_math::attention_forward_head(head_of(op, b, h, segments), op.scale, s.key_t, s.rows,
                                     op.out + b * op.shape.seq_len * op.out_stride + h * op.head_dim, op.out_stride);
  });
}

void attention_backward(const ops::AttentionBackward& grad, const int32_t* segments) {
  const ops::Attention& op = grad.forward;
  const int64_t t = op.shape.seq_len;
  const int64_t d = op.head_dim;
  const int64_t group = op.n_head / op.n_kv_head;
  // One task per (batch, k/v head): its query heads add into dk and dv in head order.
  for_rows(op.shape.batch * op.n_kv_head, 1, [&](int64_t bkv) {
    const int64_t b = bkv / op.n_kv_head;
    const int64_t kv = bkv % op.n_kv_head;
    float* dk = grad.dk + b * t * op.kv_stride + kv * d;
    float* dv = grad.dv + b * t * op.kv_stride + kv * d;
    for (int64_t j = 0; j < t; ++j) {
      std::fill(dk + j * op.kv_stride, dk + j * op.kv_stride + d, 0.0f);
      std::fill(dv + j * op.kv_stride, dv + j * op.kv_stride + d, 0.0f);
    }
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const AttentionScratch s = attention_scratch(op, b * op.n_head + h);
      cpu_math::attention_backward_head(head_of(op, b, h, segments), op.scale,
                                        grad.d_out + b * t * op.out_stride + h * d, op.out_stride, s.key_t,
                                        s.value_t, s.rows, s.rows + t, grad.dq + b * t * op.q_stride + h * d,
                                        op.q_stride, dk, dv);
    }
  });
}

void gelu_forward(const ops::Gelu& op) {
  for_elements(op.n, [&](int64_t i) { op.out[i] = op_math::gelu_tanh(op.in[i]); });
}

void gelu_backward(const ops::GeluBackward& op) {
  for_elements(op.n, [&](int64_t i) { op.d[i] *= op_math::gelu_tanh_derivative(op.pre[i]); });
}

void gated_forward(const ops::Gated& op) {
  if (op.kind == ops::GateKind::silu) {
    for_elements(op.n, [&](int64_t i) { op.act[i] = op.gate[i] * op_math::silu_sigmoid(op.gate[i]) * op.up[i]; });
  } else {
    for_elements(op.n, [&](int64_t i) { op.act[i] = op_math::gelu_tanh(op.gate[i]) * op.up[i]; });
  }
}

void gated_backward(const ops::GatedBackward& op) {
  if (op.kind == ops::GateKind::silu) {
    for_elements(op.n, [&](int64_t i) {
      const float x = op.gate[i];
      const float s = op_math::silu_sigmoid(x);
      const float da = op.d_act[i];
      op.gate[i] = da * op.up[i] * (s * (1.0f + x * (1.0f - s)));
      op.up[i] = da * x * s;
    });
  } else {
    for_elements(op.n, [&](int64_t i) {
      const float x = op.gate[i];
      const float da = op.d_act[i];
      op.gate[i] = da * op.up[i] * op_math::gelu_tanh_derivative(x);
      op.up[i] = da * op_math::gelu_tanh(x);
    });
  }
}

namespace {
// The learned-position row of token r: its position within its example when packed, else within its row.
int64_t position_of(const int32_t* positions, const BatchShape& shape, int64_t first_position, int64_t r) {
  if (positions == nullptr) return first_position + r % shape.seq_len;
  assert(positions[r] >= 0 && positions[r] < shape.seq_len);
  return positions[r];
}
}  // namespace

void embedding(const ops::Embedding& op, const int32_t* tokens, const int32_t* positions) {
  const int64_t c = op.width;
  const int32_t* packed = op.use_step_positions ? positions : nullptr;
  const int32_t* ids = op.tokens != nullptr ? op.tokens : tokens;
  for_rows(op.shape.rows(), kRowGrain, [&](int64_t r) {
    const int32_t token = ids[r];
    assert(token >= 0 && token < op.vocab);
    const float* tok_row = op.table + static_cast<int64_t>(token) * c;
    float* out = op.x + r * c;
    if (op.positions != nullptr) {
      assert(op.scale == 1.0f);
      const float* pos_row = op.positions + position_of(packed, op.shape, op.first_position, r) * c;
      for (int64_t j = 0; j < c; ++j) out[j] = tok_row[j] + pos_row[j];
    } else if (op.scale != 1.0f) {
      for (int64_t j = 0; j < c; ++j) out[j] = tok_row[j] * op.scale;
    } else {
      std::memcpy(out, tok_row, static_cast<size_t>(c) * sizeof(float));
    }
  });
}

void embedding_backward(const ops::EmbeddingBackward& grad, const int32_t* tokens, const int32_t* positions) {
  const ops::Embedding& op = grad.forward;
  const int64_t c = op.width;
  const int64_t rows = op.shape.rows();
  const int32_t* packed = op.use_step_positions ? positions : nullptr;
  // Tasks own column blocks of every row of the tables and walk the B·T rows in order, so
  // repeated tokens (and the batch sum for positions) add up in one fixed order.
  const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
  for_rows(blocks, 1, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, c - c0);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t token = tokens[r];
      assert(token >= 0 && token < op.vocab);
      const float* g = grad.d_x + r * c + c0;
      if (grad.d_table != nullptr) {
        float* tok_row = grad.d_table + static_cast<int64_t>(token) * c + c0;
        if (op.scale != 1.0f) {
          for (int64_t j = 0; j < width; ++j) tok_row[j] += g[j] * op.scale;
        } else {
          for (int64_t j = 0; j < width; ++j) tok_row[j] += g[j];
        }
      }
      if (grad.d_positions != nullptr) {
        float* pos_row = grad.d_positions + position_of(packed, op.shape, op.first_position, r) * c + c0;
        for (int64_t j = 0; j < width; ++j) pos_row[j] += g[j];
      }
    }
  });
}

void cross_entropy(const ops::CrossEntropy& op, const int32_t* targets, float inv_normalizer, double* loss_sum) {
  for_rows(op.rows, 1, [&](int64_t r) {
    float* logits = op.logits + r * op.vocab;
    const int32_t target = targets[op.first_row + r];
    assert(target < op.vocab);
    op.row_loss[r] = target < 0 ? cpu_rows::masked_row(logits, op.vocab, op.gradient)
                                : cpu_rows::cross_entropy_row(logits, op.vocab, target, op.gradient, inv_normalizer);
  });
  for (int64_t r = 0; r < op.rows; ++r) *loss_sum += op.row_loss[r];
}

void copy_rows(const ops::CopyRows& op) {
  for (int64_t r = 0; r < op.rows; ++r)
    std::memcpy(op.dst + r * op.dst_stride, op.src + r * op.src_stride, static_cast<size_t>(op.cols) * sizeof(float));
}

size_t attention_decode_scratch_bytes(int64_t /*max_rows*/, int64_t n_head, int64_t max_positions) {
  return static_cast<size_t>(n_head * max_positions) * sizeof(float);
}

void attention_decode(const ops::AttentionDecode& op) {
  assert(op.past >= 0 && op.rows > 0 && op.past + op.rows <= op.max_positions);
  assert(op.scratch.size_bytes >= attention_decode_scratch_bytes(op.rows, op.n_head, op.max_positions));
  const int64_t d = op.head_dim;
  const int64_t group = op.n_head / op.n_kv_head;
  // One task per query head: its score row is its own, and each output element is one head's.
  for_rows(op.n_head, 1, [&](int64_t h) {
    const int64_t kv = h / group;
    float* p = op.scratch.data + h * op.max_positions;
    for (int64_t r = 0; r < op.rows; ++r) {
      const int64_t count = op.past + r + 1;
      const float* q = op.q + r * op.q_stride + h * d;
      for (int64_t j = 0; j < count; ++j) {
        const float* k = op.keys + j * op.kv_stride + kv * d;
        float dot = 0.0f;
        for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
        p[j] = dot;
      }
      cpu_rows::softmax_scaled_inplace(p, count, op.scale);
      float* out = op.out + r * op.out_stride + h * d;
      std::fill(out, out + d, 0.0f);
      for (int64_t j = 0; j < count; ++j) cpu_rows::axpy(p[j], op.values + j * op.kv_stride + kv * d, out, d);
    }
  });
}

size_t matmul_bf16_scratch_bytes(int64_t /*max_in*/, int64_t /*max_out*/) {
  return static_cast<size_t>(cpu_math::kBf16PiecesFloats) * sizeof(float);
}

void matmul_bf16(const ops::MatmulBf16& op) {
  assert(op.scratch.size_bytes >= matmul_bf16_scratch_bytes(op.in, op.out));
  cpu_math::matmul_bf16(op.w_out_major, op.rows, op.in, op.out, op.x, op.w, op.accumulate, op.y, op.scratch.data);
}

}  // namespace strata::kernels::cpu_ops
