// strata/models/lora_fold.cpp — W + scale·B·A (models/lora_fold.h).
#include "models/lora_fold.h"

#include <algorithm>
#include <cassert>

#include <tbb/parallel_for.h>

namespace strata::models {

std::vector<AdaptedLinear> adapted_linears(const ModelLayout& layout, int64_t block_index) {
  assert(layout.has_adapters());
  std::vector<AdaptedLinear> out;
  const Unit& block = layout.units()[layout.block_unit(block_index)];
  const Unit& adapter = layout.units()[layout.adapter_unit(block_index)];
  // The adapter unit holds lora_A then lora_B per adapted linear, in adapter index order.
  for (size_t t = 0; t + 1 < adapter.tensors.size(); t += 2) {
    const UnitTensor& a = adapter.tensors[t];
    const UnitTensor& b = adapter.tensors[t + 1];
    assert(a.adapter_linear == b.adapter_linear && a.adapter_linear >= 0);
    AdaptedLinear entry;
    entry.linear = layout.definition().block_linears()[static_cast<size_t>(a.adapter_linear)];
    entry.weight_offset_elements = block.tensors[entry.linear.weight_tensor].offset_elements;
    entry.a_offset_elements = a.offset_elements;
    entry.b_offset_elements = b.offset_elements;
    out.push_back(entry);
  }
  return out;
}

void fold_lora(const BlockLinear& linear, uint32_t rank, double scale, const float* a, const float* b, float* weight) {
  const auto in = static_cast<uint64_t>(linear.in_features);
  const auto out = static_cast<uint64_t>(linear.out_features);
  const uint64_t r_count = rank;
  const auto s = static_cast<float>(scale);
  // A piece of one weight row at a time in a stack buffer: the inner loop runs over contiguous
  // elements (vectorizable), and each element's sum over r keeps its order.
  constexpr uint64_t kPiece = 64;
  if (!linear.conv1d) {
    // W [out, in]: row o, element i += s·Σ_r B[o, r]·A[r, i].
    tbb::parallel_for(uint64_t{0}, out, [&](uint64_t o) {
      float* row = weight + o * in;
      for (uint64_t i0 = 0; i0 < in; i0 += kPiece) {
        const uint64_t n = std::min(kPiece, in - i0);
        float delta[kPiece] = {};
        for (uint64_t r = 0; r < r_count; ++r) {
          const float bor = b[o * r_count + r];
          const float* a_row = a + r * in + i0;
          for (uint64_t k = 0; k < n; ++k) delta[k] += bor * a_row[k];
        }
        for (uint64_t k = 0; k < n; ++k) row[i0 + k] += s * delta[k];
      }
    });
    return;
  }
  // Conv1D W [in, out]: row i, element o += s·Σ_r B[o, r]·A[r, i].
  tbb::parallel_for(uint64_t{0}, in, [&](uint64_t i) {
    float* row = weight + i * out;
    for (uint64_t o0 = 0; o0 < out; o0 += kPiece) {
      const uint64_t n = std::min(kPiece, out - o0);
      float delta[kPiece] = {};
      for (uint64_t r = 0; r < r_count; ++r) {
        const float air = a[r * in + i];
        const float* b_col = b + o0 * r_count + r;
        for (uint64_t k = 0; k < n; ++k) delta[k] += b_col[k * r_count] * air;
      }
      for (uint64_t k = 0; k < n; ++k) row[o0 + k] += s * delta[k];
    }
  });
}

void fold_block_adapters(const ModelLayout& layout, const AdapterConfig& adapter, int64_t block_index,
                         const float* adapter_weights, float* block) {
  for (const AdaptedLinear& entry : adapted_linears(layout, block_index))
    fold_lora(entry.linear, adapter.rank, adapter.scale(), adapter_weights + entry.a_offset_elements,
              adapter_weights + entry.b_offset_elements, block + entry.weight_offset_elements);
}

}  // namespace strata::models
