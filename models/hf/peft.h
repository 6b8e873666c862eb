// strata/models/hf/peft.h — PEFT LoRA adapter folders in and out (docs/lora.md).
//
// The format is the one PEFT's `save_pretrained` writes for a LoRA model (PEFT 0.x):
// - `adapter_config.json`: LoraConfig's keys (peft_type "LORA", task_type "CAUSAL_LM", r,
//   lora_alpha, lora_dropout, target_modules as a list, use_rslora, bias "none", fan_in_fan_out —
//   true for GPT-2, whose linears are Conv1D —, init_lora_weights, base_model_name_or_path,
//   inference_mode, modules_to_save, use_dora and the rest at their defaults);
// - `adapter_model.safetensors`: per adapted linear `base_model.model.<module>.lora_A.weight`
//   [r, in] and `….lora_B.weight` [out, r], fp32, whatever the base weight's layout (GPT-2's
//   Conv1D weight is [in, out]; its adapters are not). <module> is the linear's path in the HF
//   model: Llama's `model.layers.3.self_attn.q_proj`; GPT-2's `transformer.h.3.attn.c_attn` —
//   strata's GPT-2 names lack `transformer.` (hf.h), PEFT's have it.
// The adapter tensors are the layout's adapter units (models/model_layout.h), in its order;
// strata's name of each is PEFT's without `base_model.model.` (and, GPT-2, `transformer.`).
//
// In (`adapter.init`): the folder is untrusted input. adapter_config.json is read strictly and
// must describe the run's adapter (ModelConfig::adapter): r, lora_alpha, lora_dropout,
// use_rslora equal to the YAML's adapter: values (the YAML's defaults when it omits them), and
// target_modules adapting the same linears. Keys that do not change the math are accepted at
// any value (task_type, base_model_name_or_path, revision, inference_mode, init_lora_weights,
// auto_mapping, layers_pattern, megatron_*, eva_config, runtime_config, peft_version, …) or at
// their neutral value; a key that would change the math (use_dora true, a non-empty
// rank_pattern / alpha_pattern, bias other than "none", modules_to_save, layers_to_transform,
// layer_replication, loftq_config, lora_bias, fan_in_fan_out other than the architecture's,
// peft_type other than LORA) and any key strata does not know are refused, in one line naming
// the file and the key. The safetensors must hold exactly the expected tensors with the
// expected shapes (F32, BF16 or F16, widened exactly): the first missing, wrong-shaped or extra
// one is named. Every refusal is ErrorKind::invalid_argument (the CLI's exit 2).
//
// Out: PeftFolderWriter writes into a temporary sibling folder, fsyncs and renames it into
// place; a folder already at the final path is refused, never overwritten.
//
// Not (yet): Phi-3's fused projections (PEFT adapts qkv_proj / gate_up_proj as one linear;
// strata's adapters are per q, k, v, gate, up) are refused for q/k/v/gate/up targets.
//
// Threads: none of its own; one folder reader or writer per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "models/safetensors.h"
#include "run/train_config.h"

namespace strata::hf {

inline constexpr const char* kAdapterConfigName = "adapter_config.json";
inline constexpr const char* kAdapterWeightsName = "adapter_model.safetensors";

// PEFT's name of an adapter tensor strata names `name` ("h.0.attn.c_attn.lora_A.weight" →
// "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight").
std::string peft_tensor_name(const ModelConfig& model, const std::string& name);

// Whether `model`'s adapters can be a PEFT folder (see "Not (yet)"); the error names `what`.
[[nodiscard]] Status check_peft_expressible(const ModelConfig& model, const std::string& what);

// adapter_config.json for `model`'s adapter; `base_model` is the base's folder (null when empty).
std::string adapter_config_json(const ModelConfig& model, const std::string& base_model);

// Checks adapter_config.json's text (`path` names it in errors) against `model`'s adapter.
[[nodiscard]] Status check_adapter_config(std::string_view text, const std::string& path, const ModelConfig& model);

// A PEFT folder opened for `model`'s adapter: config and tensor set checked (see the contract).
class AdapterFolder {
 public:
  [[nodiscard]] static Result<AdapterFolder> open(const std::string& folder, const ModelConfig& model);
  // One adapter tensor by strata's name, widened to fp32 (its element count of floats).
  [[nodiscard]] Status read_fp32(const std::string& name, float* out) const;
  const std::string& folder() const { return folder_; }

 private:
  AdapterFolder() = default;
  std::string folder_;
  ModelConfig model_;
  std::unique_ptr<SafetensorsReader> reader_;
};

// Writes a PEFT folder: the adapter tensors in declaration order (strata's names and shapes).
class PeftFolderWriter {
 public:
  struct Tensor {
    std::string name;  // strata's
    std::vector<int64_t> shape;
  };
  [[nodiscard]] static Result<PeftFolderWriter> create(const std::string& folder, const ModelConfig& model,
                                                       const std::string& base_model, const std::vector<Tensor>& tensors,
                                                       const std::map<std::string, std::string>& metadata);
  PeftFolderWriter(PeftFolderWriter&&) noexcept;
  PeftFolderWriter& operator=(PeftFolderWriter&&) noexcept;
  ~PeftFolderWriter();  // an unfinished writer removes its temporary folder

  [[nodiscard]] Status write_next(const float* values, uint64_t element_count);
  // The tokenizer beside the adapter, as FolderWriter::copy_tokenizer (PEFT's examples save it too).
  [[nodiscard]] Status copy_tokenizer(const std::string& path);
  // After every tensor: adapter_config.json, fsync, rename into place.
  [[nodiscard]] Status finish();

 private:
  PeftFolderWriter() = default;
  std::string folder_;
  std::string temp_folder_;
  std::string config_text_;
  std::unique_ptr<SafetensorsWriter> writer_;
  bool finished_ = true;  // nothing to remove until create made the temporary folder
};

}  // namespace strata::hf
