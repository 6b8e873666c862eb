// strata/optim/state.h — the optimizer owns its state: how one chunk of a unit's parameters is
// packed (in the store, in host or device memory: the same bytes), where a chunk may be cut, how
// a chunk starts, where its master weights lie, how a chunk's update is cut into kernel calls,
// and what a store records to reopen it.
//
// Why one authority: before this room, "12 bytes an element, packed [master | m | v]" was
// written out in train_config (chunk size for the budgets), train_plan (tensor sizes), zero
// (bytes per rank), step_model (timing), trainer (init, update, export) and read back by
// position. Each of those now asks a StateLayout, so an optimizer with another layout is one
// new Kind here, not a change in seven files.
//
// Layouts (a chunk is elements [begin, begin + count) of a unit whose tensors are `tensors`; a
// "piece" is the part of one unit tensor inside the chunk):
//   adamw      one fp32 store tensor of shape {3, count}: [master | exp_avg | exp_avg_sq], each
//              `count` floats; 12 bytes an element; any count, cut anywhere (no alignment).
//   adamw8bit  bitsandbytes' AdamW8bit (kernels/optim/adamw8bit.h): one store tensor of
//              chunk_bytes/4 fp32 words (the store has no byte dtype; the words are a packed
//              blob, never read as floats beyond the master), laid out as
//                [master f32 × count | state of piece 0 | state of piece 1 | ...]
//              where each piece of k elements is either
//                8-bit: [absmax_m f32 × b | absmax_v f32 × b | m codes u8 × k | v codes u8 × k
//                        | zero pad to a multiple of 4 bytes],  b = ceil(k / block_elements)
//                fp32:  [m f32 × k | v f32 × k]
//              so every piece's state starts 4-byte aligned (the absmax and fp32 moments are
//              float arrays) and the chunk's size is a multiple of 4.
//              Blocks restart at each tensor's first element, as bitsandbytes quantises each
//              parameter tensor on its own: the kernel counts blocks from its call's first
//              element, so each 8-bit piece is one call, and a chunk may only be cut INSIDE an
//              8-bit tensor at a multiple of block_elements from that tensor's start
//              (snap_cut; optim_chunks asks it), which makes every piece's blocks the tensor's
//              blocks and a tensor's state independent of the chunk size. Which tensors are
//              8-bit (eight_bit): those of at least min_8bit_elements elements (bitsandbytes'
//              min_8bit_size), except the token embedding when embedding_fp32 (bitsandbytes'
//              StableEmbedding advice); the others keep fp32 moments in the same chunk. A piece
//              carries its tensor's kind, so a chunk may mix both.
//
// Store metadata (record / from_metadata): `optim_state` (the kind's name) and, for adamw8bit,
// `optim_block_elements`, `optim_min_8bit_elements`, `optim_embedding_state` (fp32 | 8bit):
// what it takes to reopen the bytes for resume, export and re-slicing. A store without
// `optim_state` predates the seam and is adamw.
//
// Threads: a StateLayout is a value; every function is const and thread-safe. Nothing allocates
// except store_shape, record and from_metadata (start-up paths).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"

namespace strata::optim {

enum class Kind : uint8_t { adamw, adamw8bit };
// The kind a name (StateLayout::name, as a store's metadata and a config's optimizer.kind
// spell it) stands for; none if unknown.
std::optional<Kind> kind_named(std::string_view name);

// One tensor of a unit as the update sees it: where it lies in the unit, whether weight decay
// applies to it (2-D weights decay, norms and biases do not — the model's rule), and whether
// it is the token embedding (the one a StableEmbedding would be: optimizer.embedding_state).
struct TensorSpan {
  uint64_t offset_elements = 0;
  uint64_t element_count = 0;
  bool weight_decay = false;
  bool token_embedding = false;
};

// The 8-bit kind's rules (config keys optimizer.block_size, min_8bit_size, embedding_state).
struct EightBitRules {
  uint32_t block_elements = kernels::kAdamW8bitBlockElements;  // a power of two in [64, 4096]
  uint64_t min_8bit_elements = kernels::kAdamW8bitMinElements;
  bool embedding_fp32 = false;
  bool operator==(const EightBitRules&) const = default;
};

class StateLayout {
 public:
  explicit StateLayout(Kind kind = Kind::adamw, EightBitRules rules = {}) : kind_(kind), rules_(rules) {}

