// strata/models/hf/peft.cpp — PEFT LoRA adapter folders (models/hf/peft.h).
#include "models/hf/peft.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fcntl.h>
#include <filesystem>
#include <set>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "models/architectures.h"
#include "kernels/optim/cast.h"
#include "models/hf/hf.h"
#include "models/model_layout.h"

namespace strata::hf {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

Error refuse(const std::string& path, const std::string& what) {
  return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", path, what));
}

// The adapter tensors `model` has, in the layout's order (strata's names and shapes).
std::vector<PeftFolderWriter::Tensor> adapter_tensors(const ModelConfig& model) {
  std::vector<PeftFolderWriter::Tensor> out;
  const ModelLayout layout(model);
  for (const Unit& unit : layout.units())
    if (unit.adapter_block >= 0)
      for (const UnitTensor& tensor : unit.tensors) out.push_back({tensor.name, tensor.shape});
  return out;
}

// The linears (by index) `targets` adapts in `model`'s blocks.
std::set<int> adapted_linears(const ModelConfig& model, const std::vector<std::string>& targets) {
  std::set<int> out;
  const std::unique_ptr<const models::ModelDefinition> definition = models::make_model_definition(model);
  for (const BlockLinear& linear : definition->block_linears())
    if (models::adapter_targets_linear(targets, linear)) out.insert(linear.index);
  return out;
}

bool is_empty_value(const Json& value) {
  return value.is_null() || ((value.is_object() || value.is_array() || value.is_string()) && value.empty());
}

}  // namespace

std::string peft_tensor_name(const ModelConfig& model, const std::string& name) {
  return fmt::format("base_model.model.{}{}", models::architecture_of(model).peft_prefix, name);
}

