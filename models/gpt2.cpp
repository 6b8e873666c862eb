// models/gpt2.cpp — the GPT-2 definition (model.h): its units, init and ops.
#include "models/definitions.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "kernels/gpt2/gpt2.h"
#include "kernels/llama/llama.h"
#include "models/definitions.h"

namespace strata::models {
namespace {

namespace gk = kernels::gpt2;
namespace lk = kernels::llama;

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
    return backend.workspace_size_bytes(kc_, shape);
  }
  size_t workspace_size_bytes(device::Kind kind, const BatchShape& shape) const override {
    return kernels::workspace_size_bytes(kind, kc_, shape);
  }
  Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* embed,
                           float* x0) const override {
    return backend.embedding_forward(kc_, shape, embed, wpe(embed), x0);
  }
  Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* d_x0,
                            float* grads) const override {
    return backend.embedding_backward(kc_, shape, d_x0, grads, wpe(grads));
  }
  Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                       const float* x_in, float* x_out, const Workspace& workspace,
                       const kernels::lora::BlockAdapters* adapters) const override {
    return backend.block_forward(kc_, shape, gk::bind_block(kc_, block), x_in, x_out, workspace, adapters);
  }
  Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                        const float* x_in, const float* d_out, float* d_in, float* grads, const Workspace& workspace,
                        bool recompute, const kernels::lora::BlockAdapters* adapters) const override {
    const gk::BlockGrads bound = grads == nullptr ? gk::BlockGrads{} : gk::bind_block(kc_, grads);  // null: frozen
    return backend.block_backward(kc_, shape, gk::bind_block(kc_, block), x_in, d_out, d_in, bound, workspace,
                                  recompute, adapters);
  }
  Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* ln_f,
                               const float* embed, const float* x_final, float* d_x_final, float* ln_f_grads,
                               float* embed_grads, const Workspace& workspace) const override {
    // d_x_final null: the loss only; ln_f_grads null: a frozen ln_f.
    const gk::HeadGrads grads =
        d_x_final == nullptr ? gk::HeadGrads{}
                             : gk::HeadGrads{ln_f_grads, ln_f_grads == nullptr ? nullptr : ln_f_grads + kc_.n_embd,
                                             embed_grads};
    return backend.head_forward_backward(kc_, shape, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, embed}, x_final,
                                         d_x_final, grads, workspace);
  }
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
  gk::Config kc_;
};

}  // namespace

std::unique_ptr<const ModelDefinition> make_gpt2_definition(const ModelConfig& config) {
  return std::make_unique<Gpt2>(config);
}

}  // namespace strata::models
