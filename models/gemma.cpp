// models/gemma.cpp — the Gemma definition (model.h): Hugging Face's GemmaForCausalLM (Gemma 1)
// in fp32 — Llama's decoder with RMSNorm x·(1 + w), a GeGLU MLP (tanh GELU) and embeddings
// times √hidden; head_dim apart from hidden / heads; multi-query or grouped-query attention; no
// biases; a tied head (or not). Its units, Hugging Face names, init and store keys are here; its
// training and decoding ops are the decoder composition (models/decoder.h) with Gemma's options.
#include "models/definitions.h"

#include <cmath>
#include <string>

#include "kernels/backend.h"
#include "kernels/llama/llama.h"
#include "kernels/ops.h"
#include "models/decoder.h"

namespace strata::models {
namespace {

namespace lk = kernels::llama;

// Units embed (model.embed_tokens), layers.{i}, norm (model.norm, and lm_head when untied):
// Llama's names and llama.h's packed block layout, so a checkpoint is a name lookup and the
// decoder binds a unit as is. Init as GemmaPreTrainedModel: every Linear and the embedding
// normal(0, initializer_range), RMSNorm weights 0 — the gain 1 + w starts at 1.
class Gemma final : public ModelDefinition {
 public:
  explicit Gemma(const ModelConfig& model) : ModelDefinition(model) {
    kc_.n_layer = model.n_layer;
    kc_.n_head = model.n_head;
    kc_.n_kv_head = model.kv_heads();
    kc_.head_dim = model.head_size();
    kc_.n_embd = model.n_embd;
    kc_.intermediate_size = model.intermediate_size;
    kc_.vocab_size = model.vocab_size;
    kc_.n_ctx = model.seq_len;
    kc_.rope_theta = model.rope_theta;
    kc_.norm_eps = model.norm_eps;
    kc_.tie_word_embeddings = model.tie_word_embeddings;
    const int64_t vocab = model.vocab_size;
    const int64_t c = model.n_embd;
    Unit embed{"embed", -1, {}, 0};
    add_tensor(embed, "model.embed_tokens.weight", {vocab, c}, true, model.init_std, 0.0f);
    embed.tensors.back().token_embedding = true;
    units_.push_back(std::move(embed));
    for (int64_t layer = 0; layer < kc_.n_layer; ++layer) {
      Unit block{"layers." + std::to_string(layer), layer, {}, 0};
      for (const auto& spec : lk::block_param_specs(kc_)) {
        const bool is_norm = spec.name_suffix.ends_with("layernorm.weight");
        add_tensor(block, lk::block_param_name(layer, spec.name_suffix), shape_of(spec), spec.weight_decay,
                   is_norm ? 0.0 : model.init_std, 0.0f);
      }
      units_.push_back(std::move(block));
    }
    Unit norm{"norm", -1, {}, 0};
    add_tensor(norm, "model.norm.weight", {c}, false, 0.0, 0.0f);
    if (!model.tie_word_embeddings) add_tensor(norm, "lm_head.weight", {vocab, c}, true, model.init_std, 0.0f);
    units_.push_back(std::move(norm));
    find_linears({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj"},
                 /*conv1d=*/false);
  }

  const char* arch() const override { return "gemma"; }
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
                                          d_x_final, head_grads(norm_grads, embed_grads), workspace);
  }

  // --- generation: the decoder's decode composition with Gemma's options ---
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
                      const float* x_in, float* x_out, const kernels::gpt2::KvCacheBlock& cache,
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
                           const float* x_in, float* x_out, const kernels::gpt2::KvCacheBlock& cache,
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
  // Gemma's three differences from Llama, and only these (decoder.h: every block norm and the
  // final one, the MLP gate, the embedding).
  static decoder::DecoderOptions gemma_options(const ModelConfig& model) {
    decoder::DecoderOptions options;
    options.norm_weight_offset = 1.0f;  // GemmaRMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w)
    options.gate = kernels::ops::GateKind::gelu_tanh;  // GemmaMLP: gelu_pytorch_tanh(gate)·up
    // GemmaModel's normalizer: torch.tensor(hidden ** 0.5, dtype=hidden dtype) — √C rounded to
    // fp32 before it multiplies (√2048 = 45.254833995939045 becomes 45.25483322143555).
    options.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(model.n_embd)));
    return options;
  }
  // The norm weight, then the output projection: lm_head after it in the unit, or the
  // embedding when tied. The same for gradients (norm null: no head gradients).
  lk::HeadWeights head_weights(const float* norm, const float* embed) const {
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  lk::HeadGrads head_grads(float* norm, float* embed) const {
    if (norm == nullptr) return {};
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  lk::Config kc_;
  decoder::DecoderOptions options_ = gemma_options(config_);
};

}  // namespace

std::unique_ptr<const ModelDefinition> make_gemma_definition(const ModelConfig& config) {
  return std::make_unique<Gemma>(config);
}

}  // namespace strata::models