Status check_peft_expressible(const ModelConfig& model, const std::string& what) {
  if (!model.fused_projections) return Status();
  const std::unique_ptr<const models::ModelDefinition> definition = models::make_model_definition(model);
  for (const BlockLinear& linear : definition->block_linears()) {
    if (!models::adapter_targets_linear(model.adapter.targets, linear)) continue;
    for (const char* fused : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"})
      if (linear.suffix.ends_with(fused))
        return make_error(ErrorKind::unsupported,
                          fmt::format("{}: adapters on {} of a model with fused projections (Phi-3's qkv_proj, "
                                      "gate_up_proj) are not yet a PEFT folder: PEFT adapts the fused linear whole",
                                      what, linear.suffix));
  }
  return Status();
}

std::string adapter_config_json(const ModelConfig& model, const std::string& base_model) {
  const AdapterConfig& a = model.adapter;
  // Key order and values as PEFT 0.x's LoraConfig.to_dict writes them (sorted keys).
  nlohmann::ordered_json json;
  json["alpha_pattern"] = Json::object();
  json["auto_mapping"] = nullptr;
  json["base_model_name_or_path"] = base_model.empty() ? Json(nullptr) : Json(base_model);
  json["bias"] = "none";
  json["fan_in_fan_out"] = models::architecture_of(model).conv1d;  // a Conv1D stores its weight [in, out]
  json["inference_mode"] = true;
  json["init_lora_weights"] = true;
  json["layer_replication"] = nullptr;
  json["layers_pattern"] = nullptr;
  json["layers_to_transform"] = nullptr;
  json["loftq_config"] = Json::object();
  // An integral alpha is written as PEFT's default int (16, not 16.0).
  if (a.alpha == std::floor(a.alpha) && std::fabs(a.alpha) < 1e15) json["lora_alpha"] = static_cast<int64_t>(a.alpha);
  else json["lora_alpha"] = a.alpha;
  json["lora_dropout"] = a.dropout;
  json["megatron_config"] = nullptr;
  json["megatron_core"] = "megatron.core";
  json["modules_to_save"] = nullptr;
  json["peft_type"] = "LORA";
  json["r"] = a.rank;
  json["rank_pattern"] = Json::object();
  json["revision"] = nullptr;
  json["target_modules"] = a.targets;
  json["task_type"] = "CAUSAL_LM";
  json["use_dora"] = false;
  json["use_rslora"] = a.rslora;
  return json.dump(2) + "\n";
}

Status check_adapter_config(std::string_view text, const std::string& path, const ModelConfig& model) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return refuse(path, "is not valid JSON");
  if (!json.is_object()) return refuse(path, "is not a JSON object");
  const AdapterConfig& a = model.adapter;
  // Keys that do not change what the adapters compute: any value.
  static const std::set<std::string> any_value = {
      "task_type", "base_model_name_or_path", "revision", "inference_mode", "init_lora_weights", "auto_mapping",
      "layers_pattern", "megatron_config", "megatron_core", "eva_config", "runtime_config", "peft_version",
      "qalora_group_size", "ensure_weight_tying"};
  // Keys whose neutral value (null, false, {}, [], "") is the plain LoRA strata computes; any
  // other value changes the math.
  static const std::set<std::string> neutral_only = {
      "use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform", "layer_replication",
      "loftq_config", "lora_bias", "use_qalora", "exclude_modules", "trainable_token_indices", "target_parameters",
      "corda_config", "alora_invocation_tokens", "arrow_config"};
  static const std::set<std::string> checked = {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules",
                                                "use_rslora", "bias", "fan_in_fan_out"};
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    if (any_value.count(key) != 0 || checked.count(key) != 0) continue;
    if (neutral_only.count(key) != 0) {
      if (!is_empty_value(*it) && !(it->is_boolean() && !it->get<bool>()))
        return refuse(path, fmt::format("key '{}' is {}: strata computes plain LoRA (its neutral value)", key,
                                        it->dump()));
      continue;
    }
    return refuse(path, fmt::format("key '{}' is not a LoRA key strata knows; it may change the math", key));
  }
  auto find = [&](const char* key) -> const Json* {
    auto it = json.find(key);
    return it == json.end() ? nullptr : &*it;
  };
  const Json* peft_type = find("peft_type");
  if (peft_type == nullptr || !peft_type->is_string() || peft_type->get<std::string>() != "LORA")
    return refuse(path, fmt::format("key 'peft_type' is {}, not \"LORA\"", peft_type ? peft_type->dump() : "missing"));
  const Json* bias = find("bias");
  if (bias != nullptr && !(bias->is_string() && bias->get<std::string>() == "none"))
    return refuse(path, fmt::format("key 'bias' is {}: strata's adapters train no biases (\"none\")", bias->dump()));
  const Json* fan = find("fan_in_fan_out");
  const bool conv1d = models::architecture_of(model).conv1d;
  if (fan != nullptr && !(fan->is_boolean() && fan->get<bool>() == conv1d))
    return refuse(path, fmt::format("key 'fan_in_fan_out' is {}; a {} base's is {}", fan->dump(), model.arch, conv1d));
  const Json* r = find("r");
  if (r == nullptr || !r->is_number_integer() || r->get<int64_t>() != static_cast<int64_t>(a.rank))
    return refuse(path, fmt::format("key 'r' is {} but the config's adapter.rank is {}; they must agree",
                                    r ? r->dump() : "missing", a.rank));
  const Json* alpha = find("lora_alpha");
  if (alpha == nullptr || !alpha->is_number() || alpha->get<double>() != a.alpha)
    return refuse(path, fmt::format("key 'lora_alpha' is {} but the config's adapter.alpha is {}; they must agree",
                                    alpha ? alpha->dump() : "missing", a.alpha));
  const Json* dropout = find("lora_dropout");
  const double dropout_value = dropout == nullptr ? 0.0 : dropout->is_number() ? dropout->get<double>() : -1.0;
  if (dropout_value != a.dropout)
    return refuse(path, fmt::format("key 'lora_dropout' is {} but the config's adapter.dropout is {}; they must agree",
                                    dropout ? dropout->dump() : "missing", a.dropout));
  const Json* rslora = find("use_rslora");
  const bool rslora_value = rslora != nullptr && rslora->is_boolean() && rslora->get<bool>();
  if ((rslora != nullptr && !rslora->is_boolean()) || rslora_value != a.rslora)
    return refuse(path, fmt::format("key 'use_rslora' is {} but the config's adapter.rslora is {}; they must agree",
                                    rslora ? rslora->dump() : "missing", a.rslora));
  const Json* targets = find("target_modules");
  if (targets == nullptr || !targets->is_array())
    return refuse(path, fmt::format("key 'target_modules' is {}: strata reads a list of module names (not a regex)",
                                    targets ? targets->dump() : "missing"));
  std::vector<std::string> names;
  const std::vector<std::string>& known = models::architecture_of(model).adapter_targets;
  for (const Json& name : *targets) {
    if (!name.is_string() || std::find(known.begin(), known.end(), name.get<std::string>()) == known.end())
      return refuse(path, fmt::format("key 'target_modules' names {}, not a linear of a {} block ({})", name.dump(),
                                      model.arch, fmt::join(known, ", ")));
    names.push_back(name.get<std::string>());
  }
  if (adapted_linears(model, names) != adapted_linears(model, a.targets))
    return refuse(path, fmt::format("key 'target_modules' is {} but the config's adapter.targets is [{}]; they must "
                                    "adapt the same linears",
                                    targets->dump(), fmt::join(a.targets, ", ")));
  return Status();
}

