#include "models/hf/hf.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "models/model_layout.h"
#include "kernels/optim/cast.h"

namespace strata::hf {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char* kConfigName = "config.json";
constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
// config.json and the index are a few kB; a bigger one is not a model folder's.
constexpr uint64_t kMaxJsonBytes = 64ull << 20;

Error refuse(const std::string& path, const std::string& what) {
  return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", path, what));
}

Result<std::string> read_text_file_bounded(const std::string& path) {
  std::error_code error;
  const uint64_t size_bytes = fs::file_size(path, error);
  if (error) return make_errno_error(error.value(), "open", path);
  if (size_bytes > kMaxJsonBytes) return refuse(path, fmt::format("{} bytes, more than a model folder's JSON holds", size_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_errno_error(errno, "open", path);
  std::string text(size_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size_bytes));
  if (in.gcount() != static_cast<std::streamsize>(size_bytes)) return make_errno_error(EIO, "read", path);
  return text;
}

// Typed, bounded reads of config.json keys: a key of the wrong JSON type or out of range is a
// refusal naming the file and the key, never an exception.
class Keys {
 public:
  Keys(const Json& object, std::string path, std::string prefix = "")
      : object_(object), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const Json* find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  Error error(const char* key, const std::string& why) const {
    return refuse(path_, fmt::format("key '{}{}' {}", prefix_, key, why));
  }
  Result<uint32_t> integer(const char* key, std::optional<uint32_t> fallback, uint64_t min, uint64_t max) const {
    const Json* value = find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return error(key, "is missing");
    }
    if (!value->is_number_unsigned()) return error(key, "is not a non-negative integer");
    const uint64_t number = value->get<uint64_t>();
    if (number < min || number > max) return error(key, fmt::format("is {}, outside [{}, {}]", number, min, max));
    return static_cast<uint32_t>(number);
  }
  Result<double> number(const char* key, std::optional<double> fallback, double min, double max) const {
    const Json* value = find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return error(key, "is missing");
    }
    if (!value->is_number()) return error(key, "is not a number");
    const double number = value->get<double>();
    if (!(number >= min && number <= max)) return error(key, fmt::format("is {}, outside [{}, {}]", number, min, max));
    return number;
  }
  Result<bool> boolean(const char* key, bool fallback) const {
    const Json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) return error(key, "is not true or false");
    return value->get<bool>();
  }
  Result<std::string> string(const char* key, std::optional<std::string> fallback) const {
    const Json* value = find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return error(key, "is missing");
    }
    if (!value->is_string()) return error(key, "is not a string");
    return value->get<std::string>();
  }

 private:
  const Json& object_;
  std::string path_;
  std::string prefix_;
};

#define HF_READ(field, expr)                         \
  do {                                               \
    auto hf_read_ = (expr);                          \
    if (!hf_read_.ok()) return hf_read_.error();     \
    field = static_cast<decltype(field)>(*hf_read_); \
  } while (0)

// The bounds a YAML model section has (run/train_config.cpp), so a folder never gives a
// shape a config could not.
constexpr uint64_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxEmbd = 65536, kMaxVocab = 1 << 20, kMaxContext = 1 << 16;

Result<ModelConfig> parse_gpt2(const Keys& keys, const std::string& path) {
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
  // strata's GPT-2 kernels compute HF's gelu_new and LayerNorm eps 1e-5 (models/gpt2_shape.h).
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
  (void)path;
  return m;
}

