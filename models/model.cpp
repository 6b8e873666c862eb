// models/model.cpp — what every definition shares (model.h): units and chunks, adapter
// targets, the choice of definition, and the shape keys a store records. The definitions are
// their own files (definitions.h).
#include "models/model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/architectures.h"
#include "models/gpt2_shape.h"
#include "models/llama_shape.h"
#include "models/definitions.h"

namespace strata {

std::vector<optim::TensorSpan> optim_spans(const Unit& unit) {
  std::vector<optim::TensorSpan> spans;
  for (const UnitTensor& tensor : unit.tensors)
    spans.push_back({tensor.offset_elements, tensor.element_count, tensor.weight_decay, tensor.token_embedding});
  return spans;
}

std::vector<ElementRange> optim_chunks(const Unit& unit, uint64_t chunk_elements, const optim::StateLayout& state) {
  if (unit.frozen) return {};  // LoRA's frozen base: nothing to update, no state
  const uint64_t n = unit.element_count;
  const uint64_t chunks = std::max<uint64_t>(1, (n + chunk_elements - 1) / chunk_elements);
  const std::vector<optim::TensorSpan> spans = optim_spans(unit);
  std::vector<ElementRange> ranges;
  uint64_t begin = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t end = c + 1 == chunks ? n : state.snap_cut(spans, n * (c + 1) / chunks);
    if (end <= begin) continue;
    ranges.push_back(ElementRange{begin, end - begin});
    begin = end;
  }
  return ranges;
}

