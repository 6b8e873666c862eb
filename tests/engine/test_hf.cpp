// tests/engine/test_hf.cpp — Hugging Face folders (models/hf/hf.h): config.json → ModelConfig
// for GPT-2, the Llama family (both rope forms; Qwen 2's q/k/v biases and Llama's
// attention_bias, and the config.json strata writes for each) and Gemma (its defaults, its
// activation keys, its store keys), every refusal naming file and key, the index's escapes
// refused, bf16/fp16/fp32 read back exactly, and a sharded folder written and read back bit for
// bit.
//
// How: config.json texts and folders are built by hand in a scratch folder; tensors are
// stamped with their own index (and, for 16-bit files, values exact in bf16/fp16) so a value
// read from the wrong tensor, offset or shard shows. Each refusal must be invalid_argument (the
// CLI's exit 2) and its text must name the file and the key.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "models/hf/hf.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "tests/support/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

const char* kLlama3Config = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 16,
  "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": false,
  "mlp_bias": false, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";

TEST(HfConfig, Llama3ShapeAndRopeScaling) {
  Result<ModelConfig> m = hf::parse_config_json(kLlama3Config, "x/config.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->arch, "llama");
  EXPECT_EQ(m->n_layer, 2u);
  EXPECT_EQ(m->n_head, 6u);
  EXPECT_EQ(m->n_kv_head, 3u);
  EXPECT_EQ(m->head_dim, 16u);
  EXPECT_EQ(m->n_embd, 64u);
  EXPECT_EQ(m->intermediate_size, 96u);
  EXPECT_EQ(m->vocab_size, 300u);
  EXPECT_EQ(m->seq_len, 65536u);  // capped at strata's longest window
  EXPECT_DOUBLE_EQ(m->rope_theta, 500000.0);
  EXPECT_EQ(m->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(m->rope_scaling.factor, 32.0);
  EXPECT_EQ(m->rope_scaling.original_max_position_embeddings, 8192u);
  EXPECT_TRUE(m->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(m->norm_eps, 1e-5);
}

// transformers ≥ 5 writes rope_parameters (theta inside) instead of rope_theta + rope_scaling.
TEST(HfConfig, NewerRopeParametersForm) {
  const char* text = R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 250000, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 4096}})";
  Result<ModelConfig> m = hf::parse_config_json(text, "c.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_DOUBLE_EQ(m->rope_theta, 250000.0);
  EXPECT_EQ(m->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(m->rope_scaling.factor, 8.0);
  EXPECT_EQ(m->rope_scaling.original_max_position_embeddings, 4096u);
  EXPECT_FALSE(m->tie_word_embeddings);  // LlamaConfig's default
  EXPECT_EQ(m->kv_heads(), 4u);
  EXPECT_EQ(m->head_size(), 8u);
  const char* plain = R"({"model_type": "mistral", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50, "sliding_window": null,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})";
  Result<ModelConfig> mistral = hf::parse_config_json(plain, "c.json");
  ASSERT_TRUE(mistral.ok()) << mistral.error().to_string();
  EXPECT_DOUBLE_EQ(mistral->rope_theta, 1e6);
  EXPECT_EQ(mistral->rope_scaling.type, "");
}

// Qwen2.5-0.5B's config.json, abridged: the window named but off, tied, theta 1e6, eps 1e-6.
const char* kQwen25Config = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
  "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
  "num_key_value_heads": 2, "max_position_embeddings": 32768, "max_window_layers": 21,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
  "use_sliding_window": false, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "hidden_act": "silu", "vocab_size": 151936, "rope_scaling": null, "use_cache": true})";