// Reads the llama3 scaling parameters from `scaling` (rope_scaling, or rope_parameters).
Status parse_llama3_scaling(const Keys& scaling, RopeScaling& r) {
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
Status parse_rope_block(const Json& block, const std::string& path, const char* key, ModelConfig& m,
                        bool holds_theta) {
  if (!block.is_object()) return refuse(path, fmt::format("key '{}' is not an object", key));
  Keys keys(block, path, std::string(key) + ".");
  const char* type_key = keys.find("rope_type") != nullptr ? "rope_type" : "type";
  std::string type;
  HF_READ(type, keys.string(type_key, std::string("default")));
  if (holds_theta) HF_READ(m.rope_theta, keys.number("rope_theta", m.rope_theta, 1.0, 1.0e12));
  if (type == "default") return Status();
  if (type != "llama3")
    return keys.error(type_key, fmt::format("is '{}'; strata computes rotary embeddings as default or llama3 only", type));
  return parse_llama3_scaling(keys, m.rope_scaling);
}

Result<ModelConfig> parse_llama(const Json& json, const Keys& keys, const std::string& path,
                                const std::string& model_type) {
  const bool qwen2 = model_type == "qwen2";
  const bool phi3 = model_type == "phi3";
  ModelConfig m;
  m.arch = "llama";
  m.fused_projections = phi3;
  HF_READ(m.n_layer, keys.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers));
  HF_READ(m.n_head, keys.integer("num_attention_heads", std::nullopt, 1, kMaxHeads));
  HF_READ(m.n_embd, keys.integer("hidden_size", std::nullopt, 8, kMaxEmbd));
  HF_READ(m.vocab_size, keys.integer("vocab_size", std::nullopt, 2, kMaxVocab));
  HF_READ(m.n_kv_head, keys.integer("num_key_value_heads", m.n_head, 1, kMaxHeads));
  HF_READ(m.head_dim, keys.integer("head_dim", 0, 0, 4096));
  HF_READ(m.intermediate_size, keys.integer("intermediate_size", std::nullopt, 1, 1 << 20));
  HF_READ(m.norm_eps, keys.number("rms_norm_eps", phi3 ? 1e-5 : 1e-6, 0.0, 1.0));  // Phi3Config's, LlamaConfig's
  HF_READ(m.tie_word_embeddings, keys.boolean("tie_word_embeddings", false));  // LlamaConfig's default
  uint32_t context = 0;
  HF_READ(context, keys.integer("max_position_embeddings", 2048, 1, UINT32_MAX));
  m.seq_len = std::min<uint32_t>(context, kMaxContext);
  HF_READ(m.rope_theta, keys.number("rope_theta", 10000.0, 1.0, 1.0e12));
  if (const Json* parameters = keys.find("rope_parameters"))
    STRATA_RETURN_IF_ERROR(parse_rope_block(*parameters, path, "rope_parameters", m, true));
  if (const Json* scaling = keys.find("rope_scaling"))
    STRATA_RETURN_IF_ERROR(parse_rope_block(*scaling, path, "rope_scaling", m, false));
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
  if (const Json* layer_types = keys.find("layer_types")) {
    if (!layer_types->is_array()) return keys.error("layer_types", "is not a list");
    for (const Json& type : *layer_types)
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
  (void)json;
  return m;
}

// GemmaForCausalLM (Gemma 1): Llama's keys with GemmaConfig's defaults — head_dim 256 (not
// hidden_size / heads), rms_norm_eps 1e-6, tied, a context of 8192 — and Gemma's math, which the
// definition (models/gemma.cpp) computes: RMSNorm x·(1 + w), GeGLU, embeddings times √hidden.
// What it does not compute is refused naming the key.
Result<ModelConfig> parse_gemma(const Keys& keys, const std::string& path) {
  ModelConfig m;
  m.arch = "gemma";
  HF_READ(m.n_layer, keys.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers));
  HF_READ(m.n_head, keys.integer("num_attention_heads", std::nullopt, 1, kMaxHeads));
  HF_READ(m.n_embd, keys.integer("hidden_size", std::nullopt, 8, kMaxEmbd));
  HF_READ(m.vocab_size, keys.integer("vocab_size", std::nullopt, 2, kMaxVocab));
  HF_READ(m.n_kv_head, keys.integer("num_key_value_heads", m.n_head, 1, kMaxHeads));
  HF_READ(m.head_dim, keys.integer("head_dim", 256, 2, 4096));
  HF_READ(m.intermediate_size, keys.integer("intermediate_size", std::nullopt, 1, 1 << 20));
  HF_READ(m.norm_eps, keys.number("rms_norm_eps", 1e-6, 0.0, 1.0));
  HF_READ(m.tie_word_embeddings, keys.boolean("tie_word_embeddings", true));
  uint32_t context = 0;
  HF_READ(context, keys.integer("max_position_embeddings", 8192, 1, UINT32_MAX));
  m.seq_len = std::min<uint32_t>(context, kMaxContext);
  HF_READ(m.rope_theta, keys.number("rope_theta", 10000.0, 1.0, 1.0e12));
  if (const Json* parameters = keys.find("rope_parameters"))
    STRATA_RETURN_IF_ERROR(parse_rope_block(*parameters, path, "rope_parameters", m, true));
  if (const Json* scaling = keys.find("rope_scaling"))
    STRATA_RETURN_IF_ERROR(parse_rope_block(*scaling, path, "rope_scaling", m, false));
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

// A weight_map file name must stay in the folder by its spelling: one path component.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos && name.size() <= 255 &&
         name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// Whether `file` (in `folder`) resolves, through any symlinks, to a path inside the folder.
Result<bool> resolves_inside(const fs::path& folder, const fs::path& file) {
  std::error_code error;
  const fs::path real_folder = fs::canonical(folder, error);
  if (error) return make_errno_error(error.value(), "open", folder.string());
  const fs::path real_file = fs::canonical(file, error);
  if (error) return make_errno_error(error.value(), "open", file.string());
  auto [folder_end, file_it] = std::mismatch(real_folder.begin(), real_folder.end(), real_file.begin(), real_file.end());
  return folder_end == real_folder.end() && file_it != real_file.end();
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

uint64_t TensorSpec::element_count() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

TensorSpec tensor_spec(const ModelConfig& model, const std::string& name, const std::vector<int64_t>& shape) {
  TensorSpec spec{name, shape, name == "wpe.weight"};
  if (!model.fused_projections || shape.size() != 2) return spec;
  // Phi-3: q/k/v rows stacked in self_attn.qkv_proj (Phi3Attention slices its output in that
  // order), gate/up in mlp.gate_up_proj (Phi3MLP chunks gate first).
  const int64_t q_rows = int64_t{model.n_head} * model.head_size();
  const int64_t kv_rows = int64_t{model.kv_heads()} * model.head_size();
  const int64_t mlp_rows = model.intermediate_size;
  struct Part { const char* suffix; const char* fused; int64_t begin; int64_t total; };
  const Part parts[] = {{"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, q_rows + 2 * kv_rows},
                        {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", q_rows, q_rows + 2 * kv_rows},
                        {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", q_rows + kv_rows, q_rows + 2 * kv_rows},
                        {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, 2 * mlp_rows},
                        {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", mlp_rows, 2 * mlp_rows}};
  for (const Part& part : parts) {
    const std::string_view suffix = part.suffix;
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    spec.fused_name = name.substr(0, name.size() - suffix.size()) + part.fused;
    spec.fused_row_begin = part.begin;
    spec.fused_rows = part.total;
    break;
  }
  return spec;
}

std::vector<TensorSpec> model_tensors(const ModelConfig& model) {
  // The definition's list (models/model.h): one authority for every architecture.
  // The base's tensors alone: LoRA's adapters are never in a model checkpoint (a PEFT folder
  // holds them: models/hf/peft.h).
  std::vector<TensorSpec> out;
  ModelConfig base = model;
  base.adapter.enabled = false;
  const ModelLayout layout(base);
  for (const Unit& unit : layout.units())
    for (const UnitTensor& tensor : unit.tensors) out.push_back(tensor_spec(model, tensor.name, tensor.shape));
  return out;
}

Result<ModelConfig> parse_config_json(std::string_view text, const std::string& path) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return refuse(path, "is not valid JSON");
  if (!json.is_object()) return refuse(path, "is not a JSON object");
  const Keys keys(json, path);
  std::string model_type;
  HF_READ(model_type, keys.string("model_type", std::nullopt));
  if (model_type == "gpt2") return parse_gpt2(keys, path);
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "phi3")
    return parse_llama(json, keys, path, model_type);
  if (model_type == "gemma") return parse_gemma(keys, path);
  return keys.error("model_type", fmt::format("is '{}'; strata reads gpt2, llama, mistral, qwen2, phi3 and gemma",
                                              model_type));
}

Result<ModelConfig> read_config(const std::string& folder) {
  const std::string path = (fs::path(folder) / kConfigName).string();
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    return refuse(folder, fmt::format("holds no {} (not a Hugging Face model folder)", kConfigName));
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file_bounded(path));
  return parse_config_json(text, path);
}

namespace {
// The shape keys every decoder config of the Llama family names alike (LlamaConfig's, Gemma's).
void decoder_shape_keys(const ModelConfig& m, nlohmann::ordered_json& json) {
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
}  // namespace

std::string config_json(const ModelConfig& m) {
  nlohmann::ordered_json json;
  // q/k/v biases alone are Qwen 2's attention (Qwen2ForCausalLM); with o_proj's too, Llama's
  // attention_bias. Either way the folder loads in transformers as the model strata trained.
  // Phi-3's fused projections are Phi3ForCausalLM's; a window without biases is Mistral's
  // (LlamaConfig has no window, and dropping it would change the model past W tokens).
  const bool qwen2 = m.arch == "llama" && m.qkv_bias && !m.o_proj_bias;
  const bool phi3 = m.arch == "llama" && m.fused_projections;
  const bool mistral = m.arch == "llama" && !phi3 && !m.qkv_bias && m.attention_window > 0;
  if (m.arch == "gemma") {
    // GemmaForCausalLM: both activation keys name the tanh GELU, so transformers computes it
    // whichever of them its version reads (parse_gemma).
    json["architectures"] = {"GemmaForCausalLM"};
    json["model_type"] = "gemma";
    decoder_shape_keys(m, json);
    json["rope_scaling"] = nullptr;
    json["hidden_act"] = "gelu_pytorch_tanh";
    json["hidden_activation"] = "gelu_pytorch_tanh";
    json["attention_bias"] = false;
    json["tie_word_embeddings"] = m.tie_word_embeddings;
  } else if (m.arch == "llama") {
    json["architectures"] = {phi3      ? "Phi3ForCausalLM"
                             : qwen2   ? "Qwen2ForCausalLM"
                             : mistral ? "MistralForCausalLM"
                                       : "LlamaForCausalLM"};
    json["model_type"] = phi3 ? "phi3" : qwen2 ? "qwen2" : mistral ? "mistral" : "llama";
    decoder_shape_keys(m, json);
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
  } else {
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
  json["torch_dtype"] = "float32";
  return json.dump(2) + "\n";
}

Result<std::map<std::string, std::string>> parse_index_json(std::string_view text, const std::string& path) {
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return refuse(path, "is not valid JSON");
  if (!json.is_object()) return refuse(path, "is not a JSON object");
  auto map = json.find("weight_map");
  if (map == json.end() || !map->is_object()) return refuse(path, "key 'weight_map' is missing or not an object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) return refuse(path, fmt::format("key 'weight_map.{}' is not a file name", name));
    const std::string file_name = file.get<std::string>();
    if (!plain_file_name(file_name))
      return refuse(path, fmt::format("key 'weight_map.{}' names '{}', not a .safetensors file in this folder", name,
                                      file_name));
    out.emplace(name, file_name);
  }
  if (out.empty()) return refuse(path, "key 'weight_map' lists no tensor");
  return out;
}

bool is_folder(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

// --- reading -------------------------------------------------------------------------------

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Result<Checkpoint> Checkpoint::open(const std::string& path) {
  Checkpoint checkpoint;
  checkpoint.path_ = path;
  // A safetensors header that the reader refuses is the folder's fault: exit 2, naming the file.
  auto open_file = [&](const fs::path& file) -> Status {
    Result<SafetensorsReader> reader = SafetensorsReader::open(file.string());
    if (!reader.ok()) {
      Error error = reader.error();
      if (error.kind == ErrorKind::corrupt) error.kind = ErrorKind::invalid_argument;
      return error;
    }
    checkpoint.readers_.push_back(std::make_unique<SafetensorsReader>(std::move(*reader)));
    for (const auto& [name, entry] : checkpoint.readers_.back()->entries())
      checkpoint.file_of_.emplace(name, checkpoint.readers_.size() - 1);
    return Status();
  };
  if (!is_folder(path)) {
    STRATA_RETURN_IF_ERROR(open_file(path));
    return checkpoint;
  }
  const fs::path folder(path);
  std::error_code error;
  const fs::path index_path = folder / kIndexName;
  if (fs::exists(index_path, error)) {
    STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file_bounded(index_path.string()));
    STRATA_ASSIGN_OR_RETURN(auto weight_map, parse_index_json(text, index_path.string()));
    std::map<std::string, size_t> reader_of_file;
    for (const auto& [name, file] : weight_map) {
      if (reader_of_file.count(file) == 0) {
        const fs::path file_path = folder / file;
        Result<bool> inside = resolves_inside(folder, file_path);
        if (!inside.ok()) return refuse(index_path.string(), fmt::format("key 'weight_map.{}': {}", name,
                                                                          inside.error().to_string()));
        if (!*inside)
          return refuse(index_path.string(), fmt::format("key 'weight_map.{}': '{}' resolves outside the folder", name, file));
        const size_t before = checkpoint.readers_.size();
        STRATA_RETURN_IF_ERROR(open_file(file_path));
        reader_of_file.emplace(file, before);
      }
    }
    checkpoint.file_of_.clear();  // the weight map is the authority on which file holds what
    for (const auto& [name, file] : weight_map) {
      const size_t reader = reader_of_file.at(file);
      if (checkpoint.readers_[reader]->find(name) == nullptr)
        return refuse(index_path.string(), fmt::format("key 'weight_map.{}': {} holds no such tensor", name, file));
      checkpoint.file_of_.emplace(name, reader);
    }
    return checkpoint;
  }
  const fs::path single = folder / kSingleFileName;
  if (!fs::exists(single, error))
    return refuse(path, fmt::format("holds neither {} nor {}", kSingleFileName, kIndexName));
  Result<bool> inside = resolves_inside(folder, single);
  if (!inside.ok()) return inside.error();
  if (!*inside) return refuse(single.string(), "is a symlink that resolves outside the folder");
  STRATA_RETURN_IF_ERROR(open_file(single));
  return checkpoint;
}

Result<Checkpoint::Located> Checkpoint::locate(const TensorSpec& spec) const {
  if (!spec.fused_name.empty()) {
    auto it = file_of_.find(spec.fused_name);
    const std::vector<int64_t> fused_shape = {spec.fused_rows, spec.shape[1]};
    if (it == file_of_.end())
      return refuse(path_, fmt::format("tensor '{}' is missing (the model needs {}, which holds {})", spec.fused_name,
                                       shape_text(fused_shape), spec.name));
    const SafetensorsReader* reader = readers_[it->second].get();
    const SafetensorsEntry* entry = reader->find(spec.fused_name);
    if (entry->shape != fused_shape)
      return refuse(reader->path(), fmt::format("tensor '{}' has shape {}; the model (config.json) needs {}",
                                                spec.fused_name, shape_text(entry->shape), shape_text(fused_shape)));
    return Located{reader, entry};
  }
  std::string name = spec.name;
  auto it = file_of_.find(name);
  if (it == file_of_.end() && spec.name.rfind("model.", 0) != 0 && spec.name != "lm_head.weight") {
    name = "transformer." + spec.name;  // GPT-2 saved by GPT2LMHeadModel
    it = file_of_.find(name);
  }
  if (it == file_of_.end())
    return refuse(path_, fmt::format("tensor '{}' is missing (the model needs {})", spec.name, shape_text(spec.shape)));
  const SafetensorsReader* reader = readers_[it->second].get();
  const SafetensorsEntry* entry = reader->find(name);
  const bool same = entry->shape == spec.shape;
  const bool longer = spec.rows_may_exceed && entry->shape.size() == spec.shape.size() && !spec.shape.empty() &&
                      std::equal(spec.shape.begin() + 1, spec.shape.end(), entry->shape.begin() + 1) &&
                      entry->shape[0] >= spec.shape[0];
  if (!same && !longer)
    return refuse(reader->path(), fmt::format("tensor '{}' has shape {}; the model (config.json) needs {}", name,
                                              shape_text(entry->shape), shape_text(spec.shape)));
  return Located{reader, entry};
}

Status Checkpoint::check(const std::vector<TensorSpec>& tensors) const {
  for (const TensorSpec& spec : tensors) STRATA_RETURN_IF_ERROR(locate(spec).status());
  return Status();
}

Status Checkpoint::read_fp32(const TensorSpec& spec, float* out) const {
  STRATA_ASSIGN_OR_RETURN(Located found, locate(spec));
  // Only the first element_count elements (GPT-2's wpe may have more rows): read a prefix.
  SafetensorsEntry prefix = *found.entry;
  const uint64_t count = spec.element_count();
  // A fused tensor's part: its rows, a contiguous range of the row-major fused tensor.
  if (!spec.fused_name.empty())
    prefix.begin_bytes += static_cast<uint64_t>(spec.fused_row_begin) * static_cast<uint64_t>(spec.shape[1]) *
                          dtype_size_bytes(prefix.dtype);
  prefix.end_bytes = prefix.begin_bytes + count * dtype_size_bytes(prefix.dtype);
  prefix.shape = spec.shape;
  if (prefix.dtype == DType::f32) return found.reader->read(prefix, out);
  // Widen in place: the 16-bit values land in the upper half of `out`, then widen front to
  // back — each float written lies below the halves not yet read.
  auto* half = reinterpret_cast<uint16_t*>(out) + count;
  STRATA_RETURN_IF_ERROR(found.reader->read(prefix, half));
  constexpr uint64_t kPiece = 4096;  // pieces: a piece's output never overlaps its own input
  for (uint64_t begin = 0; begin < count; begin += kPiece) {
    const uint64_t n = std::min(kPiece, count - begin);
    uint16_t staging[kPiece];
    std::copy(half + begin, half + begin + n, staging);
    if (prefix.dtype == DType::bf16)
      kernels::cast_bf16_to_fp32(std::span<const uint16_t>(staging, n), std::span<float>(out + begin, n));
    else
      kernels::cast_fp16_to_fp32(std::span<const uint16_t>(staging, n), std::span<float>(out + begin, n));
  }
  return Status();
}

// --- writing -------------------------------------------------------------------------------

FolderWriter::FolderWriter(FolderWriter&& other) noexcept
    : folder_(std::move(other.folder_)),
      temp_folder_(std::move(other.temp_folder_)),
      model_(std::move(other.model_)),
      metadata_(std::move(other.metadata_)),
      inputs_(std::move(other.inputs_)),
      next_input_(other.next_input_),
      fused_parts_(std::move(other.fused_parts_)),
      shards_(std::move(other.shards_)),
      shard_names_(std::move(other.shard_names_)),
      writer_(std::move(other.writer_)),
      shard_index_(other.shard_index_),
      next_in_shard_(other.next_in_shard_),
      finished_(std::exchange(other.finished_, true)) {}

FolderWriter& FolderWriter::operator=(FolderWriter&& other) noexcept {
  if (this != &other) {
    this->~FolderWriter();
    new (this) FolderWriter(std::move(other));
  }
  return *this;
}

FolderWriter::~FolderWriter() {
  writer_.reset();
  if (!finished_ && !temp_folder_.empty()) {
    std::error_code ignored;
    fs::remove_all(temp_folder_, ignored);
  }
}

Result<FolderWriter> FolderWriter::create(const std::string& folder, const ModelConfig& model,
                                          const std::vector<TensorSpec>& tensors, uint64_t shard_size_bytes,
                                          const std::map<std::string, std::string>& metadata) {
  FolderWriter writer;
  writer.folder_ = fs::path(folder).lexically_normal().string();
  while (writer.folder_.size() > 1 && writer.folder_.back() == '/') writer.folder_.pop_back();
  writer.model_ = model;
  writer.metadata_ = metadata;
  std::error_code error;
  if (fs::exists(writer.folder_, error))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: already exists; export writes a new Hugging Face folder, never over one",
                                  writer.folder_));
  // The tensors as written: the parts of a fused tensor (declared next to each other) as one.
  writer.inputs_ = tensors;
  std::vector<TensorSpec> outputs;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorSpec& spec = tensors[k];
    if (spec.fused_name.empty()) {
      outputs.push_back(spec);
      continue;
    }
    if (k > 0 && tensors[k - 1].fused_name == spec.fused_name) continue;
    int64_t rows = 0;
    for (size_t j = k; j < tensors.size() && tensors[j].fused_name == spec.fused_name; ++j) {
      if (tensors[j].fused_row_begin != rows)
        return make_error(ErrorKind::internal, fmt::format("{}: the parts of '{}' are not declared in order",
                                                           writer.folder_, spec.fused_name));
      rows += tensors[j].shape[0];
    }
    if (rows != spec.fused_rows)
      return make_error(ErrorKind::internal, fmt::format("{}: the parts of '{}' hold {} of its {} rows", writer.folder_,
                                                         spec.fused_name, rows, spec.fused_rows));
    outputs.push_back(TensorSpec{spec.fused_name, {spec.fused_rows, spec.shape[1]}});
  }
  // Shards as save_pretrained cuts them: tensors in order, a new shard when the next tensor
  // would take this one past the limit (a tensor bigger than the limit gets a shard alone).
  std::vector<TensorSpec> current;
  uint64_t current_bytes = 0;
  for (const TensorSpec& spec : outputs) {
    const uint64_t bytes = spec.element_count() * 4;
    if (!current.empty() && current_bytes + bytes > shard_size_bytes) {
      writer.shards_.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(spec);
    current_bytes += bytes;
  }
  writer.shards_.push_back(std::move(current));
  const size_t n = writer.shards_.size();
  for (size_t k = 0; k < n; ++k)
    writer.shard_names_.push_back(n == 1 ? std::string(kSingleFileName)
                                         : fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, n));
  writer.temp_folder_ = writer.folder_ + ".tmp";
  fs::remove_all(writer.temp_folder_, error);  // a previous failed export's leftovers
  if (!fs::create_directory(writer.temp_folder_, error) || error)
    return make_errno_error(error ? error.value() : EEXIST, "mkdir", writer.temp_folder_);
  STRATA_RETURN_IF_ERROR(writer.open_shard(0));
  return writer;
}

Status FolderWriter::open_shard(size_t shard) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const TensorSpec& spec : shards_[shard]) specs.push_back({spec.name, DType::f32, spec.shape});
  std::map<std::string, std::string> metadata = metadata_;
  metadata["format"] = "pt";  // what transformers' loader asks of a safetensors file
  STRATA_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                          SafetensorsWriter::create((fs::path(temp_folder_) / shard_names_[shard]).string(), specs, metadata));
  writer_ = std::make_unique<SafetensorsWriter>(std::move(writer));
  shard_index_ = shard;
  next_in_shard_ = 0;
  return Status();
}

