// models/hf/llama_config.cpp — the decoder family's config.json keys (hf_config.h) and Llama's
// mapping both ways: LlamaConfig, MistralConfig, Qwen2Config and Phi3Config are the Llama
// definition with biases, fused projections or a window.
#include <algorithm>

#include "models/hf/hf_config.h"

namespace strata::hf {

namespace {

// Reads the llama3 scaling parameters from `scaling` (rope_scaling, or rope_parameters).
Status read_llama3_scaling(const ConfigKeys& scaling, RopeScaling& r) {
  r.type = "llama3";
  HF_READ(r.factor, scaling.number("factor", std::nullopt, 1.0, 1.0e6));
  HF_READ(r.low_freq_factor, scaling.number("low_freq_factor", 1.0, 1.0e-6, 1.0e6));
  HF_READ(r.high_freq_factor, scaling.number("high_freq_factor", 4.0, 1.0e-6, 1.0e6));
  HF_READ(r.original_max_position_embeddings, scaling.integer("original_max_position_embeddings", 8192, 1, 1 << 24));
  if (r.high_freq_factor <= r.low_freq_factor)
    return scaling.error("high_freq_factor", fmt::format("{} must exceed low_freq_factor = {}", r.high_freq_factor,
                                                         r.low_freq_factor));
  return Status();
}

// rope_scaling / rope_parameters: {rope_type|type: default|llama3, ...}. Anything else is a
// rotary embedding strata's Llama does not compute.
Status read_rope_block(const nlohmann::json& block, const std::string& path, const char* key, ModelConfig& m,
                       bool holds_theta) {
  if (!block.is_object()) return refuse(path, fmt::format("key '{}' is not an object", key));
  const ConfigKeys keys(block, path, std::string(key) + ".");
  const char* type_key = keys.find("rope_type") != nullptr ? "rope_type" : "type";
  std::string type;
  HF_READ(type, keys.string(type_key, std::string("default")));
  if (holds_theta) HF_READ(m.rope_theta, keys.number("rope_theta", m.rope_theta, 1.0, 1.0e12));
  if (type == "default") return Status();
  if (type != "llama3")
    return keys.error(type_key, fmt::format("is '{}'; strata computes rotary embeddings as default or llama3 only", type));
  return read_llama3_scaling(keys, m.rope_scaling);
}

}  // namespace

Status read_rope_keys(const ConfigKeys& keys, ModelConfig& m) {
  if (const nlohmann::json* parameters = keys.find("rope_parameters"))
    STRATA_RETURN_IF_ERROR(read_rope_block(*parameters, keys.path(), "rope_parameters", m, true));
  if (const nlohmann::json* scaling = keys.find("rope_scaling"))
    STRATA_RETURN_IF_ERROR(read_rope_block(*scaling, keys.path(), "rope_scaling", m, false));
  return Status();
}

void write_decoder_shape_keys(const ModelConfig& m, nlohmann::ordered_json& json) {
  json["hidden_size"] = m.n_embd;
  json["num_hidden_layers"] = m.n_layer;
  json["num_attention_heads"] = m.n_head;
  json["num_key_value_heads"] = m.kv_heads();
  json["head_dim"] = m.head_size();
  json["intermediate_size"] = m.intermediate_size;
  json["vocab_size"] = m.vocab_size;
  json["max_position_embeddings"] = m.seq_len;
  json["rms_norm_eps"] = m.norm_eps;
  json["rope_theta"] = m.rope_theta;
}

Status read_decoder_shape_keys(const ConfigKeys& keys, const DecoderDefaults& defaults, ModelConfig& m) {
  HF_READ(m.n_layer, keys.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers));
  HF_READ(m.n_head, keys.integer("num_attention_heads", std::nullopt, 1, kMaxHeads));
  HF_READ(m.n_embd, keys.integer("hidden_size", std::nullopt, 8, kMaxEmbd));
  HF_READ(m.vocab_size, keys.integer("vocab_size", std::nullopt, 2, kMaxVocab));
  HF_READ(m.n_kv_head, keys.integer("num_key_value_heads", m.n_head, 1, kMaxHeads));
  // A head_dim the class derives (0) may be absent as 0; one it defaults must be a real width.
  HF_READ(m.head_dim, keys.integer("head_dim", defaults.head_dim, defaults.head_dim == 0 ? 0 : 2, 4096));
  HF_READ(m.intermediate_size, keys.integer("intermediate_size", std::nullopt, 1, 1 << 20));
  HF_READ(m.norm_eps, keys.number("rms_norm_eps", defaults.norm_eps, 0.0, 1.0));
  HF_READ(m.tie_word_embeddings, keys.boolean("tie_word_embeddings", defaults.tie_word_embeddings));
  uint32_t context = 0;
  HF_READ(context, keys.integer("max_position_embeddings", defaults.context, 1, UINT32_MAX));
  m.seq_len = std::min<uint32_t>(context, kMaxContext);
  HF_READ(m.rope_theta, keys.number("rope_theta", 10000.0, 1.0, 1.0e12));
  return read_rope_keys(keys, m);
}