TEST(HfConfig, Qwen2BiasesAndItsConfigBack) {
  Result<ModelConfig> m = hf::parse_config_json(kQwen25Config, "q/config.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->arch, "llama");
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_FALSE(m->o_proj_bias);
  EXPECT_TRUE(m->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(m->rope_theta, 1.0e6);
  EXPECT_DOUBLE_EQ(m->norm_eps, 1e-6);
  EXPECT_EQ(m->kv_heads(), 2u);
  EXPECT_EQ(m->head_size(), 64u);
  EXPECT_EQ(m->seq_len, 32768u);
  // Qwen2Config's use_sliding_window defaults to false: a window named without the switch is off.
  const std::string qwen_head = R"("model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50)";
  Result<ModelConfig> no_switch = hf::parse_config_json("{" + qwen_head + R"(, "sliding_window": 4096})", "c.json");
  ASSERT_TRUE(no_switch.ok()) << no_switch.error().to_string();
  EXPECT_TRUE(no_switch->qkv_bias);
  EXPECT_FALSE(no_switch->tie_word_embeddings);  // Qwen2Config's default
  // Qwen2Attention reads no attention_bias: o_proj never has one.
  Result<ModelConfig> ignored = hf::parse_config_json("{" + qwen_head + R"(, "attention_bias": true})", "c.json");
  ASSERT_TRUE(ignored.ok()) << ignored.error().to_string();
  EXPECT_FALSE(ignored->o_proj_bias);
  // What strata writes says qwen2 and reads back as the same model.
  const std::string written = hf::config_json(*m);
  EXPECT_NE(written.find(R"("model_type": "qwen2")"), std::string::npos) << written;
  EXPECT_NE(written.find(R"("Qwen2ForCausalLM")"), std::string::npos) << written;
  Result<ModelConfig> again = hf::parse_config_json(written, "c.json");
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_TRUE(again->qkv_bias);
  EXPECT_FALSE(again->o_proj_bias);
  EXPECT_TRUE(again->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(again->rope_theta, 1.0e6);
  EXPECT_DOUBLE_EQ(again->norm_eps, 1e-6);
  EXPECT_EQ(again->n_kv_head, 2u);
  EXPECT_EQ(again->head_dim, 64u);
}

// LlamaAttention's attention_bias: all four projections carry biases; written back as llama.
TEST(HfConfig, LlamaAttentionBias) {
  const char* text = R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50, "attention_bias": true})";
  Result<ModelConfig> m = hf::parse_config_json(text, "c.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_TRUE(m->qkv_bias);
  EXPECT_TRUE(m->o_proj_bias);
  const std::string written = hf::config_json(*m);
  EXPECT_NE(written.find(R"("model_type": "llama")"), std::string::npos) << written;
  Result<ModelConfig> again = hf::parse_config_json(written, "c.json");
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_TRUE(again->qkv_bias);
  EXPECT_TRUE(again->o_proj_bias);
  // Without the key: no biases, and none written.
  Result<ModelConfig> plain = hf::parse_config_json(kLlama3Config, "c.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->qkv_bias);
  EXPECT_FALSE(plain->o_proj_bias);
  EXPECT_NE(hf::config_json(*plain).find(R"("attention_bias": false)"), std::string::npos);
}

// The Qwen 2 definition (models/model.h) from its config.json: each bias right after its
// weight in HF's names and shapes, none on o_proj, zero init and no decay; the store's keys
// round-trip the biases, a store from before them reads as without, and a resume across them is
// refused naming model.qkv_bias.
TEST(HfConfig, Qwen2DefinitionAndStoreKeys) {
  const char* text = R"({"model_type": "qwen2", "hidden_size": 80, "num_hidden_layers": 2,
    "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 16, "intermediate_size": 112,
    "vocab_size": 67, "max_position_embeddings": 16, "tie_word_embeddings": true})";
  Result<ModelConfig> m = hf::parse_config_json(text, "c.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  const std::vector<hf::TensorSpec> tensors = hf::model_tensors(*m);
  ASSERT_EQ(tensors.size(), 1u + 2u * 12u + 1u);  // embed, 12 per block, norm (tied: no lm_head)
  const std::vector<std::pair<std::string, std::vector<int64_t>>> block0 = {
      {"model.layers.0.input_layernorm.weight", {80}},   {"model.layers.0.self_attn.q_proj.weight", {96, 80}},
      {"model.layers.0.self_attn.q_proj.bias", {96}},    {"model.layers.0.self_attn.k_proj.weight", {48, 80}},
      {"model.layers.0.self_attn.k_proj.bias", {48}},    {"model.layers.0.self_attn.v_proj.weight", {48, 80}},
      {"model.layers.0.self_attn.v_proj.bias", {48}},    {"model.layers.0.self_attn.o_proj.weight", {80, 96}},
      {"model.layers.0.post_attention_layernorm.weight", {80}}};
  for (size_t i = 0; i < block0.size(); ++i) {
    EXPECT_EQ(tensors[1 + i].name, block0[i].first);
    EXPECT_EQ(tensors[1 + i].shape, block0[i].second) << block0[i].first;
  }
  const auto definition = models::make_model_definition(*m);
  int biases = 0;
  for (const Unit& unit : definition->units())
    for (const UnitTensor& tensor : unit.tensors)
      if (tensor.name.ends_with(".bias")) {
        ++biases;
        EXPECT_FALSE(tensor.weight_decay) << tensor.name;
        EXPECT_EQ(tensor.init_std, 0.0) << tensor.name;
        EXPECT_EQ(tensor.init_value, 0.0f) << tensor.name;
      }
  EXPECT_EQ(biases, 6);

  const auto keys = models::store_metadata(*m);
  EXPECT_EQ(keys.at("model.qkv_bias"), "1");
  EXPECT_EQ(keys.at("model.o_proj_bias"), "0");
  Result<ModelConfig> back = models::model_from_store_metadata(keys, "store");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->qkv_bias);
  EXPECT_FALSE(back->o_proj_bias);
  EXPECT_EQ(models::first_shape_difference(*back, *m).value_or("none"), "none");
  auto old_store = keys;  // written before the bias keys existed
  old_store.erase("model.qkv_bias");
  old_store.erase("model.o_proj_bias");
  Result<ModelConfig> old = models::model_from_store_metadata(old_store, "store");
  ASSERT_TRUE(old.ok()) << old.error().to_string();
  EXPECT_FALSE(old->qkv_bias);
  EXPECT_EQ(models::first_shape_difference(*old, *m).value_or("none"), "model.qkv_bias");
  auto corrupt = keys;
  corrupt["model.qkv_bias"] = "2";
  Result<ModelConfig> refused = models::model_from_store_metadata(corrupt, "store");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("model.qkv_bias"), std::string::npos) << refused.error().message;
}