Status FolderWriter::write_next(const float* values) {
  assert(next_input_ < inputs_.size());
  const TensorSpec& spec = inputs_[next_input_++];
  if (spec.fused_name.empty()) return write_output(values);
  fused_parts_.insert(fused_parts_.end(), values, values + spec.element_count());
  if (next_input_ < inputs_.size() && inputs_[next_input_].fused_name == spec.fused_name) return Status();
  Status written = write_output(fused_parts_.data());
  fused_parts_.clear();
  return written;
}

Status FolderWriter::write_output(const float* values) {
  if (next_in_shard_ == shards_[shard_index_].size()) {
    STRATA_RETURN_IF_ERROR(writer_->finish());
    STRATA_RETURN_IF_ERROR(open_shard(shard_index_ + 1));
  }
  const TensorSpec& spec = shards_[shard_index_][next_in_shard_];
  STRATA_RETURN_IF_ERROR(writer_->write_next(values, spec.element_count() * 4));
  ++next_in_shard_;
  return Status();
}

Result<std::string> read_small_text_file(const std::string& path) { return read_text_file_bounded(path); }

Status publish_folder(const std::string& temp_folder, const std::string& folder) {
  const int dir_fd = ::open(temp_folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  if (::rename(temp_folder.c_str(), folder.c_str()) != 0) return make_errno_error(errno, "rename", folder);
  return Status();
}

Status write_small_file(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_errno_error(errno, "create", path.string());
  const char* cursor = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t put = ::write(fd, cursor, left);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      const int saved = errno;
      ::close(fd);
      return make_errno_error(saved, "write", path.string());
    }
    cursor += put;
    left -= static_cast<size_t>(put);
  }
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    return make_errno_error(saved, "fsync", path.string());
  }
  ::close(fd);
  return Status();
}

