#include "engine/model_layout.h"

#include <algorithm>
#include <cmath>

#include <tbb/parallel_for.h>

namespace strata {

namespace {

uint64_t splitmix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

uint64_t hash_name(const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return hash;
}

// A standard normal from two uniforms derived from (key, index): Box–Muller in double.
float normal_at(uint64_t key, uint64_t index) {
  uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

ModelLayout::ModelLayout(const ModelConfig& model) {
  kernel_config_.n_layer = model.n_layer;
  kernel_config_.n_head = model.n_head;
  kernel_config_.n_embd = model.n_embd;
  kernel_config_.vocab_size = model.vocab_size;
  kernel_config_.n_ctx = model.seq_len;
  const double residual_std = model.init_std / std::sqrt(2.0 * model.n_layer);

  auto add_tensor = [](Unit& unit, std::string name, const kernels::gpt2::ParamSpec& spec,
                       double std_dev, float value) {
    UnitTensor tensor;
    tensor.name = std::move(name);
    tensor.shape = spec.rank == 1 ? std::vector<int64_t>{spec.shape[0]}
                                  : std::vector<int64_t>{spec.shape[0], spec.shape[1]};
    tensor.element_count = static_cast<uint64_t>(spec.numel());
    tensor.offset_elements = unit.element_count;
    tensor.weight_decay = spec.weight_decay;
    tensor.init_std = std_dev;
    tensor.init_value = value;
    unit.element_count += tensor.element_count;
    unit.tensors.push_back(std::move(tensor));
  };
  auto outer = kernels::gpt2::outer_param_specs(kernel_config_);  // wte, wpe, ln_f.w, ln_f.b

  Unit embed{"embed", -1, {}, 0};
  add_tensor(embed, std::string(outer[0].name_suffix), outer[0], model.init_std, 0.0f);
  add_tensor(embed, std::string(outer[1].name_suffix), outer[1], model.init_std, 0.0f);
  units_.push_back(std::move(embed));

  auto block_specs = kernels::gpt2::block_param_specs(kernel_config_);
  for (int64_t layer = 0; layer < kernel_config_.n_layer; ++layer) {
    Unit block{"h." + std::to_string(layer), layer, {}, 0};
    for (const auto& spec : block_specs) {
      std::string_view suffix = spec.name_suffix;
      bool is_layer_norm_weight = suffix.starts_with("ln_") && suffix.ends_with(".weight");
      bool is_bias = suffix.ends_with(".bias");
      bool is_residual_projection = suffix.ends_with("c_proj.weight");
      double std_dev = is_bias || is_layer_norm_weight ? 0.0
                       : is_residual_projection         ? residual_std
                                                        : model.init_std;
      add_tensor(block, kernels::gpt2::block_param_name(layer, suffix), spec, std_dev,
                 is_layer_norm_weight ? 1.0f : 0.0f);
    }
    units_.push_back(std::move(block));
  }

  Unit ln_f{"ln_f", -1, {}, 0};
  add_tensor(ln_f, std::string(outer[2].name_suffix), outer[2], 0.0, 1.0f);
  add_tensor(ln_f, std::string(outer[3].name_suffix), outer[3], 0.0, 0.0f);
  units_.push_back(std::move(ln_f));
}

uint64_t ModelLayout::parameter_count() const {
  uint64_t count = 0;
  for (const Unit& unit : units_) count += unit.element_count;
  return count;
}

uint64_t ModelLayout::largest_unit_elements() const {
  uint64_t largest = 0;
  for (const Unit& unit : units_) largest = std::max(largest, unit.element_count);
  return largest;
}

void ModelLayout::initialize_unit(size_t unit_index, uint64_t seed, float* out) const {
  const Unit& unit = units_[unit_index];
  for (const UnitTensor& tensor : unit.tensors) {
    float* values = out + tensor.offset_elements;
    if (tensor.init_std == 0.0) {
      std::fill(values, values + tensor.element_count, tensor.init_value);
      continue;
    }
    const uint64_t key = splitmix64(seed) ^ hash_name(tensor.name);
    const auto std_dev = static_cast<float>(tensor.init_std);
    tbb::parallel_for(tbb::blocked_range<uint64_t>(0, tensor.element_count, 1 << 16),
                      [&](const tbb::blocked_range<uint64_t>& range) {
                        for (uint64_t i = range.begin(); i < range.end(); ++i) values[i] = std_dev * normal_at(key, i);
                      });
  }
}

std::vector<ElementRange> optim_chunks(const Unit& unit, uint64_t chunk_elements) {
  const uint64_t n = unit.element_count;
  const uint64_t chunks = std::max<uint64_t>(1, (n + chunk_elements - 1) / chunk_elements);
  std::vector<ElementRange> ranges;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = n * c / chunks;
    const uint64_t end = n * (c + 1) / chunks;
    ranges.push_back(ElementRange{begin, end - begin});
  }
  return ranges;
}

}  // namespace strata
