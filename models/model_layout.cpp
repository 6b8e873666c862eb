#include "models/model_layout.h"

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

ModelLayout::ModelLayout(const ModelConfig& model) : definition_(models::make_model_definition(model)) {}

uint64_t ModelLayout::parameter_count() const {
  uint64_t count = 0;
  for (const Unit& unit : units()) count += unit.element_count;
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