Result<ModelConfig> read_llama_config(const ConfigKeys& keys, std::string_view model_type) {
  const bool qwen2 = model_type == "qwen2";
  const bool phi3 = model_type == "phi3";
  ModelConfig m;
  m.arch = "llama";
  m.fused_projections = phi3;
  // LlamaConfig's defaults (head_dim: hidden_size / heads); Phi3Config's rms_norm_eps is 1e-5.
  STRATA_RETURN_IF_ERROR(read_decoder_shape_keys(keys, DecoderDefaults{0, phi3 ? 1e-5 : 1e-6, false, 2048}, m));
  std::string act;
  HF_READ(act, keys.string("hidden_act", std::string("silu")));
  if (act != "silu") return keys.error("hidden_act", fmt::format("is '{}'; strata's Llama MLP is SwiGLU (silu)", act));
  if (phi3) {
    // Phi3Attention's qkv_proj and o_proj, and Phi3MLP's gate_up_proj, carry no biases; it reads
    // no attention_bias key. Its rotary embedding may cover part of each head only.
    double rotary_fraction = 1.0;
    HF_READ(rotary_fraction, keys.number("partial_rotary_factor", 1.0, 0.0, 1.0));
    if (rotary_fraction != 1.0)
      return keys.error("partial_rotary_factor", fmt::format("is {}; strata rotates every dimension of a head",
                                                             rotary_fraction));
    if (!m.rope_scaling.type.empty())  // Phi3Config knows longrope only, refused above
      return keys.error("rope_scaling", fmt::format("is {}; Phi-3 takes no such scaling", m.rope_scaling.type));
  } else if (qwen2) {
    // Qwen2Attention: q/k/v always carry biases, o_proj never; it reads neither attention_bias
    // nor mlp_bias (Qwen2MLP has no biases), so neither key means anything here.
    m.qkv_bias = true;
    m.o_proj_bias = false;
  } else {
    // LlamaAttention: attention_bias puts a bias on all four projections (Mistral has no such
    // key: never). Llama's MLP bias is not computed.
    bool bias = false;
    HF_READ(bias, keys.boolean("attention_bias", false));
    m.qkv_bias = m.o_proj_bias = bias;
    HF_READ(bias, keys.boolean("mlp_bias", false));
    if (bias) return keys.error("mlp_bias", "is true; strata's Llama MLP has no biases");
  }
  // Mistral, Phi-3 and Qwen name a window; a null one (or use_sliding_window: false) is full
  // attention. Qwen2Config's use_sliding_window defaults to false (its checkpoints carry
  // sliding_window and max_window_layers with the window off); Mistral and Phi-3 have no switch,
  // their window is on when set and covers every layer. A window of W tokens (each token sees
  // itself and the W − 1 before it, transformers' sliding mask) is full causal attention while a
  // sequence holds at most W tokens: the model's context is capped there, and a run asking for
  // more is refused (train_config.cpp) — never a silent change of the attention.
  bool use_window = !qwen2;
  HF_READ(use_window, keys.boolean("use_sliding_window", !qwen2));
  if (use_window && keys.find("sliding_window") != nullptr) {
    // Qwen 2 windows only the layers from max_window_layers on (not one rule for all), and
    // LlamaConfig has no window at all: either is refused, as before, rather than guessed.
    if (model_type != "mistral" && !phi3)
      return keys.error("sliding_window", "is set; strata's attention is full causal attention (no sliding window)");
    HF_READ(m.attention_window, keys.integer("sliding_window", std::nullopt, 1, UINT32_MAX));
    m.seq_len = std::min(m.seq_len, m.attention_window);
  }
  // Newer transformers spell the window per layer; any layer that is not full attention is one.
  if (const nlohmann::json* layer_types = keys.find("layer_types")) {
    if (!layer_types->is_array()) return keys.error("layer_types", "is not a list");
    for (const nlohmann::json& type : *layer_types)
      if (!type.is_string() || type.get<std::string>() != "full_attention")
        return keys.error("layer_types", fmt::format("holds {}; strata's attention is full causal attention (no "
                                                     "sliding window)", type.dump()));
  }
  if (m.n_head % m.n_kv_head != 0)
    return keys.error("num_key_value_heads", fmt::format("{} does not divide num_attention_heads = {}", m.n_kv_head, m.n_head));
  if (m.head_dim == 0 && m.n_embd % m.n_head != 0)
    return keys.error("hidden_size", fmt::format("{} is not divisible by num_attention_heads = {} (and no head_dim)",
                                                 m.n_embd, m.n_head));
  if (m.head_size() % 2 != 0)
    return keys.error("head_dim", fmt::format("{} is odd; rotary embeddings rotate pairs", m.head_size()));
  return m;
}

