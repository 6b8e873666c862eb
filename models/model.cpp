// models/model.cpp — the GPT-2 and Llama definitions (model.h), and the shape keys a
// store records.
#include "models/model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/gpt2/gpt2.h"
#include "kernels/llama/llama.h"

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

std::vector<std::string> adapter_target_names(const std::string& arch) {
  if (arch == "gpt2") return {"c_attn", "c_proj", "c_fc", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

std::vector<std::string> default_adapter_targets(const std::string& arch) {
  if (arch == "gpt2") return {"c_attn"};
  return {"q_proj", "v_proj"};
}

bool adapter_targets_linear(const std::vector<std::string>& targets, const BlockLinear& linear) {
  for (const std::string& target : targets)
    if (linear.suffix == target || linear.suffix.ends_with("." + target)) return true;
  return false;
}

namespace {

namespace gk = kernels::gpt2;
namespace lk = kernels::llama;

std::vector<int64_t> shape_of(const gk::ParamSpec& spec) {
  return spec.rank == 1 ? std::vector<int64_t>{spec.shape[0]} : std::vector<int64_t>{spec.shape[0], spec.shape[1]};
}

// --- GPT-2 ---------------------------------------------------------------------------------
// Units embed (wte, wpe), h.{i}, ln_f. Init as GPT-2's: normal(0, init_std), residual
// projections scaled by 1/sqrt(2·n_layer), biases 0, LayerNorm weights 1.
class Gpt2 final : public ModelDefinition {
 public:
  explicit Gpt2(const ModelConfig& model) : ModelDefinition(model) {
    kc_ = gpt2_kernel_config(model);
    const double residual_std = model.init_std / std::sqrt(2.0 * model.n_layer);
    auto add = [](Unit& unit, std::string name, const gk::ParamSpec& spec, double std_dev, float value) {
      add_tensor(unit, std::move(name), shape_of(spec), spec.weight_decay, std_dev, value);
    };
    auto outer = gk::outer_param_specs(kc_);  // wte, wpe, ln_f.w, ln_f.b
    Unit embed{"embed", -1, {}, 0};
    add(embed, std::string(outer[0].name_suffix), outer[0], model.init_std, 0.0f);
    embed.tensors.back().token_embedding = true;  // wte
    add(embed, std::string(outer[1].name_suffix), outer[1], model.init_std, 0.0f);
    units_.push_back(std::move(embed));
    const auto block_specs = gk::block_param_specs(kc_);
    for (int64_t layer = 0; layer < kc_.n_layer; ++layer) {
      Unit block{"h." + std::to_string(layer), layer, {}, 0};
      for (const auto& spec : block_specs) {
        std::string_view suffix = spec.name_suffix;
        const bool is_layer_norm_weight = suffix.starts_with("ln_") && suffix.ends_with(".weight");
        const bool is_bias = suffix.ends_with(".bias");
        const bool is_residual_projection = suffix.ends_with("c_proj.weight");
        const double std_dev = is_bias || is_layer_norm_weight ? 0.0
                               : is_residual_projection        ? residual_std
                                                               : model.init_std;
        add(block, gk::block_param_name(layer, suffix), spec, std_dev, is_layer_norm_weight ? 1.0f : 0.0f);
      }
      units_.push_back(std::move(block));
    }
    Unit ln_f{"ln_f", -1, {}, 0};
    add(ln_f, std::string(outer[2].name_suffix), outer[2], 0.0, 1.0f);
    add(ln_f, std::string(outer[3].name_suffix), outer[3], 0.0, 0.0f);
    units_.push_back(std::move(ln_f));
    find_linears({"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}, /*conv1d=*/true);
  }

  const char* arch() const override { return "gpt2"; }
  size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const BatchShape& shape) const override {
    return backend.workspace_size_bytes(kc_, shape);
  }
  size_t workspace_size_bytes(device::Kind kind, const BatchShape& shape) const override {
    return kernels::workspace_size_bytes(kind, kc_, shape);
  }
  Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* embed,
                           float* x0) const override {
    return backend.embedding_forward(kc_, shape, embed, wpe(embed), x0);
  }
  Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* d_x0,
                            float* grads) const override {
    return backend.embedding_backward(kc_, shape, d_x0, grads, wpe(grads));
  }
  Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                       const float* x_in, float* x_out, const Workspace& workspace,
                       const kernels::lora::BlockAdapters* adapters) const override {
    return backend.block_forward(kc_, shape, gk::bind_block(kc_, block), x_in, x_out, workspace, adapters);
  }
  Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                        const float* x_in, const float* d_out, float* d_in, float* grads, const Workspace& workspace,
                        bool recompute, const kernels::lora::BlockAdapters* adapters) const override {
    const gk::BlockGrads bound = grads == nullptr ? gk::BlockGrads{} : gk::bind_block(kc_, grads);  // null: frozen
    return backend.block_backward(kc_, shape, gk::bind_block(kc_, block), x_in, d_out, d_in, bound, workspace,
                                  recompute, adapters);
  }
  Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* ln_f,
                               const float* embed, const float* x_final, float* d_x_final, float* ln_f_grads,
                               float* embed_grads, const Workspace& workspace) const override {
    // d_x_final null: the loss only; ln_f_grads null: a frozen ln_f.
    const gk::HeadGrads grads =
        d_x_final == nullptr ? gk::HeadGrads{}
                             : gk::HeadGrads{ln_f_grads, ln_f_grads == nullptr ? nullptr : ln_f_grads + kc_.n_embd,
                                             embed_grads};
    return backend.head_forward_backward(kc_, shape, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, embed}, x_final,
                                         d_x_final, grads, workspace);
  }
  int64_t kv_cache_width() const override { return kc_.n_embd; }
  int64_t learned_positions() const override { return kc_.n_ctx; }
  uint64_t final_norm_elements() const override { return uint64_t(2 * kc_.n_embd); }
  bool head_tied() const override { return true; }
  size_t decode_workspace_size_bytes(device::Kind kind, int64_t max_rows, int64_t max_positions) const override {
    return kernels::decode_workspace_size_bytes(kind, kc_, max_rows, max_positions);
  }
  Status embedding_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const int32_t* tokens,
                          const float* token_table, int64_t table_rows, const float* positions,
                          float* x0) const override {
    gk::Config piece = kc_;
    piece.vocab_size = table_rows;
    return backend.embedding_decode(piece, past, rows, tokens, token_table, positions, x0);
  }
  Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const float* block,
                      const float* x_in, float* x_out, const gk::KvCacheBlock& cache,
                      const Workspace& workspace) const override {
    return backend.block_decode(kc_, past, rows, gk::bind_block(kc_, block), x_in, x_out, cache, workspace);
  }
  Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* ln_f, const float* projection,
                     int64_t projection_rows, const float* x_final, float* logits,
                     const Workspace& workspace) const override {
    gk::Config piece = kc_;
    piece.vocab_size = projection_rows;
    return backend.head_logits(piece, rows, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, projection}, x_final, logits,
                               workspace);
  }
  size_t decode_bf16_scratch_bytes(device::Kind kind) const override {
    return kernels::decode_bf16_scratch_bytes(kind, kc_);
  }
  Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const uint16_t* block,
                           const float* x_in, float* x_out, const gk::KvCacheBlock& cache, const Workspace& workspace,
                           const Workspace& scratch) const override {
    return backend.block_decode_bf16(kc_, past, rows, gk::bind_block(kc_, block), x_in, x_out, cache, workspace,
                                     scratch);
  }
  Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows, const uint16_t* ln_f,
                          const uint16_t* projection, const float* x_final, float* logits, const Workspace& workspace,
                          const Workspace& scratch) const override {
    return backend.head_logits_bf16(kc_, rows, gk::HeadWeightsBf16{ln_f, ln_f + kc_.n_embd, projection}, x_final,
                                    logits, workspace, scratch);
  }
  size_t host_workspace_size_bytes(const BatchShape& shape) const override {
    return gk::workspace_size_bytes(kc_, shape);
  }
  void host_embedding_forward(const BatchShape& shape, const int32_t* tokens, const float* embed,
                              float* x0) const override {
    gk::embedding_forward(kc_, shape, tokens, embed, wpe(embed), x0);
  }
  void host_block_forward(const BatchShape& shape, const float* block, const float* x_in, float* x_out,
                          const Workspace& workspace) const override {
    gk::block_forward(kc_, shape, gk::bind_block(kc_, block), x_in, x_out, workspace);
  }
  void host_head_forward(const BatchShape& shape, const float* ln_f, const float* embed, const float* x_final,
                         float* logits, const Workspace& workspace) const override {
    gk::head_forward(kc_, shape, gk::HeadWeights{ln_f, ln_f + kc_.n_embd, embed}, x_final, logits, workspace);
  }

 private:
  // wpe follows wte in the embedding unit.
  template <typename T>
  T* wpe(T* embed) const {
    return embed + kc_.vocab_size * kc_.n_embd;
  }
  gk::Config kc_;
};

