// strata/models/architectures.h — the one list of the architectures strata trains. Every place
// that needs to know which architectures exist, or what one of them is, asks here by name.
//
// Contract
// - One row per architecture, named by `model.arch` (a config's key, a store's metadata key):
//   its label, which shape keys it has (GPT-2's five, or the decoder family's too), which of the
//   decoder keys its definition computes (a config, a store or a config.json that sets another is
//   refused naming the key), its Hugging Face model types and config.json mapping, its linears
//   for LoRA, how PEFT names its tensors, and the function that makes its definition.
// - Adding an architecture is a definition file (models/<arch>.cpp, definitions.h), its
//   config.json mapping (models/hf/<arch>_config.cpp, hf_config.h) and one row in
//   architectures.cpp. Nothing else lists architectures; docs/extending.md walks through it.
// - The rows are constants built once; the references and pointers handed out live for the
//   process.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "run/train_config.h"

namespace strata::hf {
class ConfigKeys;  // models/hf/hf_config.h: config.json's keys, typed and bounded
}

namespace strata::models {

class ModelDefinition;  // models/model.h

struct Architecture {
  std::string_view name;   // "gpt2": model.arch
  std::string_view label;  // "GPT-2": how a plan or an error names it to a person
  // The decoder family's keys (n_kv_head, head_dim, intermediate_size, RoPE, RMSNorm eps, tied
  // head, biases): read from a config, recorded in a store. Without them, GPT-2's five keys.
  bool decoder_keys = false;
  // Learned positions: seq_len is at most the checkpoint's (GPT-2's wpe rows).
  bool learned_positions = false;
  // Which of the decoder keys the definition computes; setting one it does not is refused.
  bool attention_biases = false;  // qkv_bias, o_proj_bias
  bool rope_scaling = false;      // rope_scaling (llama3)
  bool fused_projections = false; // a checkpoint's qkv_proj / gate_up_proj (Phi-3)
  bool attention_window = false;  // a checkpoint's sliding window, capping seq_len
  double default_norm_eps = 1e-5; // the YAML's norm_eps default (the HF config class's)
  // Its block linears' weights are stored [in, out] (GPT-2's Conv1D): PEFT's fan_in_fan_out.
  bool conv1d = false;
  // The prefix of the base model's tensor names inside a PEFT state dict, after
  // "base_model.model." ("transformer." for GPT2LMHeadModel's body).
  std::string_view peft_prefix;
  // LoRA's target names (PEFT's target_modules): each linear's module name and block suffix,
  // and PEFT's defaults when a config names none.
  std::vector<std::string> adapter_targets;
  std::vector<std::string> default_adapter_targets;
  // config.json's model_type values read as this architecture, and the mapping both ways:
  // `read_hf_config` gets the folder's keys and the model_type it was chosen by; `write_hf_config`
  // writes the keys that load in transformers as the model strata trained.
  std::vector<std::string_view> hf_model_types;
  Result<ModelConfig> (*read_hf_config)(const hf::ConfigKeys& keys, std::string_view model_type) = nullptr;
  void (*write_hf_config)(const ModelConfig& model, nlohmann::ordered_json& json) = nullptr;
  // The definition (definitions.h) of a config of this architecture.
  std::unique_ptr<const ModelDefinition> (*make_definition)(const ModelConfig& config) = nullptr;
};

// Every architecture, in the order the docs list them (gpt2 first: the default).
const std::vector<Architecture>& architectures();
// The row named `name`; null when there is none.
const Architecture* find_architecture(std::string_view name);
// The row of `model.arch`, which a config or store reader has already checked.
const Architecture& architecture_of(const ModelConfig& model);
// The names, for a config's choice list.
std::vector<std::string> architecture_names();
// "gpt2, llama or gemma": the names in an error.
std::string architecture_list();

}  // namespace strata::models