void write_llama_config(const ModelConfig& m, nlohmann::ordered_json& json) {
  // q/k/v biases alone are Qwen 2's attention (Qwen2ForCausalLM); with o_proj's too, Llama's
  // attention_bias. Either way the folder loads in transformers as the model strata trained.
  // Phi-3's fused projections are Phi3ForCausalLM's; a window without biases is Mistral's
  // (LlamaConfig has no window, and dropping it would change the model past W tokens).
  const bool qwen2 = m.qkv_bias && !m.o_proj_bias;
  const bool phi3 = m.fused_projections;
  const bool mistral = !phi3 && !m.qkv_bias && m.attention_window > 0;
  json["architectures"] = {phi3      ? "Phi3ForCausalLM"
                           : qwen2   ? "Qwen2ForCausalLM"
                           : mistral ? "MistralForCausalLM"
                                     : "LlamaForCausalLM"};
  json["model_type"] = phi3 ? "phi3" : qwen2 ? "qwen2" : mistral ? "mistral" : "llama";
  write_decoder_shape_keys(m, json);
  if (m.rope_scaling.type == "llama3")
    json["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", m.rope_scaling.factor},
                            {"low_freq_factor", m.rope_scaling.low_freq_factor},
                            {"high_freq_factor", m.rope_scaling.high_freq_factor},
                            {"original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings}};
  else
    json["rope_scaling"] = nullptr;
  json["hidden_act"] = "silu";
  if (qwen2) {
    json["use_sliding_window"] = false;
    json["sliding_window"] = nullptr;
    json["max_window_layers"] = m.n_layer;
  } else if (phi3 || mistral) {
    if (m.attention_window > 0) json["sliding_window"] = m.attention_window;
    else json["sliding_window"] = nullptr;
  } else {
    json["attention_bias"] = m.o_proj_bias;
    json["mlp_bias"] = false;
  }
  json["tie_word_embeddings"] = m.tie_word_embeddings;
}

}  // namespace strata::hf
