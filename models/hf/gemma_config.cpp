// models/hf/gemma_config.cpp — Gemma 1's config.json (GemmaConfig) both ways (hf_config.h).
#include <algorithm>

#include "models/hf/hf_config.h"

namespace strata::hf {

// GemmaForCausalLM (Gemma 1): Llama's keys with GemmaConfig's defaults — head_dim 256 (not
// hidden_size / heads), rms_norm_eps 1e-6, tied, a context of 8192 — and Gemma's math, which the
// definition (models/gemma.cpp) computes: RMSNorm x·(1 + w), GeGLU, embeddings times √hidden.
// What it does not compute is refused naming the key.
Result<ModelConfig> read_gemma_config(const ConfigKeys& keys, std::string_view /*model_type*/) {
  ModelConfig m;
  m.arch = "gemma";
  STRATA_RETURN_IF_ERROR(read_decoder_shape_keys(keys, DecoderDefaults{256, 1e-6, true, 8192}, m));
  if (!m.rope_scaling.type.empty())
    return keys.error(keys.find("rope_scaling") != nullptr ? "rope_scaling" : "rope_parameters",
                      fmt::format("is {}; strata's Gemma rotates without scaling", m.rope_scaling.type));
  // The MLP's activation: transformers up to 4.47 read hidden_activation (None: the tanh GELU,
  // whatever hidden_act said — Gemma 1.0's configs say "gelu" and were trained with the tanh
  // form); later versions read hidden_act. strata computes the tanh form, so it takes the key
  // that names the activation — hidden_activation when present, else hidden_act — and refuses
  // any other activation rather than guess which transformers the folder was made for.
  const char* act_key = keys.find("hidden_activation") != nullptr ? "hidden_activation" : "hidden_act";
  std::string act;
  HF_READ(act, keys.string(act_key, std::string("gelu_pytorch_tanh")));
  if (act != "gelu_pytorch_tanh" && act != "gelu_new")
    return keys.error(act_key, fmt::format("is '{}'; strata's Gemma MLP is GeGLU with the tanh GELU "
                                           "(gelu_pytorch_tanh){}", act,
                                           act == "gelu" ? " — set hidden_activation: gelu_pytorch_tanh if the "
                                                           "checkpoint was trained with it, as Gemma 1 was"
                                                         : ""));
  bool flag = false;
  HF_READ(flag, keys.boolean("attention_bias", false));
  if (flag) return keys.error("attention_bias", "is true; strata's Gemma has no attention biases");
  HF_READ(flag, keys.boolean("use_bidirectional_attention", false));
  if (flag) return keys.error("use_bidirectional_attention", "is true; strata's attention is causal");
  if (m.n_head % m.n_kv_head != 0)
    return keys.error("num_key_value_heads", fmt::format("{} does not divide num_attention_heads = {}", m.n_kv_head, m.n_head));
  if (m.head_dim % 2 != 0)
    return keys.error("head_dim", fmt::format("{} is odd; rotary embeddings rotate pairs", m.head_dim));
  return m;
}

void write_gemma_config(const ModelConfig& m, nlohmann::ordered_json& json) {
  // GemmaForCausalLM: both activation keys name the tanh GELU, so transformers computes it
  // whichever of them its version reads (read_gemma_config).
  json["architectures"] = {"GemmaForCausalLM"};
  json["model_type"] = "gemma";
  write_decoder_shape_keys(m, json);
  json["rope_scaling"] = nullptr;
  json["hidden_act"] = "gelu_pytorch_tanh";
  json["hidden_activation"] = "gelu_pytorch_tanh";
  json["attention_bias"] = false;
  json["tie_word_embeddings"] = m.tie_word_embeddings;
}

}  // namespace strata::hf
