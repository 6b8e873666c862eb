// strata/models/hf/hf_config.h — config.json, key by key: the typed reader every architecture's
// mapping uses, and each architecture's mapping (one file each: gpt2_config.cpp,
// llama_config.cpp, gemma_config.cpp), which models/architectures.cpp lists. Internal to models/.
//
// Contract
// - config.json is untrusted: a key of the wrong JSON type or out of range is an error of kind
//   invalid_argument naming the file and the key (hf.h), never an exception.
// - A read function returns the ModelConfig a folder of that model_type is (arch, shape; init
//   "random", seq_len the model's context capped at strata's), refusing by name every key whose
//   value the definition would not compute. A write function adds the keys that load in
//   transformers as the model strata trained (hf.cpp adds the dtype and writes the file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "run/train_config.h"

namespace strata::hf {

// The bounds a YAML model section has (run/train_config.cpp), so a folder never gives a shape a
// config could not.
inline constexpr uint64_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxEmbd = 65536, kMaxVocab = 1 << 20,
                          kMaxContext = 1 << 16;

// `path: what` as an invalid_argument error: the one form of every config.json refusal.
Error refuse(const std::string& path, const std::string& what);

// Typed, bounded reads of one JSON object's keys (`prefix` names a nested object in errors: a key
// of rope_scaling is "rope_scaling.factor"). A null value reads as absent.
class ConfigKeys {
 public:
  ConfigKeys(const nlohmann::json& object, std::string path, std::string prefix = "")
      : object_(object), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const nlohmann::json* find(const char* key) const;
  const std::string& path() const { return path_; }
  Error error(const char* key, const std::string& why) const;
  Result<uint32_t> integer(const char* key, std::optional<uint32_t> fallback, uint64_t min, uint64_t max) const;
  Result<double> number(const char* key, std::optional<double> fallback, double min, double max) const;
  Result<bool> boolean(const char* key, bool fallback) const;
  Result<std::string> string(const char* key, std::optional<std::string> fallback) const;

 private:
  const nlohmann::json& object_;
  std::string path_;
  std::string prefix_;
};

// field = the read's value, or return its error.
#define HF_READ(field, expr)                         \
  do {                                               \
    auto hf_read_ = (expr);                          \
    if (!hf_read_.ok()) return hf_read_.error();     \
    field = static_cast<decltype(field)>(*hf_read_); \
  } while (0)

// --- The decoder family's keys, shared by its architectures' mappings (llama_config.cpp) ---
// What a config class assumes for an absent key (LlamaConfig's, GemmaConfig's, …).
struct DecoderDefaults {
  uint32_t head_dim = 0;  // 0: hidden_size / heads
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  uint32_t context = 2048;  // max_position_embeddings
};
// The shape keys (num_hidden_layers … rope_theta, and the rope blocks through read_rope_keys)
// into `m`, bounded as a YAML model section is; seq_len the context capped at kMaxContext.
[[nodiscard]] Status read_decoder_shape_keys(const ConfigKeys& keys, const DecoderDefaults& defaults, ModelConfig& m);
// rope_parameters (with rope_theta) and rope_scaling: a rope type default or llama3 into `m`;
// any other is refused naming the key.
[[nodiscard]] Status read_rope_keys(const ConfigKeys& keys, ModelConfig& m);
// The ten shape keys LlamaConfig and GemmaConfig name alike (hidden_size … rope_theta).
void write_decoder_shape_keys(const ModelConfig& m, nlohmann::ordered_json& json);

// --- Each architecture's mapping (models/architectures.cpp lists them) ---
Result<ModelConfig> read_gpt2_config(const ConfigKeys& keys, std::string_view model_type);
void write_gpt2_config(const ModelConfig& m, nlohmann::ordered_json& json);
// llama, mistral, qwen2 and phi3: the Llama definition with biases, fused projections or a window.
Result<ModelConfig> read_llama_config(const ConfigKeys& keys, std::string_view model_type);
void write_llama_config(const ModelConfig& m, nlohmann::ordered_json& json);
Result<ModelConfig> read_gemma_config(const ConfigKeys& keys, std::string_view model_type);
void write_gemma_config(const ModelConfig& m, nlohmann::ordered_json& json);

}  // namespace strata::hf
