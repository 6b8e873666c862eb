// models/hf/gpt2_config.cpp — GPT-2's config.json (GPT2Config) both ways (hf_config.h).
#include <algorithm>
#include <cmath>

#include "models/hf/hf_config.h"

namespace strata::hf {

Result<ModelConfig> read_gpt2_config(const ConfigKeys& keys, std::string_view /*model_type*/) {
  ModelConfig m;
  m.arch = "gpt2";
  HF_READ(m.n_layer, keys.integer("n_layer", std::nullopt, 1, kMaxLayers));
  HF_READ(m.n_head, keys.integer("n_head", std::nullopt, 1, kMaxHeads));
  HF_READ(m.n_embd, keys.integer("n_embd", std::nullopt, 8, kMaxEmbd));
  HF_READ(m.vocab_size, keys.integer("vocab_size", std::nullopt, 2, kMaxVocab));
  HF_READ(m.seq_len, keys.integer("n_positions", std::nullopt, 1, UINT32_MAX));
  m.seq_len = std::min<uint32_t>(m.seq_len, kMaxContext);
  HF_READ(m.norm_eps, keys.number("layer_norm_epsilon", 1e-5, 0.0, 1.0));
  if (m.n_embd % m.n_head != 0)
    return keys.error("n_embd", fmt::format("{} is not divisible by n_head = {}", m.n_embd, m.n_head));
  // strata's GPT-2 computes HF's gelu_new and LayerNorm eps 1e-5 (models/gpt2.cpp).
  std::string activation;
  HF_READ(activation, keys.string("activation_function", std::string("gelu_new")));
  if (activation != "gelu_new")
    return keys.error("activation_function", fmt::format("is '{}'; strata's GPT-2 computes gelu_new only", activation));
  if (std::abs(m.norm_eps - 1e-5) > 1e-12)
    return keys.error("layer_norm_epsilon", fmt::format("is {}; strata's GPT-2 LayerNorm uses 1e-05", m.norm_eps));
  m.norm_eps = 1e-5;
  bool scale_by_layer = false, reorder = false;
  HF_READ(scale_by_layer, keys.boolean("scale_attn_by_inverse_layer_idx", false));
  HF_READ(reorder, keys.boolean("reorder_and_upcast_attn", false));
  if (scale_by_layer) return keys.error("scale_attn_by_inverse_layer_idx", "is true; strata's GPT-2 does not scale by layer");
  bool scale_weights = true;
  HF_READ(scale_weights, keys.boolean("scale_attn_weights", true));
  if (!scale_weights) return keys.error("scale_attn_weights", "is false; strata's GPT-2 scales scores by 1/sqrt(head_dim)");
  bool tied = true;
  HF_READ(tied, keys.boolean("tie_word_embeddings", true));
  if (!tied) return keys.error("tie_word_embeddings", "is false; strata's GPT-2 head is tied to wte");
  return m;
}

void write_gpt2_config(const ModelConfig& m, nlohmann::ordered_json& json) {
  json["architectures"] = {"GPT2LMHeadModel"};
  json["model_type"] = "gpt2";
  json["n_layer"] = m.n_layer;
  json["n_head"] = m.n_head;
  json["n_embd"] = m.n_embd;
  json["vocab_size"] = m.vocab_size;
  json["n_positions"] = m.seq_len;
  json["n_ctx"] = m.seq_len;
  json["n_inner"] = nullptr;
  json["activation_function"] = "gelu_new";
  json["layer_norm_epsilon"] = 1e-5;
  json["tie_word_embeddings"] = true;
}

}  // namespace strata::hf