Status copy_tokenizer_files(const std::string& path, const std::string& into_folder, const std::string& final_folder) {
  std::error_code error;
  std::vector<std::pair<fs::path, std::string>> files;  // source, name in the folder
  if (fs::is_directory(path, error)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::is_regular_file(fs::path(path) / name, error)) files.emplace_back(fs::path(path) / name, name);
  } else {
    files.emplace_back(path, fs::path(path).extension() == ".json" ? "tokenizer.json" : "tokenizer.model");
  }
  for (const auto& [source, name] : files) {
    fs::copy_file(source, fs::path(into_folder) / name, fs::copy_options::overwrite_existing, error);
    if (error)
      return make_error(ErrorKind::io, fmt::format("copying the tokenizer {} into {}: {}", source.string(), final_folder,
                                                   error.message()));
  }
  return Status();
}

Status FolderWriter::copy_tokenizer(const std::string& path) { return copy_tokenizer_files(path, temp_folder_, folder_); }

Status FolderWriter::finish() {
  STRATA_RETURN_IF_ERROR(writer_->finish());
  writer_.reset();
  const fs::path temp(temp_folder_);
  if (shards_.size() > 1) {
    nlohmann::ordered_json index;
    uint64_t total_bytes = 0;
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (size_t k = 0; k < shards_.size(); ++k)
      for (const TensorSpec& spec : shards_[k]) {
        map[spec.name] = shard_names_[k];
        total_bytes += spec.element_count() * 4;
      }
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = std::move(map);
    STRATA_RETURN_IF_ERROR(write_small_file(temp / kIndexName, index.dump(2) + "\n"));
  }
  STRATA_RETURN_IF_ERROR(write_small_file(temp / kConfigName, config_json(model_)));
  STRATA_RETURN_IF_ERROR(publish_folder(temp_folder_, folder_));
  finished_ = true;
  return Status();
}

}  // namespace strata::hf