TEST(HfConfig, Gpt2Shape) {
  const char* text = R"({"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768,
    "vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024, "layer_norm_epsilon": 1e-05,
    "activation_function": "gelu_new", "resid_pdrop": 0.1})";
  Result<ModelConfig> m = hf::parse_config_json(text, "c.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->arch, "gpt2");
  EXPECT_EQ(m->n_layer, 12u);
  EXPECT_EQ(m->n_embd, 768u);
  EXPECT_EQ(m->vocab_size, 50257u);
  EXPECT_EQ(m->seq_len, 1024u);
  // What strata writes reads back as the same shape.
  Result<ModelConfig> again = hf::parse_config_json(hf::config_json(*m), "c.json");
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ(again->n_layer, m->n_layer);
  EXPECT_EQ(again->n_head, m->n_head);
  EXPECT_EQ(again->vocab_size, m->vocab_size);
  EXPECT_EQ(again->seq_len, m->seq_len);
  Result<ModelConfig> llama = hf::parse_config_json(kLlama3Config, "c.json");
  ASSERT_TRUE(llama.ok());
  Result<ModelConfig> llama_again = hf::parse_config_json(hf::config_json(*llama), "c.json");
  ASSERT_TRUE(llama_again.ok()) << llama_again.error().to_string();
  EXPECT_EQ(llama_again->n_kv_head, 3u);
  EXPECT_EQ(llama_again->head_dim, 16u);
  EXPECT_DOUBLE_EQ(llama_again->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(llama_again->rope_theta, 500000.0);
}

// Gemma 2B's config.json as the updated hub configs carry it: multi-query (1 k/v head), head_dim
// 256 apart from hidden_size / heads, the tanh GELU named by hidden_activation (hidden_act still
// Gemma 1.0's "gelu"), tied. Read as arch gemma, written back as GemmaForCausalLM, recorded in a
// store with Llama's keys; a resume as llama is refused naming model.arch.
const char* kGemma2bConfig = R"({
  "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256,
  "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 16384, "max_position_embeddings": 8192,
  "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
  "vocab_size": 256000})";

