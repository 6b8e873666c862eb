// strata/tests/reference/decode_layout.h — the decode workspace layout both reference models'
// decode kernels carve (gpt2_reference.h / llama_reference.h, "Decoding"): written once so the
// two agree. Internal to tests/reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"  // WorkspaceCarver

namespace strata::reference {

// A decode call's workspace: the model's block layout for the new rows (its attention scratch
// unused), then `score_floats` of attention scores (a row of max_positions per head).
template <class BlockLayout>
struct DecodeLayout {
  BlockLayout block;
  float* scores;
  size_t size_bytes;
};
template <class BlockLayout>
DecodeLayout<BlockLayout> decode_layout_after(const BlockLayout& block, int64_t score_floats, float* base) {
  kernels::WorkspaceCarver carve(base == nullptr ? nullptr : base + block.size_bytes / sizeof(float));
  float* scores = carve.take(score_floats);
  return DecodeLayout<BlockLayout>{block, scores, block.size_bytes + carve.used_bytes()};
}
// A head decode's scratch: one normed row and `statistics` one-float slices (mean, rstd); the
// logits go to the caller's buffer, so a 50k vocabulary needs no chunk × vocab scratch.
inline size_t head_decode_scratch_bytes(int64_t n_embd, int statistics) {
  kernels::WorkspaceCarver carve(nullptr);
  carve.take(n_embd);
  for (int i = 0; i < statistics; ++i) carve.take(1);
  return carve.used_bytes();
}

}  // namespace strata::reference