Result<AdapterFolder> AdapterFolder::open(const std::string& folder, const ModelConfig& model) {
  STRATA_RETURN_IF_ERROR(check_peft_expressible(model, folder));
  std::error_code error;
  if (!fs::is_directory(folder, error)) return refuse(folder, "is not a folder (adapter.init names a PEFT adapter folder)");
  const std::string config_path = (fs::path(folder) / kAdapterConfigName).string();
  if (!fs::is_regular_file(config_path, error))
    return refuse(folder, fmt::format("holds no {} (not a PEFT adapter folder)", kAdapterConfigName));
  STRATA_ASSIGN_OR_RETURN(const std::string text, read_small_text_file(config_path));
  STRATA_RETURN_IF_ERROR(check_adapter_config(text, config_path, model));
  const std::string weights_path = (fs::path(folder) / kAdapterWeightsName).string();
  if (!fs::is_regular_file(weights_path, error))
    return refuse(folder, fmt::format("holds no {} (strata reads safetensors adapters, not adapter_model.bin)",
                                      kAdapterWeightsName));
  Result<SafetensorsReader> reader = SafetensorsReader::open(weights_path);
  if (!reader.ok()) return refuse(weights_path, reader.error().message);
  AdapterFolder out;
  out.folder_ = folder;
  out.model_ = model;
  out.reader_ = std::make_unique<SafetensorsReader>(std::move(reader).value());
  // Exactly the expected tensors: the first missing or wrong one in the layout's order, then
  // the first extra one in the file's (sorted) order.
  std::set<std::string> expected;
  for (const PeftFolderWriter::Tensor& tensor : adapter_tensors(model)) {
    const std::string name = peft_tensor_name(model, tensor.name);
    expected.insert(name);
    const SafetensorsEntry* entry = out.reader_->find(name);
    if (entry == nullptr) return refuse(weights_path, fmt::format("tensor '{}' is missing", name));
    if (entry->shape != tensor.shape)
      return refuse(weights_path, fmt::format("tensor '{}' is [{}], expected [{}]", name, fmt::join(entry->shape, ", "),
                                              fmt::join(tensor.shape, ", ")));
    if (entry->dtype != DType::f32 && entry->dtype != DType::bf16 && entry->dtype != DType::f16)
      return refuse(weights_path, fmt::format("tensor '{}' is {}; strata reads F32, BF16 and F16", name,
                                              dtype_name(entry->dtype)));
  }
  for (const auto& [name, entry] : out.reader_->entries())
    if (expected.count(name) == 0)
      return refuse(weights_path, fmt::format("tensor '{}' is not an adapter of this config (r {}, targets [{}])", name,
                                              model.adapter.rank, fmt::join(model.adapter.targets, ", ")));
  return out;
}