TEST(HfConfig, GemmaShapeConfigBackAndStoreKeys) {
  Result<ModelConfig> m = hf::parse_config_json(kGemma2bConfig, "g/config.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->arch, "gemma");
  EXPECT_EQ(m->n_layer, 18u);
  EXPECT_EQ(m->n_head, 8u);
  EXPECT_EQ(m->kv_heads(), 1u);
  EXPECT_EQ(m->head_size(), 256u);  // not 2048 / 8
  EXPECT_EQ(m->n_embd, 2048u);
  EXPECT_EQ(m->intermediate_size, 16384u);
  EXPECT_EQ(m->vocab_size, 256000u);
  EXPECT_EQ(m->seq_len, 8192u);
  EXPECT_DOUBLE_EQ(m->norm_eps, 1e-6);
  EXPECT_TRUE(m->tie_word_embeddings);
  EXPECT_FALSE(m->qkv_bias);
  // GemmaConfig's defaults: head_dim 256, tied, eps 1e-6, 8192 positions, the tanh GELU.
  Result<ModelConfig> defaults = hf::parse_config_json(R"({"model_type": "gemma", "hidden_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 96, "vocab_size": 50})", "c.json");
  ASSERT_TRUE(defaults.ok()) << defaults.error().to_string();
  EXPECT_EQ(defaults->head_size(), 256u);
  EXPECT_TRUE(defaults->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(defaults->norm_eps, 1e-6);
  EXPECT_EQ(defaults->seq_len, 8192u);
  // What strata writes is GemmaForCausalLM's, both activation keys the tanh GELU, and reads back.
  const std::string written = hf::config_json(*m);
  for (const char* want : {R"("model_type": "gemma")", R"("GemmaForCausalLM")", R"("head_dim": 256)",
                           R"("hidden_act": "gelu_pytorch_tanh")", R"("hidden_activation": "gelu_pytorch_tanh")",
                           R"("num_key_value_heads": 1)", R"("tie_word_embeddings": true)"})
    EXPECT_NE(written.find(want), std::string::npos) << want << " in " << written;
  Result<ModelConfig> again = hf::parse_config_json(written, "c.json");
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ(models::first_shape_difference(*again, *m).value_or("none"), "none");
  // The tensor list is Llama's names (tied: no lm_head).
  const std::vector<hf::TensorSpec> tensors = hf::model_tensors(*defaults);
  ASSERT_EQ(tensors.size(), 1u + 9u + 1u);
  EXPECT_EQ(tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(tensors[2].shape, (std::vector<int64_t>{512, 64}));  // 2 heads × 256
  EXPECT_EQ(tensors.back().name, "model.norm.weight");
  // A store records Llama's keys under arch gemma and reads them back as the same model.
  const auto keys = models::store_metadata(*m);
  EXPECT_EQ(keys.at("model.arch"), "gemma");
  EXPECT_EQ(keys.at("model.head_dim"), "256");
  EXPECT_EQ(keys.at("model.n_kv_head"), "1");
  Result<ModelConfig> back = models::model_from_store_metadata(keys, "store");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->arch, "gemma");
  EXPECT_EQ(models::first_shape_difference(*back, *m).value_or("none"), "none");
  ModelConfig as_llama = *m;
  as_llama.arch = "llama";
  EXPECT_EQ(models::first_shape_difference(as_llama, *m).value_or("none"), "model.arch");
  auto biased = keys;  // a gemma store never has biases: corrupt metadata, refused
  biased["model.qkv_bias"] = "1";
  Result<ModelConfig> refused = models::model_from_store_metadata(biased, "store");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("gemma"), std::string::npos) << refused.error().message;
}

// Each case: a config.json text and the key its refusal must name.
TEST(HfConfig, RefusalsNameFileAndKey) {
  const std::string llama_head = R"("model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50)";
  const std::string qwen_head = R"("model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50)";
  const std::string gemma_head = R"("model_type": "gemma", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50, "head_dim": 8)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "valid JSON"},
      // Gemma 1.0's original config: hidden_act "gelu" (exact GELU in transformers ≥ 4.48) and
      // no hidden_activation; any other activation; what Gemma has not.
      {"{" + gemma_head + R"(, "hidden_act": "gelu"})", "hidden_act"},
      {"{" + gemma_head + R"(, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "silu"})",
       "hidden_activation"},
      {"{" + gemma_head + R"(, "attention_bias": true})", "attention_bias"},
      {"{" + gemma_head + R"(, "use_bidirectional_attention": true})", "use_bidirectional_attention"},
      {"{" + gemma_head + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})", "rope_scaling"},
      {"{" + gemma_head + R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
      {"{" + gemma_head + R"(, "head_dim": 7})", "head_dim"},
      {R"({"model_type": "gemma2", "hidden_size": 32})", "model_type"},
      {"[]", "JSON object"},
      {R"({"n_layer": 1})", "model_type"},
      {R"({"model_type": "bert"})", "model_type"},
      {R"({"model_type": "qwen3", "hidden_size": 32})", "model_type"},
      {"{" + llama_head + R"(, "attention_bias": "yes"})", "attention_bias"},
      {"{" + llama_head + R"(, "mlp_bias": true})", "mlp_bias"},
      {"{" + qwen_head + R"(, "use_sliding_window": true, "sliding_window": 4096})", "sliding_window"},
      {"{" + qwen_head + R"(, "layer_types": ["full_attention", "sliding_attention"]})", "layer_types"},
      {"{" + qwen_head + R"(, "rope_scaling": {"type": "yarn", "factor": 4.0}})", "rope_scaling.type"},
      {"{" + llama_head + R"(, "sliding_window": 4096})", "sliding_window"},
      {"{" + llama_head + R"(, "hidden_act": "gelu"})", "hidden_act"},
      {"{" + llama_head + R"(, "rope_scaling": {"type": "linear", "factor": 2.0}})", "rope_scaling.type"},
      {"{" + llama_head + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})", "rope_scaling.rope_type"},
      {"{" + llama_head + R"(, "rope_parameters": {"rope_type": "dynamic"}})", "rope_parameters.rope_type"},
      {"{" + llama_head + R"(, "rope_scaling": {"rope_type": "llama3"}})", "rope_scaling.factor"},
      {"{" + llama_head + R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
      {"{" + llama_head + R"(, "head_dim": 7})", "head_dim"},
      {"{" + llama_head + R"(, "rms_norm_eps": "small"})", "rms_norm_eps"},
      {R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": -4})", "hidden_size"},
      {R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 32.5})",
       "hidden_size"},
      {R"({"model_type": "gpt2", "n_layer": 2, "n_head": 3, "n_embd": 16, "vocab_size": 9, "n_positions": 8})",
       "n_embd"},
      {R"({"model_type": "gpt2", "n_layer": 0, "n_head": 2, "n_embd": 16, "vocab_size": 9, "n_positions": 8})",
       "n_layer"},
      {R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 9, "n_positions": 8,
           "activation_function": "relu"})", "activation_function"},
  };
  for (const auto& [text, key] : cases) {
    Result<ModelConfig> m = hf::parse_config_json(text, "dir/config.json");
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.error().kind, ErrorKind::invalid_argument) << text;
    EXPECT_NE(m.error().message.find("dir/config.json"), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find(key), std::string::npos) << "want '" << key << "' in: " << m.error().message;
  }
}

