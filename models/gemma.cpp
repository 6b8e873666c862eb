// models/gemma.cpp — the Gemma definition (model.h): Hugging Face's GemmaForCausalLM (Gemma 1)
// in fp32 — Llama's decoder with RMSNorm x·(1 + w), a GeGLU MLP (tanh GELU) and embeddings
// times √hidden; head_dim apart from hidden / heads; multi-query or grouped-query attention; no
// biases; a tied head (or not). Its units, Hugging Face names, init and store keys are here; its
// training ops are the decoder composition (models/decoder.h) with Gemma's options.
#include "models/definitions.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "kernels/backend.h"
#include "kernels/llama/llama.h"

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
  // A token workspace (a zero-byte buffer is a programmer error) until the ops compose.
  size_t workspace_size_bytes(const kernels::ComputeBackend& /*backend*/, const BatchShape& /*shape*/) const override {
    return 64;
  }
  size_t workspace_size_bytes(device::Kind /*kind*/, const BatchShape& /*shape*/) const override { return 64; }
  Status embedding_forward(kernels::ComputeBackend&, const BatchShape&, const float*, float*) const override {
    return not_composed();
  }
  Status embedding_backward(kernels::ComputeBackend&, const BatchShape&, const float*, float*) const override {
    return not_composed();
  }
  Status block_forward(kernels::ComputeBackend&, const BatchShape&, const float*, const float*, float*,
                       const Workspace&, const kernels::lora::BlockAdapters*) const override {
    return not_composed();
  }
  Status block_backward(kernels::ComputeBackend&, const BatchShape&, const float*, const float*, const float*, float*,
                        float*, const Workspace&, bool, const kernels::lora::BlockAdapters*) const override {
    return not_composed();
  }
  Status head_forward_backward(kernels::ComputeBackend&, const BatchShape&, const float*, const float*, const float*,
                               float*, float*, float*, const Workspace&) const override {
    return not_composed();
  }

  // --- generation: not written for Gemma (decodes() false; generate refuses before any op) ---
  bool decodes() const override { return false; }
  int64_t kv_cache_width() const override { return kc_.kv_width(); }
  int64_t learned_positions() const override { return 0; }
  uint64_t final_norm_elements() const override { return uint64_t(kc_.n_embd); }
  bool head_tied() const override { return kc_.tie_word_embeddings; }
  size_t decode_workspace_size_bytes(device::Kind, int64_t, int64_t) const override { return 0; }
  Status embedding_decode(kernels::ComputeBackend&, int64_t, int64_t, const int32_t*, const float*, int64_t,
                          const float*, float*) const override {
    return no_decode();
  }
  Status block_decode(kernels::ComputeBackend&, int64_t, int64_t, const float*, const float*, float*,
                      const kernels::gpt2::KvCacheBlock&, const Workspace&) const override {
    return no_decode();
  }
  Status head_logits(kernels::ComputeBackend&, int64_t, const float*, const float*, int64_t, const float*, float*,
                     const Workspace&) const override {
    return no_decode();
  }
  size_t decode_bf16_scratch_bytes(device::Kind) const override { return 0; }
  Status block_decode_bf16(kernels::ComputeBackend&, int64_t, int64_t, const uint16_t*, const float*, float*,
                           const kernels::gpt2::KvCacheBlock&, const Workspace&, const Workspace&) const override {
    return no_decode();
  }
  Status head_logits_bf16(kernels::ComputeBackend&, int64_t, const uint16_t*, const uint16_t*, const float*, float*,
                          const Workspace&, const Workspace&) const override {
    return no_decode();
  }
  // Host sampling has no caller for any definition; Gemma's would be Llama's kernels' wrong math.
  size_t host_workspace_size_bytes(const BatchShape&) const override { return 0; }
  void host_embedding_forward(const BatchShape&, const int32_t*, const float*, float*) const override {
    host_unsupported();
  }
  void host_block_forward(const BatchShape&, const float*, const float*, float*, const Workspace&) const override {
    host_unsupported();
  }
  void host_head_forward(const BatchShape&, const float*, const float*, const float*, float*,
                         const Workspace&) const override {
    host_unsupported();
  }

 private:
  static Status not_composed() {
    return make_error(ErrorKind::unsupported, "gemma: the training ops compose models/decoder.h, not in this build yet");
  }
  static Status no_decode() {
    return make_error(ErrorKind::unsupported, "gemma: decoding is not written yet (docs/models.md)");
  }
  [[noreturn]] static void host_unsupported() {
    fmt::print(stderr, "gemma: host sampling is not written (a programmer error: nothing should call it)\n");
    std::abort();
  }
  lk::Config kc_;
};

}  // namespace

std::unique_ptr<const ModelDefinition> make_gemma_definition(const ModelConfig& config) {
  return std::make_unique<Gemma>(config);
}

}  // namespace strata::models