// --- Llama ---------------------------------------------------------------------------------
// Units embed (model.embed_tokens), layers.{i}, norm (model.norm, and lm_head when untied).
// Init as Hugging Face's LlamaPreTrainedModel: every Linear and the embedding normal(0,
// init_std = initializer_range), RMSNorm weights 1.
class Llama final : public ModelDefinition {
 public:
  explicit Llama(const ModelConfig& model) : ModelDefinition(model) {
    kc_.n_layer = model.n_layer;
    kc_.n_head = model.n_head;
    kc_.n_kv_head = model.kv_heads();
    kc_.head_dim = model.head_size();
    kc_.n_embd = model.n_embd;
    kc_.intermediate_size = model.intermediate_size;
    kc_.vocab_size = model.vocab_size;
    kc_.n_ctx = model.seq_len;
    kc_.rope_theta = model.rope_theta;
    if (model.rope_scaling.type == "llama3") {
      kc_.rope_factor = model.rope_scaling.factor;
      kc_.rope_low_freq_factor = model.rope_scaling.low_freq_factor;
      kc_.rope_high_freq_factor = model.rope_scaling.high_freq_factor;
      kc_.rope_original_max_positions = model.rope_scaling.original_max_position_embeddings;
    }
    kc_.norm_eps = model.norm_eps;
    kc_.tie_word_embeddings = model.tie_word_embeddings;
    kc_.qkv_bias = model.qkv_bias;
    kc_.o_bias = model.o_proj_bias;
    const int64_t vocab = model.vocab_size;
    const int64_t c = model.n_embd;
    Unit embed{"embed", -1, {}, 0};
    add_tensor(embed, "model.embed_tokens.weight", {vocab, c}, true, model.init_std, 0.0f);
    embed.tensors.back().token_embedding = true;
    units_.push_back(std::move(embed));
    const auto specs = lk::block_param_specs(kc_);
    for (int64_t layer = 0; layer < kc_.n_layer; ++layer) {
      Unit block{"layers." + std::to_string(layer), layer, {}, 0};
      for (const auto& spec : specs) {
        // RMSNorm weights start at 1, biases at 0 (neither decays: spec.weight_decay), matrices
        // normal(0, init_std).
        const bool is_norm = spec.name_suffix.ends_with("layernorm.weight");
        const bool is_bias = spec.name_suffix.ends_with(".bias");
        add_tensor(block, lk::block_param_name(layer, spec.name_suffix), shape_of(spec), spec.weight_decay,
                   is_norm || is_bias ? 0.0 : model.init_std, is_norm ? 1.0f : 0.0f);
      }
      units_.push_back(std::move(block));
    }
    Unit norm{"norm", -1, {}, 0};
    add_tensor(norm, "model.norm.weight", {c}, false, 0.0, 1.0f);
    if (!model.tie_word_embeddings) add_tensor(norm, "lm_head.weight", {vocab, c}, true, model.init_std, 0.0f);
    units_.push_back(std::move(norm));
    find_linears({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj"},
                 /*conv1d=*/false);
  }

  const char* arch() const override { return "llama"; }
  size_t workspace_size_bytes(const kernels::ComputeBackend& backend, const BatchShape& shape) const override {
    return backend.llama_workspace_size_bytes(kc_, shape);
  }
  size_t workspace_size_bytes(device::Kind kind, const BatchShape& shape) const override {
    return kernels::workspace_size_bytes(kind, kc_, shape);
  }
  Status embedding_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* embed,
                           float* x0) const override {
    return backend.llama_embedding_forward(kc_, shape, embed, x0);
  }
  Status embedding_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* d_x0,
                            float* grads) const override {
    return backend.llama_embedding_backward(kc_, shape, d_x0, grads);
  }
  Status block_forward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                       const float* x_in, float* x_out, const Workspace& workspace,
                       const kernels::lora::BlockAdapters* adapters) const override {
    return backend.llama_block_forward(kc_, shape, lk::bind_block(kc_, block), x_in, x_out, workspace, adapters);
  }
  Status block_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* block,
                        const float* x_in, const float* d_out, float* d_in, float* grads, const Workspace& workspace,
                        bool recompute, const kernels::lora::BlockAdapters* adapters) const override {
    const lk::BlockGrads bound = grads == nullptr ? lk::BlockGrads{} : lk::bind_block(kc_, grads);  // null: frozen
    return backend.llama_block_backward(kc_, shape, lk::bind_block(kc_, block), x_in, d_out, d_in, bound, workspace,
                                        recompute, adapters);
  }
  Status head_forward_backward(kernels::ComputeBackend& backend, const BatchShape& shape, const float* norm,
                               const float* embed, const float* x_final, float* d_x_final, float* norm_grads,
                               float* embed_grads, const Workspace& workspace) const override {
    return backend.llama_head_forward_backward(kc_, shape, head_weights(norm, embed), x_final, d_x_final,
                                               head_weights(norm_grads, embed_grads), workspace);
  }
  int64_t kv_cache_width() const override { return kc_.kv_width(); }
  int64_t learned_positions() const override { return 0; }
  uint64_t final_norm_elements() const override { return uint64_t(kc_.n_embd); }
  bool head_tied() const override { return kc_.tie_word_embeddings; }
  size_t decode_workspace_size_bytes(device::Kind kind, int64_t max_rows, int64_t max_positions) const override {
    return kernels::decode_workspace_size_bytes(kind, kc_, max_rows, max_positions);
  }
  Status embedding_decode(kernels::ComputeBackend& backend, int64_t /*past*/, int64_t rows, const int32_t* tokens,
                          const float* token_table, int64_t table_rows, const float* /*positions*/,
                          float* x0) const override {
    lk::Config piece = kc_;
    piece.vocab_size = table_rows;
    return backend.llama_embedding_decode(piece, rows, tokens, token_table, x0);
  }
  Status block_decode(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const float* block,
                      const float* x_in, float* x_out, const kernels::gpt2::KvCacheBlock& cache,
                      const Workspace& workspace) const override {
    return backend.llama_block_decode(kc_, past, rows, lk::bind_block(kc_, block), x_in, x_out, cache, workspace);
  }
  Status head_logits(kernels::ComputeBackend& backend, int64_t rows, const float* norm, const float* projection,
                     int64_t projection_rows, const float* x_final, float* logits,
                     const Workspace& workspace) const override {
    lk::Config piece = kc_;
    piece.vocab_size = projection_rows;
    return backend.llama_head_logits(piece, rows, lk::HeadWeights{norm, projection}, x_final, logits, workspace);
  }
  size_t decode_bf16_scratch_bytes(device::Kind kind) const override {
    return kernels::decode_bf16_scratch_bytes(kind, kc_);
  }
  Status block_decode_bf16(kernels::ComputeBackend& backend, int64_t past, int64_t rows, const uint16_t* block,
                           const float* x_in, float* x_out, const kernels::gpt2::KvCacheBlock& cache,
                           const Workspace& workspace, const Workspace& scratch) const override {
    return backend.llama_block_decode_bf16(kc_, past, rows, lk::bind_block(kc_, block), x_in, x_out, cache, workspace,
                                           scratch);
  }
  Status head_logits_bf16(kernels::ComputeBackend& backend, int64_t rows, const uint16_t* norm,
                          const uint16_t* projection, const float* x_final, float* logits, const Workspace& workspace,
                          const Workspace& scratch) const override {
    return backend.llama_head_logits_bf16(kc_, rows, lk::HeadWeightsBf16{norm, projection}, x_final, logits,
                                          workspace, scratch);
  }
  size_t host_workspace_size_bytes(const BatchShape& shape) const override {
    return lk::workspace_size_bytes(kc_, shape);
  }
  void host_embedding_forward(const BatchShape& shape, const int32_t* tokens, const float* embed,
                              float* x0) const override {
    lk::embedding_forward(kc_, shape, tokens, embed, x0);
  }
  void host_block_forward(const BatchShape& shape, const float* block, const float* x_in, float* x_out,
                          const Workspace& workspace) const override {
    lk::block_forward(kc_, shape, lk::bind_block(kc_, block), x_in, x_out, workspace);
  }
  void host_head_forward(const BatchShape& shape, const float* norm, const float* embed, const float* x_final,
                         float* logits, const Workspace& workspace) const override {
    lk::head_forward(kc_, shape, head_weights(norm, embed), x_final, logits, workspace);
  }

 private:
  // The norm weight, then the output projection: lm_head after it in the unit, or the
  // embedding when tied. The same for gradients.
  lk::HeadWeights head_weights(const float* norm, const float* embed) const {
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  lk::HeadGrads head_weights(float* norm, float* embed) const {
    if (norm == nullptr) return {};  // the loss only (no gradients)
    return {norm, kc_.tie_word_embeddings ? embed : norm + kc_.n_embd};
  }
  lk::Config kc_;
};

}  // namespace

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