TEST(HfIndex, FileNamesThatLeaveTheFolderAreRefused) {
  for (const char* bad : {"../x.safetensors", "/etc/x.safetensors", "sub/x.safetensors", "..", "x.bin", ""}) {
    const std::string text = std::string(R"({"weight_map": {"w": ")") + bad + R"("}})";
    auto map = hf::parse_index_json(text, "i.json");
    ASSERT_FALSE(map.ok()) << bad;
    EXPECT_NE(map.error().message.find("weight_map.w"), std::string::npos) << map.error().message;
  }
  EXPECT_FALSE(hf::parse_index_json(R"({"weight_map": {"w": 3}})", "i.json").ok());
  EXPECT_FALSE(hf::parse_index_json(R"({"weight_map": []})", "i.json").ok());
  EXPECT_FALSE(hf::parse_index_json(R"({"weight_map": {}})", "i.json").ok());
  auto good = hf::parse_index_json(R"({"metadata": {}, "weight_map": {"w": "model-00001-of-00002.safetensors"}})", "i");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->at("w"), "model-00001-of-00002.safetensors");
}

// A small Llama: odd shapes (3 KV heads × 2 groups, head_dim 16), untied.
ModelConfig small_llama() {
  ModelConfig m;
  m.arch = "llama";
  m.n_layer = 2;
  m.n_head = 6;
  m.n_kv_head = 3;
  m.head_dim = 16;
  m.n_embd = 40;
  m.intermediate_size = 24;
  m.vocab_size = 33;
  m.seq_len = 16;
  m.tie_word_embeddings = false;
  return m;
}

// Values stamped with the tensor index and the element index, exact in bf16 and fp16.
float stamp(size_t tensor, uint64_t i) { return static_cast<float>(tensor * 8 + i % 8) * 0.25f - 3.0f; }

uint16_t to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact for stamp()'s values
}
uint16_t to_f16(float value) {  // exact for small multiples of 1/4 (normal range)
  if (value == 0.0f) return 0;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = bits >> 31;
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  const uint32_t mantissa = (bits >> 13) & 0x3ff;
  return static_cast<uint16_t>((sign << 15) | (static_cast<uint32_t>(exponent) << 10) | mantissa);
}

// Writes `tensors` as one safetensors file in `dtype`, stamped.
void write_stamped(const std::string& path, const std::vector<hf::TensorSpec>& tensors, size_t first_index,
                   DType dtype) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, dtype, t.shape});
  auto writer = SafetensorsWriter::create(path, specs, {});
  ASSERT_TRUE(writer.ok());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const uint64_t n = tensors[k].element_count();
    std::vector<float> f(n);
    std::vector<uint16_t> h(n);
    for (uint64_t i = 0; i < n; ++i) {
      f[i] = stamp(first_index + k, i);
      h[i] = dtype == DType::bf16 ? to_bf16(f[i]) : to_f16(f[i]);
    }
    ASSERT_TRUE(writer->write_next(dtype == DType::f32 ? static_cast<const void*>(f.data()) : h.data(),
                                   n * dtype_size_bytes(dtype)).ok());
  }
  ASSERT_TRUE(writer->finish().ok());
}

void expect_stamped(const hf::Checkpoint& checkpoint, const std::vector<hf::TensorSpec>& tensors) {
  ASSERT_TRUE(checkpoint.check(tensors).ok());
  for (size_t k = 0; k < tensors.size(); ++k) {
    std::vector<float> got(tensors[k].element_count(), -99.0f);
    Status read = checkpoint.read_fp32(tensors[k], got.data());
    ASSERT_TRUE(read.ok()) << read.error().to_string();
    for (uint64_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], stamp(k, i)) << tensors[k].name << " element " << i;
  }
}

