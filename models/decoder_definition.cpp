// models/decoder_definition.cpp — the one ModelDefinition of the Llama family (definitions.h
// make_decoder_definition): units, names and init of the family's checkpoints, and every op
// composed by models/decoder.h with the member's DecoderOptions. Llama (llama.cpp) and Gemma
// (gemma.cpp) are this definition with their name, options and RMSNorm init.
#include "models/definitions.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "models/gpt2_shape.h"
#include "models/llama_shape.h"
#include "models/decoder.h"

namespace strata::models {
namespace {

namespace lk = models::llama;

// Units embed (model.embed_tokens), layers.{i}, norm (model.norm, and lm_head when untied), in
// llama_shape.h's packed canonical layout, so a checkpoint is a name lookup and the decoder binds a
// unit as is. Init as Hugging Face's PreTrainedModels of the family: every Linear and the
// embedding normal(0, init_std = initializer_range), biases 0, RMSNorm weights `norm_init`
// (Llama 1; Gemma 0, its gain being 1 + w).
class FamilyDefinition final : public ModelDefinition {
 public:
  FamilyDefinition(const ModelConfig& model, const char* arch, const decoder::DecoderOptions& options,
                   float norm_init)
      : ModelDefinition(model), arch_(arch), options_(options) {
    kc_.n_layer = model.n_layer;
    kc_.n_head = model.n_head;
    kc_.n_kv_head = model.kv_heads();
    kc_.head_dim = model.head_size();
    kc_.n_embd = model.n_embd;
    kc_.intermediate_size = model.intermediate_size;
    kc_.vocab_size = model.vocab_size;
    kc_.n_ctx = model.seq_len;
    kc_.rope_theta = model.rope_theta;
    if (model.rope_scaling.type == "llama3") {
      kc_.rope_factor = model.rope_scaling.factor;
      kc_.rope_low_freq_factor = model.rope_scaling.low_freq_factor;
      kc_.rope_high_freq_factor = model.rope_scaling.high_freq_factor;
      kc_.rope_original_max_positions = model.rope_scaling.original_max_position_embeddings;
    }
    kc_.norm_eps = model.norm_eps;
    kc_.tie_word_embeddings = model.tie_word_embeddings;
    kc_.qkv_bias = model.qkv_bias;
    kc_.o_bias = model.o_proj_bias;
    const int64_t vocab = model.vocab_size;
    const int64_t c = model.n_embd;
    Unit embed{"embed", -1, {}, 0};
    add_tensor(embed, "model.embed_tokens.weight", {vocab, c}, true, model.init_std, 0.0f);
    embed.tensors.back().token_embedding = true;
    units_.push_back(std::move(embed));
    const auto specs = lk::block_param_specs(kc_);
    for (int64_t layer = 0; layer < kc_.n_layer; ++layer) {
      Unit block{"layers." + std::to_string(layer), layer, {}, 0};
      for (const auto& spec : specs) {
        // RMSNorm weights start at norm_init, biases at 0 (neither decays: spec.weight_decay),
        // matrices normal(0, init_std).
        const bool is_norm = spec.name_suffix.ends_with("layernorm.weight");
        const bool is_bias = spec.name_suffix.ends_with(".bias");
        add_tensor(block, lk::block_param_name(layer, spec.name_suffix), shape_of(spec), spec.weight_decay,
                   is_norm || is_bias ? 0.0 : model.init_std, is_norm ? norm_init : 0.0f);
      }
      units_.push_back(std::move(block));
    }
    Unit norm{"norm", -1, {}, 0};
    add_tensor(norm, "model.norm.weight", {c}, false, 0.0, norm_init);
    if (!model.tie_word_embeddings) add_tensor(norm, "lm_head.weight", {vocab, c}, true, model.init_std, 0.0f);
    units_.push_back(std::move(norm));
    find_linears({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj"},
                 /*conv1d=*/false);
  }

  const char* arch() const override { return arch_; }
  size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const BatchShape& shape) const override {
    return decoder::workspace_size_bytes(backend, kc_, shape);
  }
  size_t workspace_size_bytes(device::Kind kind, const BatchShape& shape) const override {
    return decoder::workspace_size_bytes(kind, kc_, shape);
  }
  Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* embed,
                           float* x0) const override {
    return decoder::embedding_forward(backend, kc_, options_, shape, embed, x0);
  }
  Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* d_x0,
                            float* grads) const override {
    return decoder::embedding_backward(backend, kc_, options_, shape, d_x0, grads);
  }
  Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                       const float* x_in, float* x_out, const Workspace& workspace,
                       const kernels::lora::BlockAdapters* adapters) const override {
    return decoder::block_forward(backend, kc_, options_, shape, lk::bind_block(kc_, block), x_in, x_out, workspace,
                                  adapters);
  }
  Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                        const float* x_in, const float* d_out, float* d_in, float* grads, const Workspace& workspace,
                        bool recompute, const kernels::lora::BlockAdapters* adapters) const override {
    const lk::BlockGrads bound = grads == nullptr ? lk::BlockGrads{} : lk::bind_block(kc_, grads);  // null: frozen
    return decoder::block_backward(backend, kc_, options_, shape, lk::bind_block(kc_, block), x_in, d_out, d_in,
                                   bound, workspace, recompute, adapters);
  }
  Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* norm,
                               const float* embed, const float* x_final, float* d_x_final, float* norm_grads,
                               float* embed_grads, const Workspace& workspace) const override {
    return decoder::head_forward_backward(backend, kc_, options_, shape, head_weights(norm, embed), x_final,
                                          d_x_final, head_weights(norm_grads, embed_grads), workspace);
  }
  int64_t kv_cache_width() const override { return kc_.kv_width(); }
  int64_t learned_positions() const override { return 0; }
  uint64_t final_norm_elements() const override { return uint64_t(kc_.n_embd); }
  bool head_tied() const override { return kc_.tie_word_embeddings; }
  size_t decode_workspace_size_bytes(device::Kind kind, int64_t max_rows, int64_t max_positions) const override {
    return decoder::decode_workspace_size_bytes(kind, kc_, max_rows, max_positions);
  }
  Status embedding_decode(kernels::ComputeBackend& backend, int64_t /*past*/, int64_t rows, const int32_t* tokens,
                          const float* token_table, int64_t table_rows, const float* /*positions*/,
                          float* x0) const override {
    return decoder::embedding_decode(backend, kc_, options_, rows, tokens, token_table, table_rows, x0);
  }
  Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const float* block,
                      const float* x_in, float* x_out, const kernels::KvCacheBlock& cache,
                      const Workspace& workspace) const override {
    return decoder::block_decode(backend, kc_, options_, past, rows, lk::bind_block(kc_, block), x_in, x_out, cache,
                                 workspace);
  }
  Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* norm, const float* projection,
                     int64_t projection_rows, const float* x_final, float* logits,
                     const Workspace& workspace) const override {
    return decoder::head_logits(backend, kc_, options_, rows, norm, projection, projection_rows, x_final, logits,
                                workspace);
  }
  size_t decode_bf16_scratch_bytes(device::Kind kind) const override {
    return decoder::decode_bf16_scratch_bytes(kind, kc_);
  }
  Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const uint16_t* block,
                           const float* x_in, float* x_out, const kernels::KvCacheBlock& cache,
                           const Workspace& workspace, const Workspace& scratch) const override {
    return decoder::block_decode_bf16(backend, kc_, options_, past, rows, lk::bind_block(kc_, block), x_in, x_out,
                                      cache, workspace, scratch);
  }
  Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows, const uint16_t* norm,
                          const uint16_t* projection, const float* x_final, float* logits, const Workspace& workspace,
                          const Workspace& scratch) const override {
    return decoder::head_logits_bf16(backend, kc_, options_, rows, lk::HeadWeightsBf16{norm, projection}, x_final,
                                     logits, workspace, scratch);
  }

 private:
  // The norm weight, then the output projection: lm_head after it in the unit, or the
  // embedding when tied. The same for gradients.
  lk::HeadWeights head_weights(const float* norm, const float* embed) const {
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  lk::HeadGrads head_weights(float* norm, float* embed) const {
    if (norm == nullptr) return {};  // the loss only (no gradients)
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  const char* arch_;
  lk::Config kc_;
  decoder::DecoderOptions options_;
};

}  // namespace

std::unique_ptr<const ModelDefinition> make_decoder_definition(const ModelConfig& config, const char* arch,
                                                               const decoder::DecoderOptions& options,
                                                               float norm_init) {
  return std::make_unique<FamilyDefinition>(config, arch, options, norm_init);
}

}  // namespace strata::models