kernels::gpt2::Config gpt2_kernel_config(const ModelConfig& model) {
  kernels::gpt2::Config kc;
  kc.n_layer = model.n_layer;
  kc.n_head = model.n_head;
  kc.n_embd = model.n_embd;
  kc.vocab_size = model.vocab_size;
  kc.n_ctx = model.seq_len;
  return kc;
}

std::unique_ptr<const ModelDefinition> make_model_definition(const ModelConfig& config) {
  if (config.arch == "llama") return std::make_unique<Llama>(config);
  return std::make_unique<Gpt2>(config);
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
  if (m.arch != "llama") return keys;
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
  const std::vector<std::string> names = adapter_target_names(model.arch);
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
  if (model.arch != "gpt2" && model.arch != "llama")
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'model.arch' is '{}', not gpt2 or llama",
                                                      dir, model.arch));
  STRATA_ASSIGN_OR_RETURN(model.n_layer, metadata_integer(metadata, "model.n_layer", 1, 1024, dir));
  STRATA_ASSIGN_OR_RETURN(model.n_head, metadata_integer(metadata, "model.n_head", 1, 1024, dir));
  STRATA_ASSIGN_OR_RETURN(model.n_embd, metadata_integer(metadata, "model.n_embd", 8, 65536, dir));
  STRATA_ASSIGN_OR_RETURN(model.vocab_size, metadata_integer(metadata, "model.vocab_size", 2, 1 << 20, dir));
  STRATA_ASSIGN_OR_RETURN(model.seq_len, metadata_integer(metadata, "model.seq_len", 1, 1 << 16, dir));
  if (model.arch == "gpt2") {
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
  if (model.n_head % model.n_kv_head != 0 || model.head_dim % 2 != 0)
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata model.n_kv_head {} / model.head_dim {} do "
                                                      "not fit model.n_head {}", dir, model.n_kv_head, model.head_dim,
                                                      model.n_head));
  auto scaling = metadata.find("model.rope_scaling.type");
  if (scaling == metadata.end() || (scaling->second != "none" && scaling->second != "llama3"))
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata 'model.rope_scaling.type' is {}", dir,
                                                      scaling == metadata.end() ? "missing" : "'" + scaling->second + "'"));
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