// A sharded Llama folder in bf16 (shard 1) and fp16 (shard 2): every tensor widens exactly.
TEST(HfCheckpoint, ShardedLlamaWidensBf16AndFp16) {
  strata::testing::TempDir temp;
  const auto tensors = hf::model_tensors(small_llama());
  ASSERT_EQ(tensors.size(), 1u + 2u * 9u + 1u + 1u);
  EXPECT_EQ(tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(tensors[2].shape, (std::vector<int64_t>{96, 40}));  // nn.Linear [out, in]
  EXPECT_EQ(tensors[3].shape, (std::vector<int64_t>{48, 40}));  // 3 KV heads × 16
  EXPECT_EQ(tensors.back().name, "lm_head.weight");
  const size_t half = tensors.size() / 2;
  std::vector<hf::TensorSpec> first(tensors.begin(), tensors.begin() + static_cast<long>(half));
  std::vector<hf::TensorSpec> second(tensors.begin() + static_cast<long>(half), tensors.end());
  write_stamped(temp.file("a.safetensors"), first, 0, DType::bf16);
  write_stamped(temp.file("b.safetensors"), second, half, DType::f16);
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  for (size_t k = 0; k < tensors.size(); ++k)
    index += (k ? "," : "") + ("\"" + tensors[k].name + "\": \"" + (k < half ? "a" : "b") + ".safetensors\"");
  write_text(temp.file("model.safetensors.index.json"), index + "}}");
  auto checkpoint = hf::Checkpoint::open(temp.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().to_string();
  expect_stamped(*checkpoint, tensors);

  // A wrong shape is refused naming the file and the tensor.
  ModelConfig wider = small_llama();
  wider.intermediate_size = 25;
  Status wrong = checkpoint->check(hf::model_tensors(wider));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(wrong.error().message.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << wrong.error().message;
  EXPECT_NE(wrong.error().message.find("a.safetensors"), std::string::npos) << wrong.error().message;
  // Tied: lm_head is not needed, and a checkpoint without it passes.
  ModelConfig tied = small_llama();
  tied.tie_word_embeddings = true;
  EXPECT_TRUE(checkpoint->check(hf::model_tensors(tied)).ok());
}

TEST(HfCheckpoint, IndexEscapesAndLiesAreRefused) {
  strata::testing::TempDir temp;
  strata::testing::TempDir outside;
  const std::vector<hf::TensorSpec> tensors = {{"w", {4}}};
  write_stamped(outside.file("x.safetensors"), tensors, 0, DType::f32);
  fs::create_directory(temp.path() / "m");
  const std::string folder = (temp.path() / "m").string();
  // A symlink inside the folder that points outside it.
  fs::create_symlink(outside.file("x.safetensors"), temp.path() / "m" / "link.safetensors");
  write_text(folder + "/model.safetensors.index.json", R"({"weight_map": {"w": "link.safetensors"}})");
  auto escaped = hf::Checkpoint::open(folder);
  ASSERT_FALSE(escaped.ok());
  EXPECT_EQ(escaped.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(escaped.error().message.find("outside the folder"), std::string::npos) << escaped.error().message;
  // The index names a tensor its shard does not hold.
  write_stamped(folder + "/real.safetensors", tensors, 0, DType::f32);
  write_text(folder + "/model.safetensors.index.json",
             R"({"weight_map": {"w": "real.safetensors", "ghost": "real.safetensors"}})");
  auto lying = hf::Checkpoint::open(folder);
  ASSERT_FALSE(lying.ok());
  EXPECT_NE(lying.error().message.find("weight_map.ghost"), std::string::npos) << lying.error().message;
  // A missing shard names the file.
  write_text(folder + "/model.safetensors.index.json", R"({"weight_map": {"w": "gone.safetensors"}})");
  auto missing = hf::Checkpoint::open(folder);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().to_string().find("gone.safetensors"), std::string::npos) << missing.error().to_string();
  // A corrupt shard header is invalid input (exit 2), naming the shard.
  write_text(folder + "/real.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"w\":[1,2]}     ", 24));
  write_text(folder + "/model.safetensors.index.json", R"({"weight_map": {"w": "real.safetensors"}})");
  auto corrupt = hf::Checkpoint::open(folder);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(corrupt.error().to_string().find("real.safetensors"), std::string::npos) << corrupt.error().to_string();
}

// GPT-2 with the `transformer.` prefix and a position table longer than the run's window.
TEST(HfCheckpoint, Gpt2PrefixAndLongerPositionTable) {
  strata::testing::TempDir temp;
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 8;
  m.vocab_size = 11;
  m.seq_len = 4;
  const auto tensors = hf::model_tensors(m);
  ModelConfig longer = m;
  longer.seq_len = 9;
  auto file_tensors = hf::model_tensors(longer);
  for (auto& t : file_tensors) t.name = "transformer." + t.name;
  write_stamped(temp.file("model.safetensors"), file_tensors, 0, DType::f32);
  auto checkpoint = hf::Checkpoint::open(temp.path().string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().to_string();
  expect_stamped(*checkpoint, tensors);  // wpe: the first 4 of 9 rows, stamped alike
  // A position table shorter than the window is refused.
  ModelConfig too_long = m;
  too_long.seq_len = 12;
  EXPECT_FALSE(checkpoint->check(hf::model_tensors(too_long)).ok());
}

// Written with a tiny shard size, read back bit for bit; the config round-trips; a second
// export to the same path is refused and leaves the first intact.
TEST(HfFolderWriter, ShardedRoundTripIsBitIdentical) {
  strata::testing::TempDir temp;
  const ModelConfig model = small_llama();
  const auto tensors = hf::model_tensors(model);
  const std::string out = temp.file("export");
  size_t shard_count = 0;
  {
    auto writer = hf::FolderWriter::create(out, model, tensors, 6000, {{"strata_step", "3"}});
    ASSERT_TRUE(writer.ok()) << writer.error().to_string();
    shard_count = writer->shard_count();
    ASSERT_GT(shard_count, 2u);
    ASSERT_LT(shard_count, 100u);
    for (size_t k = 0; k < tensors.size(); ++k) {
      std::vector<float> values(tensors[k].element_count());
      for (uint64_t i = 0; i < values.size(); ++i) values[i] = stamp(k, i);
      ASSERT_TRUE(writer->write_next(values.data()).ok());
      EXPECT_FALSE(fs::exists(out));  // nothing under the final name before finish()
    }
    ASSERT_TRUE(writer->finish().ok());
  }
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  size_t shard_files = 0;
  for (const auto& entry : fs::directory_iterator(out))
    shard_files += entry.path().filename().string().rfind("model-", 0) == 0 ? 1 : 0;
  EXPECT_EQ(shard_files, shard_count);
  char last_name[64];
  std::snprintf(last_name, sizeof last_name, "/model-%05zu-of-%05zu.safetensors", shard_count, shard_count);
  EXPECT_TRUE(fs::exists(out + last_name)) << last_name;
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  auto config = hf::read_config(out);
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  EXPECT_EQ(config->n_kv_head, 3u);
  EXPECT_FALSE(config->tie_word_embeddings);
  auto checkpoint = hf::Checkpoint::open(out);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().to_string();
  expect_stamped(*checkpoint, tensors);
  auto again = hf::FolderWriter::create(out, model, tensors, 6000, {});
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already exists"), std::string::npos);
  // An abandoned writer leaves nothing behind.
  {
    auto abandoned = hf::FolderWriter::create(temp.file("half"), model, tensors, 1 << 20, {});
    ASSERT_TRUE(abandoned.ok());
    std::vector<float> values(tensors[0].element_count(), 1.0f);
    ASSERT_TRUE(abandoned->write_next(values.data()).ok());
  }
  EXPECT_FALSE(fs::exists(temp.file("half")));
  EXPECT_FALSE(fs::exists(temp.file("half.tmp")));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Phi-3-mini-4k-instruct's config.json, abridged (its shape keys, window, defaults).
const char* kPhi3MiniConfig = R"({
  "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
  "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 32, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
  "tie_word_embeddings": false, "vocab_size": 32064, "hidden_act": "silu", "attention_dropout": 0.0,
  "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
  "torch_dtype": "bfloat16"})";

TEST(HfConfig, Phi3FusedProjectionsAndItsWindow) {
  Result<ModelConfig> m = hf::parse_config_json(kPhi3MiniConfig, "phi3/config.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->arch, "llama");
  EXPECT_TRUE(m->fused_projections);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_EQ(m->attention_window, 2047u);
  EXPECT_EQ(m->seq_len, 2047u);  // full causal attention equals the window up to here
  EXPECT_DOUBLE_EQ(m->norm_eps, 1e-5);
  // Its tensors, as the checkpoint holds them: q/k/v rows of qkv_proj, gate/up of gate_up_proj.
  const hf::TensorSpec q = hf::tensor_spec(*m, "model.layers.3.self_attn.q_proj.weight", {3072, 3072});
  const hf::TensorSpec v = hf::tensor_spec(*m, "model.layers.3.self_attn.v_proj.weight", {3072, 3072});
  const hf::TensorSpec up = hf::tensor_spec(*m, "model.layers.3.mlp.up_proj.weight", {8192, 3072});
  const hf::TensorSpec o = hf::tensor_spec(*m, "model.layers.3.self_attn.o_proj.weight", {3072, 3072});
  EXPECT_EQ(q.fused_name, "model.layers.3.self_attn.qkv_proj.weight");
  EXPECT_EQ(q.fused_row_begin, 0);
  EXPECT_EQ(q.fused_rows, 9216);
  EXPECT_EQ(v.fused_row_begin, 6144);
  EXPECT_EQ(up.fused_name, "model.layers.3.mlp.gate_up_proj.weight");
  EXPECT_EQ(up.fused_row_begin, 8192);
  EXPECT_EQ(up.fused_rows, 16384);
  EXPECT_TRUE(o.fused_name.empty());
  // Written back as Phi-3 with its window.
  Result<ModelConfig> back = hf::parse_config_json(hf::config_json(*m), "out/config.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->fused_projections);
  EXPECT_EQ(back->attention_window, 2047u);
  EXPECT_NE(hf::config_json(*m).find("\"Phi3ForCausalLM\""), std::string::npos);
  // The store keeps both, so a resumed or exported run knows the layout and the window.
  const auto keys = models::store_metadata(*m);
  std::map<std::string, std::string> metadata(keys.begin(), keys.end());
  Result<ModelConfig> stored = models::model_from_store_metadata(metadata, "store");
  ASSERT_TRUE(stored.ok()) << stored.error().to_string();
  EXPECT_TRUE(stored->fused_projections);
  EXPECT_EQ(stored->attention_window, 2047u);

  // Refused: a partial rotary embedding (Phi-4-mini's 0.75), longrope (the 128k Phi-3s).
  const std::string head = R"("model_type": "phi3", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50)";
  Result<ModelConfig> partial = hf::parse_config_json("{" + head + R"(, "partial_rotary_factor": 0.75})", "c.json");
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.error().message.find("partial_rotary_factor"), std::string::npos);
  Result<ModelConfig> longrope = hf::parse_config_json(
      "{" + head + R"(, "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}})", "c.json");
  ASSERT_FALSE(longrope.ok());
  EXPECT_NE(longrope.error().message.find("rope_scaling"), std::string::npos);
}

TEST(HfConfig, MistralWindowCapsTheContext) {
  const char* text = R"({"model_type": "mistral", "hidden_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 40, "vocab_size": 50, "max_position_embeddings": 32768,
    "sliding_window": 4096})";
  Result<ModelConfig> m = hf::parse_config_json(text, "c.json");
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->attention_window, 4096u);
  EXPECT_EQ(m->seq_len, 4096u);
  EXPECT_FALSE(m->fused_projections);
  const std::string out = hf::config_json(*m);
  EXPECT_NE(out.find("\"mistral\""), std::string::npos) << out;
  Result<ModelConfig> back = hf::parse_config_json(out, "out/config.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->attention_window, 4096u);
}