namespace models {

void ModelDefinition::add_tensor(Unit& unit, std::string name, std::vector<int64_t> shape, bool weight_decay,
                                 double init_std, float init_value) {
  UnitTensor tensor;
  tensor.name = std::move(name);
  tensor.element_count = 1;
  for (int64_t extent : shape) tensor.element_count *= static_cast<uint64_t>(extent);
  tensor.shape = std::move(shape);
  tensor.offset_elements = unit.element_count;
  tensor.weight_decay = weight_decay;
  tensor.init_std = init_std;
  tensor.init_value = init_value;
  unit.element_count += tensor.element_count;
  unit.tensors.push_back(std::move(tensor));
}

void ModelDefinition::find_linears(const std::vector<std::string>& suffixes, bool conv1d) {
  const Unit& block = units_[block_unit(0)];
  for (size_t i = 0; i < suffixes.size(); ++i) {
    BlockLinear linear;
    linear.index = static_cast<int>(i);
    linear.suffix = suffixes[i];
    linear.conv1d = conv1d;
    const std::string weight = "." + suffixes[i] + ".weight";
    for (size_t t = 0; t < block.tensors.size(); ++t) {
      if (!block.tensors[t].name.ends_with(weight)) continue;
      const std::vector<int64_t>& shape = block.tensors[t].shape;
      linear.weight_tensor = t;
      linear.in_features = conv1d ? shape[0] : shape[1];
      linear.out_features = conv1d ? shape[1] : shape[0];
    }
    linears_.push_back(std::move(linear));
  }
}

bool adapter_targets_linear(const std::vector<std::string>& targets, const BlockLinear& linear) {
  for (const std::string& target : targets)
    if (linear.suffix == target || linear.suffix.ends_with("." + target)) return true;
  return false;
}


Result<uint64_t> metadata_integer(const std::map<std::string, std::string>& metadata, const std::string& key,
                                  uint64_t min, uint64_t max, const std::string& dir) {
  auto found = metadata.find(key);
  uint64_t value = 0;
  const char* begin = found == metadata.end() ? nullptr : found->second.data();
  const char* end = begin == nullptr ? nullptr : begin + found->second.size();
  auto [stop, error] = begin == nullptr ? std::from_chars_result{nullptr, std::errc::invalid_argument}
                                        : std::from_chars(begin, end, value);
  if (error != std::errc() || stop != end || value < min || value > max)
    return make_error(ErrorKind::corrupt,
                      fmt::format("store {}: metadata '{}' is {}, not a whole number in [{}, {}]", dir, key,
                                  found == metadata.end() ? "missing" : "'" + found->second + "'", min, max));
  return value;
}

namespace {

Result<double> read_number(const std::map<std::string, std::string>& metadata, const std::string& key, double min,
                           double max, const std::string& dir) {
  auto found = metadata.find(key);
  double value = 0;
  const char* begin = found == metadata.end() ? nullptr : found->second.data();
  const char* end = begin == nullptr ? nullptr : begin + found->second.size();
  auto [stop, error] = begin == nullptr ? std::from_chars_result{nullptr, std::errc::invalid_argument}
                                        : std::from_chars(begin, end, value);
  if (error != std::errc() || stop != end || !(value >= min && value <= max))
    return make_error(ErrorKind::corrupt,
                      fmt::format("store {}: metadata '{}' is {}, not a number in [{}, {}]", dir, key,
                                  found == metadata.end() ? "missing" : "'" + found->second + "'", min, max));
  return value;
}

}  // namespace

models::gpt2::Config gpt2_shape_config(const ModelConfig& model) {
  models::gpt2::Config kc;
  kc.n_layer = model.n_layer;
  kc.n_head = model.n_head;
  kc.n_embd = model.n_embd;
  kc.vocab_size = model.vocab_size;
  kc.n_ctx = model.seq_len;
  return kc;
}

std::unique_ptr<const ModelDefinition> make_model_definition(const ModelConfig& config) {
  return architecture_of(config).make_definition(config);
}

namespace {

// The adapter's keys (absent without one: stores from before LoRA read as no adapter). The
// init folder is where the adapters started, not their shape: not recorded.
void add_adapter_keys(const AdapterConfig& a, std::map<std::string, std::string>& keys) {
  if (!a.enabled) return;
  keys["adapter.kind"] = "lora";
  keys["adapter.rank"] = std::to_string(a.rank);
  keys["adapter.alpha"] = fmt::format("{}", a.alpha);
  keys["adapter.dropout"] = fmt::format("{}", a.dropout);
  keys["adapter.rslora"] = a.rslora ? "1" : "0";
  keys["adapter.targets"] = fmt::format("{}", fmt::join(a.targets, ","));
  keys["adapter.base_dtype"] = base_dtype_name(a.base_dtype);
  keys["adapter.double_quant"] = a.double_quant ? "1" : "0";
}

// The base model's shape keys (an adapter's left out), and their reader.
std::map<std::string, std::string> store_shape_metadata(const ModelConfig& m);
Result<ModelConfig> shape_from_store_metadata(const std::map<std::string, std::string>& metadata,
                                              const std::string& dir);

}  // namespace

std::map<std::string, std::string> store_metadata(const ModelConfig& m) {
  std::map<std::string, std::string> keys = store_shape_metadata(m);
  add_adapter_keys(m.adapter, keys);
  return keys;
}

namespace {

std::map<std::string, std::string> store_shape_metadata(const ModelConfig& m) {
  std::map<std::string, std::string> keys = {{"model.arch", m.arch},
                                             {"model.n_layer", std::to_string(m.n_layer)},
                                             {"model.n_head", std::to_string(m.n_head)},
                                             {"model.n_embd", std::to_string(m.n_embd)},
                                             {"model.vocab_size", std::to_string(m.vocab_size)},
                                             {"model.seq_len", std::to_string(m.seq_len)}};
  if (!m.decoder_keys()) return keys;  // Gemma records Llama's keys (its biases 0, no scaling)
  // Shortest round-trip text for the doubles: read back, they are the same bits.
  keys["model.n_kv_head"] = std::to_string(m.kv_heads());
  keys["model.head_dim"] = std::to_string(m.head_size());
  keys["model.intermediate_size"] = std::to_string(m.intermediate_size);
  keys["model.rope_theta"] = fmt::format("{}", m.rope_theta);
  keys["model.norm_eps"] = fmt::format("{}", m.norm_eps);
  keys["model.tie_word_embeddings"] = m.tie_word_embeddings ? "1" : "0";
  keys["model.qkv_bias"] = m.qkv_bias ? "1" : "0";
  keys["model.o_proj_bias"] = m.o_proj_bias ? "1" : "0";
  if (m.fused_projections) keys["model.fused_projections"] = "1";  // absent: 0 (stores from before Phi-3)
  if (m.attention_window > 0) keys["model.attention_window"] = std::to_string(m.attention_window);
  keys["model.rope_scaling.type"] = m.rope_scaling.type.empty() ? "none" : m.rope_scaling.type;
  if (!m.rope_scaling.type.empty()) {
    keys["model.rope_scaling.factor"] = fmt::format("{}", m.rope_scaling.factor);
    keys["model.rope_scaling.low_freq_factor"] = fmt::format("{}", m.rope_scaling.low_freq_factor);
    keys["model.rope_scaling.high_freq_factor"] = fmt::format("{}", m.rope_scaling.high_freq_factor);
    keys["model.rope_scaling.original_max_position_embeddings"] =
        std::to_string(m.rope_scaling.original_max_position_embeddings);
  }
  return keys;
}

}  // namespace

Result<ModelConfig> model_from_store_metadata(const std::map<std::string, std::string>& metadata,
                                              const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig model, shape_from_store_metadata(metadata, dir));
  if (metadata.count("adapter.kind") == 0) return model;
  AdapterConfig& a = model.adapter;
  if (metadata.at("adapter.kind") != "lora")
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'adapter.kind' is '{}', not lora", dir,
                                                      metadata.at("adapter.kind")));
  a.enabled = true;
  STRATA_ASSIGN_OR_RETURN(a.rank, metadata_integer(metadata, "adapter.rank", 1, 4096, dir));
  STRATA_ASSIGN_OR_RETURN(a.alpha, read_number(metadata, "adapter.alpha", 1.0e-6, 1.0e6, dir));
  STRATA_ASSIGN_OR_RETURN(a.dropout, read_number(metadata, "adapter.dropout", 0.0, 0.99, dir));
  STRATA_ASSIGN_OR_RETURN(const uint64_t rslora, metadata_integer(metadata, "adapter.rslora", 0, 1, dir));
  a.rslora = rslora == 1;
  STRATA_ASSIGN_OR_RETURN(const uint64_t double_quant, metadata_integer(metadata, "adapter.double_quant", 0, 1, dir));
  a.double_quant = double_quant == 1;
  auto targets = metadata.find("adapter.targets");
  const std::vector<std::string>& names = architecture_of(model).adapter_targets;
  a.targets.clear();
  if (targets != metadata.end()) {
    for (size_t begin = 0; begin <= targets->second.size();) {
      size_t end = targets->second.find(',', begin);
      if (end == std::string::npos) end = targets->second.size();
      a.targets.push_back(targets->second.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  for (const std::string& target : a.targets)
    if (std::find(names.begin(), names.end(), target) == names.end())
      return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'adapter.targets' names '{}', not a linear "
                                                        "of a {} block", dir, target, model.arch));
  if (a.targets.empty())
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'adapter.targets' is missing", dir));
  auto base = metadata.find("adapter.base_dtype");
  const std::string base_name = base == metadata.end() ? "" : base->second;
  if (base_name == "fp32") a.base_dtype = BaseDType::fp32;
  else if (base_name == "bf16") a.base_dtype = BaseDType::bf16;
  else if (base_name == "int8") a.base_dtype = BaseDType::int8;
  else if (base_name == "nf4") a.base_dtype = BaseDType::nf4;
  else
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'adapter.base_dtype' is '{}'", dir, base_name));
  return model;
}

