// strata/optim/state.h — the optimizer owns its state: how one chunk of a unit's parameters is
// packed (in the store, in host or device memory: the same bytes), how a chunk starts, where its
// master weights lie, and how a chunk's update is cut into kernel calls.
//
// Why one authority: before this room, "12 bytes an element, packed [master | m | v]" was
// written out in train_config (chunk size for the budgets), train_plan (tensor sizes), zero
// (bytes per rank), step_model (timing), trainer (init, update, export) and read back by
// position. Each of those now asks a StateLayout, so an optimizer with another layout — AdamW
// with 8-bit block-wise moments (issue 32) — is one new Kind here, not a change in seven files.
//
// Layouts:
//   adamw  one fp32 store tensor of shape {3, count}: [master | exp_avg | exp_avg_sq], each
//          `count` floats; 12 bytes an element; any count (no alignment).
//
// Threads: a StateLayout is a value; every function is const and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/optim/adamw.h"

namespace strata::optim {

enum class Kind : uint8_t { adamw };
// The kind a name (StateLayout::name, as a store's metadata records it) stands for; none if unknown.
std::optional<Kind> kind_named(std::string_view name);

// One tensor of a unit as the update sees it: where it lies in the unit and whether weight
// decay applies to it (2-D weights decay, norms and biases do not — the model's rule).
struct TensorSpan {
  uint64_t offset_elements = 0;
  uint64_t element_count = 0;
  bool weight_decay = false;
};

class StateLayout {
 public:
  explicit StateLayout(Kind kind = Kind::adamw) : kind_(kind) {}

  Kind kind() const { return kind_; }
  const char* name() const;

  // Bytes one chunk of `count` elements occupies, in the store and in memory alike.
  uint64_t chunk_bytes(uint64_t count) const;
  // For sizing before chunks are cut (budgets, plans): the bytes an element costs on average.
  uint64_t bytes_per_element() const;
  // The store tensor of a chunk: its dtype and shape (what `strata store` lists).
  DType store_dtype() const;
  std::vector<int64_t> store_shape(uint64_t count) const;

  // A fresh chunk in `chunk` (chunk_bytes(count) bytes): master = `master[0, count)`, the
  // moments zero (torch's state at step 0).
  void initialize(const float* master, uint64_t count, std::byte* chunk) const;
  // The master weights of a chunk: its first `count` floats in every layout.
  float* master(std::byte* chunk) const { return reinterpret_cast<float*>(chunk); }
  const float* master(const std::byte* chunk) const { return reinterpret_cast<const float*>(chunk); }

  // The update of one chunk — elements [begin, begin + count) of a unit whose tensors are
  // `tensors` — as kernel calls: one per tensor overlapping the chunk, each with its own decay
  // rule, at `step` (0-based: torch's step is step + 1). `grads` and `copy` (the bf16 compute
  // copy, or null) point at the chunk's first element. Appends to `pieces` (cleared first), so
  // a caller that keeps the vector allocates once.
  void update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                     uint64_t begin, uint64_t count, std::byte* chunk, const float* grads, uint16_t* copy,
                     std::vector<kernels::AdamWChunk>& pieces) const;

 private:
  Kind kind_;
};

}  // namespace strata::optim
