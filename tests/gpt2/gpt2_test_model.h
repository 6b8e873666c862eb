// tests/gpt2/gpt2_test_model.h — a whole GPT-2 driven through the per-block kernel API, the
// way the trainer will drive it, so tests can compare passes and check against PyTorch.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/reference/gpt2_reference.h"

namespace strata::testing {

namespace g2 = strata::reference::gpt2;

// 64-byte aligned float buffer (the workspace contract asks for it).
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(size_t count) : count_(count) {
    const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    data_ = static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
  }
  AlignedFloats(AlignedFloats&& other) noexcept : data_(other.data_), count_(other.count_) {
    other.data_ = nullptr;
    other.count_ = 0;
  }
  AlignedFloats& operator=(AlignedFloats&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data_); }
  float* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  float* data_ = nullptr;
  size_t count_ = 0;
};

// One named tensor inside the model's flat parameter buffer.
struct TensorView {
  std::string name;
  int64_t rows;
  int64_t cols;  // 1 for 1-D tensors
  int64_t offset;
  int64_t numel() const { return rows * cols; }
};

// How backward gets each block's activations.
enum class BackwardMode {
  recompute_streaming,  // one shared workspace; block_backward re-runs each block's forward
  saved_per_block,      // a workspace per block kept from the forward pass (no recompute)
};

// Loss masks on a TinyGpt2's targets (kernels/ops.h, "Loss masks"): none; a "prompt" — the first
// third of each sequence masked with -1, and every seventh row with another negative (-5), as
// fine-tuning data masks a prompt and the odd padding token; or every row masked.
enum class Masks { none, prompt, all };

class TinyGpt2 {
 public:
  TinyGpt2(const g2::Config& config, const g2::BatchShape& shape, uint32_t seed)
      : config_(config), shape_(shape) {
    int64_t offset = 0;
    for (const g2::ParamSpec& spec : g2::outer_param_specs(config)) {
      tensors_.push_back({std::string(spec.name_suffix), spec.shape[0],
                          spec.rank == 2 ? spec.shape[1] : 1, offset});
      offset += spec.numel();
    }
    for (int64_t layer = 0; layer < config.n_layer; ++layer) {
      block_offsets_.push_back(offset);
      for (const g2::ParamSpec& spec : g2::block_param_specs(config)) {
        tensors_.push_back({g2::block_param_name(layer, spec.name_suffix), spec.shape[0],
                            spec.rank == 2 ? spec.shape[1] : 1, offset});
        offset += spec.numel();
      }
    }
    params_.assign(static_cast<size_t>(offset), 0.0f);
    std::mt19937 rng(seed);
    // Weights larger than GPT-2's 0.02 so attention is far from uniform and every path
    // carries signal; LayerNorm gains around 1 and non-zero biases so their gradients matter.
    std::normal_distribution<float> normal(0.0f, 0.2f);
    for (const TensorView& t : tensors_) {
      const bool is_ln_weight = t.name.find("ln_") != std::string::npos &&
                                t.name.ends_with(".weight");
      for (int64_t i = 0; i < t.numel(); ++i) {
        float v = normal(rng);
        if (is_ln_weight) v = 1.0f + v;
        params_[static_cast<size_t>(t.offset + i)] = v;
      }
    }
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
    for (int64_t i = 0; i < shape.rows(); ++i) {
      tokens_.push_back(token(rng));
      targets_.push_back(token(rng));
    }
  }

  // Masks some targets and sets N (the head's loss_normalizer_tokens; 0 = the trained count).
  void set_masks(Masks masks, int64_t loss_normalizer_tokens) {
    loss_normalizer_tokens_ = loss_normalizer_tokens;
    for (int64_t i = 0; i < shape_.rows(); ++i) {
      int32_t& target = targets_[static_cast<size_t>(i)];
      if (masks == Masks::all || (masks == Masks::prompt && i % shape_.seq_len < shape_.seq_len / 3)) target = -1;
      if (masks == Masks::prompt && i % 7 == 3) target = -5;
    }
  }
  int64_t loss_normalizer_tokens() const { return loss_normalizer_tokens_; }