namespace {

Result<ModelConfig> shape_from_store_metadata(const std::map<std::string, std::string>& metadata,
                                              const std::string& dir) {
  ModelConfig model;
  auto arch = metadata.find("model.arch");
  model.arch = arch == metadata.end() ? "gpt2" : arch->second;  // stores from before definitions
  const Architecture* architecture = find_architecture(model.arch);
  if (architecture == nullptr)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'model.arch' is '{}', not {}", dir,
                                                      model.arch, architecture_list()));
  STRATA_ASSIGN_OR_RETURN(model.n_layer, metadata_integer(metadata, "model.n_layer", 1, 1024, dir));
  STRATA_ASSIGN_OR_RETURN(model.n_head, metadata_integer(metadata, "model.n_head", 1, 1024, dir));
  STRATA_ASSIGN_OR_RETURN(model.n_embd, metadata_integer(metadata, "model.n_embd", 8, 65536, dir));
  STRATA_ASSIGN_OR_RETURN(model.vocab_size, metadata_integer(metadata, "model.vocab_size", 2, 1 << 20, dir));
  STRATA_ASSIGN_OR_RETURN(model.seq_len, metadata_integer(metadata, "model.seq_len", 1, 1 << 16, dir));
  if (!architecture->decoder_keys) {
    if (model.n_embd % model.n_head != 0)
      return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata model.n_embd {} is not divisible by "
                                                        "model.n_head {}", dir, model.n_embd, model.n_head));
    return model;
  }
  STRATA_ASSIGN_OR_RETURN(model.n_kv_head, metadata_integer(metadata, "model.n_kv_head", 1, model.n_head, dir));
  STRATA_ASSIGN_OR_RETURN(model.head_dim, metadata_integer(metadata, "model.head_dim", 2, 4096, dir));
  STRATA_ASSIGN_OR_RETURN(model.intermediate_size, metadata_integer(metadata, "model.intermediate_size", 1, 1 << 20, dir));
  STRATA_ASSIGN_OR_RETURN(model.rope_theta, read_number(metadata, "model.rope_theta", 1.0, 1.0e12, dir));
  STRATA_ASSIGN_OR_RETURN(model.norm_eps, read_number(metadata, "model.norm_eps", 0.0, 1.0, dir));
  STRATA_ASSIGN_OR_RETURN(const uint64_t tied, metadata_integer(metadata, "model.tie_word_embeddings", 0, 1, dir));
  model.tie_word_embeddings = tied == 1;
  // Stores written before attention biases existed hold neither key: no biases.
  for (auto [key, field] : {std::pair{"model.qkv_bias", &ModelConfig::qkv_bias},
                            std::pair{"model.o_proj_bias", &ModelConfig::o_proj_bias}}) {
    if (metadata.count(key) == 0) continue;
    STRATA_ASSIGN_OR_RETURN(const uint64_t flag, metadata_integer(metadata, key, 0, 1, dir));
    model.*field = flag == 1;
  }
  if (model.o_proj_bias && !model.qkv_bias)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata model.o_proj_bias is 1 but model.qkv_bias "
                                                      "is 0", dir));
  if (metadata.count("model.fused_projections") != 0) {
    STRATA_ASSIGN_OR_RETURN(const uint64_t fused, metadata_integer(metadata, "model.fused_projections", 0, 1, dir));
    model.fused_projections = fused == 1;
  }
  if (metadata.count("model.attention_window") != 0) {
    STRATA_ASSIGN_OR_RETURN(model.attention_window,
                            metadata_integer(metadata, "model.attention_window", model.seq_len, UINT32_MAX, dir));
  }
  // What the architecture's definition does not compute (train_config.cpp refuses it in a config too).
  for (auto [set, computed, what] : {std::tuple{model.qkv_bias, architecture->attention_biases, "attention biases"},
                                     std::tuple{model.fused_projections, architecture->fused_projections,
                                                "fused projections"},
                                     std::tuple{model.attention_window > 0, architecture->attention_window,
                                                "a sliding window"}})
    if (set && !computed)
      return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata gives a {} model {}, which {} has not", dir,
                                                        model.arch, what, architecture->label));
  if (model.n_head % model.n_kv_head != 0 || model.head_dim % 2 != 0)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata model.n_kv_head {} / model.head_dim {} do "
                                                      "not fit model.n_head {}", dir, model.n_kv_head, model.head_dim,
                                                      model.n_head));
  auto scaling = metadata.find("model.rope_scaling.type");
  if (scaling == metadata.end() || (scaling->second != "none" && scaling->second != "llama3"))
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'model.rope_scaling.type' is {}", dir,
                                                      scaling == metadata.end() ? "missing" : "'" + scaling->second + "'"));
  if (scaling->second == "llama3" && !architecture->rope_scaling)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'model.rope_scaling.type' is llama3 for a "
                                                      "{} model, which has no rope scaling", dir, model.arch));
  if (scaling->second == "llama3") {
    RopeScaling& r = model.rope_scaling;
    r.type = "llama3";
    STRATA_ASSIGN_OR_RETURN(r.factor, read_number(metadata, "model.rope_scaling.factor", 1.0, 1.0e6, dir));
    STRATA_ASSIGN_OR_RETURN(r.low_freq_factor, read_number(metadata, "model.rope_scaling.low_freq_factor", 1e-6, 1e6, dir));
    STRATA_ASSIGN_OR_RETURN(r.high_freq_factor,
                            read_number(metadata, "model.rope_scaling.high_freq_factor", 1e-6, 1e6, dir));
    STRATA_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                            metadata_integer(metadata, "model.rope_scaling.original_max_position_embeddings", 1, 1 << 24, dir));
    if (r.high_freq_factor <= r.low_freq_factor)
      return make_error(ErrorKind::corrupt,
                        fmt::format("store {}: metadata model.rope_scaling.high_freq_factor {} is not above "
                                    "low_freq_factor {}", dir, r.high_freq_factor, r.low_freq_factor));
  }
  return model;
}

}  // namespace

std::optional<std::string> first_shape_difference(const ModelConfig& a, const ModelConfig& b) {
  // model.arch first: every other key means something else across architectures.
  if (a.arch != b.arch) return std::string("model.arch");
  // Then whether there are adapters at all: without it, a LoRA store resumed by a config
  // without `adapter:` would be named by whichever adapter.* key sorts first.
  if (a.adapter.enabled != b.adapter.enabled) return std::string("adapter.kind");
  const auto keys_a = store_metadata(a);
  const auto keys_b = store_metadata(b);
  for (const auto& [key, value] : keys_a) {
    auto other = keys_b.find(key);
    if (other == keys_b.end() || other->second != value) return key;
  }
  for (const auto& entry : keys_b)
    if (keys_a.count(entry.first) == 0) return entry.first;
  return std::nullopt;
}

}  // namespace models
}  // namespace strata
