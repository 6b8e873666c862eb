#include "models/model_layout.h"

#include <algorithm>
#include <cmath>

#include <tbb/parallel_for.h>

#include "common/mix.h"

namespace strata {

namespace {

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

ModelLayout::ModelLayout(const ModelConfig& model)
    : definition_(models::make_model_definition(model)), units_(definition_->units()) {
  const AdapterConfig& adapter = model.adapter;
  quant_layouts_.resize(units_.size());
  if (!adapter.enabled) return;
  for (Unit& unit : units_) unit.frozen = true;
  if (adapter.base_dtype == BaseDType::int8 || adapter.base_dtype == BaseDType::nf4) {
    const auto kind = adapter.base_dtype == BaseDType::nf4 ? kernels::quant::Kind::nf4 : kernels::quant::Kind::int8;
    for (int64_t block = 0; block < definition_->n_layer(); ++block) {
      const size_t u = definition_->block_unit(block);
      std::vector<kernels::quant::TensorPlan> plans;
      for (const UnitTensor& tensor : units_[u].tensors)
        plans.push_back({tensor.element_count, tensor.shape.size() == 2});
      quant_layouts_[u] = kernels::quant::make_unit_layout(kind, plans, adapter.double_quant);
    }
  }
  const auto rank = static_cast<int64_t>(adapter.rank);
  for (int64_t block = 0; block < definition_->n_layer(); ++block) {
    const Unit& base = units_[definition_->block_unit(block)];
    Unit unit;
    unit.name = "lora." + base.name;
    unit.adapter_block = block;
    auto add = [&](std::string name, std::vector<int64_t> shape, double bound, int linear) {
      UnitTensor tensor;
      tensor.name = std::move(name);
      tensor.shape = std::move(shape);
      tensor.element_count = static_cast<uint64_t>(tensor.shape[0] * tensor.shape[1]);
      tensor.offset_elements = unit.element_count;
      tensor.weight_decay = true;  // 2-D, as the HF Trainer decays every non-bias, non-norm weight
      tensor.init_bound = bound;
      tensor.adapter_linear = linear;
      unit.element_count += tensor.element_count;
      unit.tensors.push_back(std::move(tensor));
    };
    for (const BlockLinear& linear : definition_->block_linears()) {
      if (!models::adapter_targets_linear(adapter.targets, linear)) continue;
      std::string stem = base.tensors[linear.weight_tensor].name;
      stem.resize(stem.size() - std::string(".weight").size());
      add(stem + ".lora_A.weight", {rank, linear.in_features}, 1.0 / std::sqrt(static_cast<double>(linear.in_features)),
          linear.index);
      add(stem + ".lora_B.weight", {linear.out_features, rank}, 0.0, linear.index);
    }
    adapter_units_.push_back(units_.size());
    units_.push_back(std::move(unit));
  }
}

uint64_t ModelLayout::parameter_count() const {
  uint64_t count = 0;
  for (const Unit& unit : units()) count += unit.element_count;
  return count;
}

kernels::lora::BlockAdapters ModelLayout::bind_adapters(int64_t block_index, const float* weights, float* grads,
                                                        float dropout, uint64_t mask_key,
                                                        const kernels::Workspace& scratch) const {
  const AdapterConfig& config = definition_->config().adapter;
  kernels::lora::BlockAdapters adapters;
  adapters.spec.rank = config.rank;
  adapters.spec.scale = static_cast<float>(config.scale());
  adapters.spec.dropout = dropout;
  adapters.mask_key = mask_key;
  adapters.scratch = scratch;
  // Each targeted linear's lora_A then lora_B (the layout's order, above).
  for (const UnitTensor& tensor : units_[adapter_unit(block_index)].tensors) {
    const auto linear = static_cast<size_t>(tensor.adapter_linear);
    const bool is_a = tensor.name.ends_with(".lora_A.weight");
    (is_a ? adapters.adapters[linear].a : adapters.adapters[linear].b) = weights + tensor.offset_elements;
    if (grads != nullptr) (is_a ? adapters.grads[linear].d_a : adapters.grads[linear].d_b) = grads + tensor.offset_elements;
  }
  return adapters;
}

const kernels::quant::UnitLayout* ModelLayout::quant_layout(size_t unit) const {
  return unit < quant_layouts_.size() && quant_layouts_[unit] ? &*quant_layouts_[unit] : nullptr;
}

uint64_t ModelLayout::frozen_params_bytes(size_t unit) const {
  if (const kernels::quant::UnitLayout* layout = quant_layout(unit)) return layout->size_bytes;
  const bool fp32 = definition_->config().adapter.base_dtype == BaseDType::fp32;
  return units_[unit].element_count * (fp32 ? 4 : 2);
}

uint64_t ModelLayout::trainable_parameter_count() const {
  uint64_t count = 0;
  for (const Unit& unit : units())
    if (!unit.frozen) count += unit.element_count;
  return count;
}

uint64_t ModelLayout::largest_unit_elements() const {
  uint64_t largest = 0;
  for (const Unit& unit : units()) largest = std::max(largest, unit.element_count);
  return largest;
}

void ModelLayout::initialize_unit(size_t unit_index, uint64_t seed, float* out) const {
  const Unit& unit = units()[unit_index];
  for (const UnitTensor& tensor : unit.tensors) {
    float* values = out + tensor.offset_elements;
    if (tensor.init_bound > 0.0) {
      // U(-bound, bound) from the same counter-based key: 24 bits of the hash, as torch's
      // uniform_ draws a float.
      const uint64_t key = splitmix64(seed) ^ hash_name(tensor.name);
      const double bound = tensor.init_bound;
      for (uint64_t i = 0; i < tensor.element_count; ++i) {
        const double u = static_cast<double>(splitmix64(key ^ splitmix64(i)) >> 40) * 0x1.0p-24;  // [0, 1)
        values[i] = static_cast<float>((2.0 * u - 1.0) * bound);
      }
      continue;
    }
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

}  // namespace strata