Status AdapterFolder::read_fp32(const std::string& name, float* out) const {
  const SafetensorsEntry* entry = reader_->find(peft_tensor_name(model_, name));
  if (entry == nullptr) return refuse(reader_->path(), fmt::format("tensor '{}' is missing", peft_tensor_name(model_, name)));
  const uint64_t count = entry->element_count();
  if (entry->dtype == DType::f32) return reader_->read(*entry, out);
  // 16-bit: read into the upper half of `out`, then widen forwards (element i's 2 bytes lie at
  // or after float i, so nothing is overwritten before it is read).
  auto* bits = reinterpret_cast<uint16_t*>(out + count) - count;
  STRATA_RETURN_IF_ERROR(reader_->read(*entry, bits));
  // One value at a time, front to back: float i is written after bits 0..i are read.
  for (uint64_t i = 0; i < count; ++i)
    out[i] = entry->dtype == DType::bf16 ? kernels::bf16_bits_to_fp32(bits[i]) : kernels::fp16_bits_to_fp32(bits[i]);
  return Status();
}

Result<PeftFolderWriter> PeftFolderWriter::create(const std::string& folder, const ModelConfig& model,
                                                  const std::string& base_model, const std::vector<Tensor>& tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  STRATA_RETURN_IF_ERROR(check_peft_expressible(model, folder));
  std::error_code error;
  if (fs::exists(folder, error))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} already exists; an adapter export writes a new folder and never overwrites one",
                                  folder));
  PeftFolderWriter writer;
  writer.folder_ = folder;
  writer.temp_folder_ = folder + ".tmp";
  writer.config_text_ = adapter_config_json(model, base_model);
  fs::remove_all(writer.temp_folder_, error);  // a previous failed export's leftovers
  if (!fs::create_directory(writer.temp_folder_, error) || error)
    return make_errno_error(error ? error.value() : EEXIST, "mkdir", writer.temp_folder_);
  writer.finished_ = false;
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const Tensor& tensor : tensors) specs.push_back({peft_tensor_name(model, tensor.name), DType::f32, tensor.shape});
  std::map<std::string, std::string> file_metadata = metadata;
  file_metadata["format"] = "pt";  // what PEFT's and transformers' loaders ask of a safetensors file
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter file, SafetensorsWriter::create(
                                                      (fs::path(writer.temp_folder_) / kAdapterWeightsName).string(),
                                                      specs, file_metadata));
  writer.writer_ = std::make_unique<SafetensorsWriter>(std::move(file));
  return writer;
}

PeftFolderWriter::PeftFolderWriter(PeftFolderWriter&& other) noexcept
    : folder_(std::move(other.folder_)),
      temp_folder_(std::move(other.temp_folder_)),
      config_text_(std::move(other.config_text_)),
      writer_(std::move(other.writer_)),
      finished_(other.finished_) {
  other.finished_ = true;  // the temporary folder is this one's to remove now
}

PeftFolderWriter& PeftFolderWriter::operator=(PeftFolderWriter&& other) noexcept {
  if (this != &other) {
    this->~PeftFolderWriter();
    new (this) PeftFolderWriter(std::move(other));
  }
  return *this;
}

PeftFolderWriter::~PeftFolderWriter() {
  if (finished_) return;
  writer_.reset();
  std::error_code error;
  fs::remove_all(temp_folder_, error);
}

Status PeftFolderWriter::write_next(const float* values, uint64_t element_count) {
  return writer_->write_next(values, element_count * 4);
}

Status PeftFolderWriter::copy_tokenizer(const std::string& path) {
  return copy_tokenizer_files(path, temp_folder_, folder_);
}

Status PeftFolderWriter::finish() {
  STRATA_RETURN_IF_ERROR(writer_->finish());
  writer_.reset();
  STRATA_RETURN_IF_ERROR(write_small_file(fs::path(temp_folder_) / kAdapterConfigName, config_text_));
  STRATA_RETURN_IF_ERROR(publish_folder(temp_folder_, folder_));
  finished_ = true;
  return Status();
}

}  // namespace strata::hf
