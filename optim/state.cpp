#include "optim/state.h"

#include <algorithm>

namespace strata::optim {

std::optional<Kind> kind_named(std::string_view name) {
  if (name == "adamw") return Kind::adamw;
  return std::nullopt;
}

const char* StateLayout::name() const {
  switch (kind_) {
    case Kind::adamw: return "adamw";
  }
  return "?";
}

uint64_t StateLayout::chunk_bytes(uint64_t count) const { return count * bytes_per_element(); }

uint64_t StateLayout::bytes_per_element() const {
  switch (kind_) {
    case Kind::adamw: return 3 * sizeof(float);
  }
  return 0;
}

DType StateLayout::store_dtype() const { return DType::f32; }

std::vector<int64_t> StateLayout::store_shape(uint64_t count) const { return {3, static_cast<int64_t>(count)}; }

void StateLayout::initialize(const float* master, uint64_t count, std::byte* chunk) const {
  float* out = this->master(chunk);
  std::copy(master, master + count, out);
  std::fill(out + count, out + 3 * count, 0.0f);
}

void StateLayout::update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                                uint64_t begin, uint64_t count, std::byte* chunk, const float* grads, uint16_t* copy,
                                std::vector<kernels::AdamWChunk>& pieces) const {
  pieces.clear();
  kernels::AdamWConfig config = hyper;
  const auto t = static_cast<int64_t>(step + 1);
  const kernels::AdamWStepScalars decayed = kernels::adamw_step_scalars(config, t);
  config.weight_decay = 0.0;
  const kernels::AdamWStepScalars undecayed = kernels::adamw_step_scalars(config, t);
  float* master = this->master(chunk);
  for (const TensorSpan& tensor : tensors) {
    const uint64_t first = std::max(begin, tensor.offset_elements);
    const uint64_t last = std::min(begin + count, tensor.offset_elements + tensor.element_count);
    if (first >= last) continue;
    const uint64_t local = first - begin;  // within the chunk
    kernels::AdamWChunk piece;
    piece.scalars = tensor.weight_decay ? decayed : undecayed;
    piece.params = master + local;
    piece.grads = grads + local;
    piece.exp_avg = master + count + local;
    piece.exp_avg_sq = master + 2 * count + local;
    piece.count = last - first;
    if (copy != nullptr) {
      piece.copy_dtype = DType::bf16;
      piece.copy = copy + local;
    }
    pieces.push_back(piece);
  }
}

}  // namespace strata::optim