// A Phi-3 folder: the fused tensors are read as their parts, and written back fused, bit for bit.
TEST(HfCheckpoint, Phi3FusedTensorsReadAsPartsAndWrittenWhole) {
  strata::testing::TempDir temp;
  ModelConfig model = small_llama();
  model.fused_projections = true;
  const auto parts = hf::model_tensors(model);
  // The checkpoint as Phi-3 holds it: write through FolderWriter, which fuses.
  const std::string folder = temp.file("phi3");
  {
    auto writer = hf::FolderWriter::create(folder, model, parts, hf::FolderWriter::kDefaultShardSizeBytes, {});
    ASSERT_TRUE(writer.ok()) << writer.error().to_string();
    for (size_t k = 0; k < parts.size(); ++k) {
      std::vector<float> values(parts[k].element_count());
      for (uint64_t i = 0; i < values.size(); ++i) values[i] = stamp(k, i);
      ASSERT_TRUE(writer->write_next(values.data()).ok());
    }
    ASSERT_TRUE(writer->finish().ok());
  }
  auto checkpoint = hf::Checkpoint::open(folder);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().to_string();
  // No q_proj in the file: qkv_proj [96 + 48 + 48, 40] and gate_up_proj [2·I, 40] instead.
  std::vector<hf::TensorSpec> unfused;
  for (const hf::TensorSpec& spec : parts) unfused.push_back({spec.name, spec.shape});
  EXPECT_FALSE(checkpoint->check(unfused).ok());
  expect_stamped(*checkpoint, parts);
  auto config = hf::read_config(folder);
  ASSERT_TRUE(config.ok()) << config.error().to_string();
  EXPECT_TRUE(config->fused_projections);
  // A fused tensor of the wrong size names it.
  ModelConfig wider = model;
  wider.intermediate_size += 1;
  Status wrong = checkpoint->check(hf::model_tensors(wider));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("gate_up_proj"), std::string::npos) << wrong.error().message;
}

}  // namespace
}  // namespace strata