  Kind kind() const { return kind_; }
  const char* name() const;
  const EightBitRules& rules() const { return rules_; }
  // Same bytes for the same chunk: the kind and, for adamw8bit, its rules.
  bool operator==(const StateLayout& other) const {
    return kind_ == other.kind_ && (kind_ == Kind::adamw || rules_ == other.rules_);
  }
  // The layout's description for a message: "adamw", "adamw8bit (block 256, ...)".
  std::string describe() const;

  // Whether `tensor`'s moments are 8-bit under this layout (never for adamw).
  bool eight_bit(const TensorSpan& tensor) const;
  // The largest cut at or below `position` (0 < position < unit size) a chunk may end at: any
  // position, except inside an 8-bit tensor where it snaps down to a block boundary of it.
  uint64_t snap_cut(std::span<const TensorSpan> tensors, uint64_t position) const;

  // Bytes of the chunk [begin, begin + count) of a unit with `tensors`, in the store and in
  // memory alike (exact).
  uint64_t chunk_bytes(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count) const;
  // For sizing before chunks are cut (budgets, plans): the bytes an element costs on average
  // where the layout's compact form applies (adamw: 12; adamw8bit: an 8-bit element's
  // 4 + 2 + 8 / block_elements). A chunk of fp32-moment tensors under adamw8bit costs 12.
  double bytes_per_element() const;
  // The store tensor of a chunk: its dtype and shape (what `strata store` lists).
  DType store_dtype() const { return DType::f32; }
  std::vector<int64_t> store_shape(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count) const;

  // A fresh chunk in `chunk` (chunk_bytes bytes): master = `master[0, count)` (the chunk's
  // elements), the moments zero (torch's and bitsandbytes' state at step 0), padding zero.
  void initialize(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count, const float* master,
                  std::byte* chunk) const;
  // The master weights of a chunk: its first `count` floats in every layout.
  float* master(std::byte* chunk) const { return reinterpret_cast<float*>(chunk); }
  const float* master(const std::byte* chunk) const { return reinterpret_cast<const float*>(chunk); }

  // The update of one chunk — elements [begin, begin + count) of a unit whose tensors are
  // `tensors` — as kernel calls: one per tensor overlapping the chunk, each with its own decay
  // rule and moment kind (an 8-bit piece sets AdamWChunk's 8-bit fields), at `step` (0-based:
  // torch's step is step + 1). `grads` and `copy` (the bf16 compute copy, or null) point at the
  // chunk's first element. Appends to `pieces` (cleared first), so a caller that keeps the
  // vector allocates once.
  void update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                     uint64_t begin, uint64_t count, std::byte* chunk, const float* grads, uint16_t* copy,
                     std::vector<kernels::AdamWChunk>& pieces) const;

  // --- the state alone, for an embedder that keeps the master weights itself (the C API's
  // strata_adamw: the caller's fp32 buffer is the master) ---------------------------------------
  // A chunk's state is its bytes after the master: chunk_bytes - 4 * count bytes, laid out as
  // above ([m | v] for adamw, the pieces' states for adamw8bit), a multiple of 4.
  uint64_t state_bytes(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count) const;
  // A fresh state (moments zero, padding zero), as initialize writes after the master.
  void initialize_state(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count, std::byte* state) const;
  // update_pieces with the master at `master` (count floats) and the state at `state`.
  void update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                     uint64_t begin, uint64_t count, float* master, std::byte* state, const float* grads,
                     uint16_t* copy, std::vector<kernels::AdamWChunk>& pieces) const;
  // The moments of a chunk as fp32, `count` floats each: fp32 pieces copied, 8-bit ones
  // dequantised (code value × block absmax, what the next step reads back).
  void read_moments(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count, const std::byte* state,
                    float* exp_avg, float* exp_avg_sq) const;
  // The reverse: fp32 pieces copied, 8-bit ones requantised as the step quantises (absmax per
  // block, nearest code; kernels::adamw8bit_quantize, whose round trip is exact but for blocks
  // whose largest |m| is negative). Values must be finite for 8-bit pieces (asserted).
  void write_moments(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count, const float* exp_avg,
                     const float* exp_avg_sq, std::byte* state) const;

  // The store metadata that reopens this layout (see the header), added to `metadata`.
  void record(std::map<std::string, std::string>& metadata) const;
  // The layout a store's committed metadata records; `dir` names the store in errors (corrupt
  // when a key is present but not one this strata can read).
  [[nodiscard]] static Result<StateLayout> from_metadata(const std::map<std::string, std::string>& metadata,
                                                         const std::string& dir);

 private:
  Kind kind_;
  EightBitRules rules_;
};

}  // namespace strata::optim