  const g2::Config& config() const { return config_; }
  const g2::BatchShape& shape() const { return shape_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::vector<float>& params() const { return params_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& targets() const { return targets_; }

  // Forward + backward of the whole model. grads (same layout as params) are zeroed first.
  float loss_and_grads(BackwardMode mode, std::vector<float>& grads) const {
    const int64_t n = shape_.rows();
    const int64_t c = config_.n_embd;
    const size_t act = static_cast<size_t>(n * c);
    grads.assign(params_.size(), 0.0f);
    const size_t ws_bytes = g2::workspace_size_bytes(config_, shape_);
    const int64_t blocks = config_.n_layer;
    // Streaming: one workspace for everything. Saved: one per block that keeps its
    // activations until its backward, and one more for the head.
    std::vector<AlignedFloats> workspaces;
    const bool saved = mode == BackwardMode::saved_per_block;
    for (int64_t i = 0; i < (saved ? blocks + 1 : 1); ++i) {
      workspaces.emplace_back(ws_bytes / sizeof(float));
    }
    auto ws_of = [&](int64_t layer) {  // layer == n_layer: the head
      const AlignedFloats& buffer = workspaces[saved ? static_cast<size_t>(layer) : 0];
      return g2::Workspace{buffer.data(), ws_bytes};
    };
    // Activations kept only at block inputs (x[0] .. x[n_layer], the last is the head's input).
    std::vector<std::vector<float>> x(static_cast<size_t>(blocks + 1), std::vector<float>(act));
    g2::embedding_forward(config_, shape_, tokens_.data(), wte(params_.data()),
                          wpe(params_.data()), x[0].data());
    for (int64_t layer = 0; layer < blocks; ++layer) {
      g2::block_forward(config_, shape_, block_weights(layer), x[layer].data(),
                        x[layer + 1].data(), ws_of(layer));
    }
    std::vector<float> d_x(act);
    const float loss = g2::head_forward_backward(
        config_, shape_, head_weights(), x[blocks].data(), targets_.data(), d_x.data(),
        head_grads(grads), ws_of(blocks), loss_normalizer_tokens_);
    for (int64_t layer = blocks - 1; layer >= 0; --layer) {
      g2::block_backward(config_, shape_, block_weights(layer), x[layer].data(), d_x.data(),
                         d_x.data(), block_grads(grads, layer), ws_of(layer),
                         mode == BackwardMode::recompute_streaming);
    }
    g2::embedding_backward(config_, shape_, tokens_.data(), d_x.data(),
                           grads.data() + offset_of("wte.weight"),
                           grads.data() + offset_of("wpe.weight"));
    return loss;
  }

  // Logits of the last position of each sequence (generation path).
  std::vector<float> last_logits() const {
    const size_t act = static_cast<size_t>(shape_.rows() * config_.n_embd);
    AlignedFloats ws(g2::workspace_size_bytes(config_, shape_) / sizeof(float));
    const g2::Workspace workspace{ws.data(), ws.size() * sizeof(float)};
    std::vector<float> a(act), b(act);
    g2::embedding_forward(config_, shape_, tokens_.data(), wte(params_.data()),
                          wpe(params_.data()), a.data());
    for (int64_t layer = 0; layer < config_.n_layer; ++layer) {
      g2::block_forward(config_, shape_, block_weights(layer), a.data(), b.data(), workspace);
      std::swap(a, b);
    }
    std::vector<float> logits(static_cast<size_t>(shape_.batch * config_.vocab_size));
    g2::head_forward(config_, shape_, head_weights(), a.data(), logits.data(), workspace);
    return logits;
  }

  int64_t offset_of(const std::string& name) const {
    for (const TensorView& t : tensors_) {
      if (t.name == name) return t.offset;
    }
    std::abort();
  }

 private:
  const float* wte(const float* base) const { return base + offset_of("wte.weight"); }
  const float* wpe(const float* base) const { return base + offset_of("wpe.weight"); }
  g2::BlockWeights block_weights(int64_t layer) const {
    return g2::bind_block(config_, static_cast<const float*>(params_.data()) +
                                       block_offsets_[static_cast<size_t>(layer)]);
  }
  g2::BlockGrads block_grads(std::vector<float>& grads, int64_t layer) const {
    return g2::bind_block(config_, grads.data() + block_offsets_[static_cast<size_t>(layer)]);
  }
  g2::HeadWeights head_weights() const {
    return {params_.data() + offset_of("ln_f.weight"), params_.data() + offset_of("ln_f.bias"),
            params_.data() + offset_of("wte.weight")};
  }
  g2::HeadGrads head_grads(std::vector<float>& grads) const {
    return {grads.data() + offset_of("ln_f.weight"), grads.data() + offset_of("ln_f.bias"),
            grads.data() + offset_of("wte.weight")};
  }

  g2::Config config_;
  g2::BatchShape shape_;
  std::vector<TensorView> tensors_;
  std::vector<int64_t> block_offsets_;
  std::vector<float> params_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> targets_;
  int64_t loss_normalizer_tokens_ = 0;
};

}  // namespace strata::testing
