#include "optim/state.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace strata::optim {

namespace {

constexpr uint64_t round_up4(uint64_t bytes) { return (bytes + 3) & ~uint64_t{3}; }

// One piece of a chunk under adamw8bit: the part of one tensor inside it, where it starts in
// the chunk (elements) and where its state starts (bytes from the start of the chunk's state,
// i.e. from the end of its master weights).
struct Piece {
  const TensorSpan* tensor = nullptr;
  uint64_t local_elements = 0;  // first element, counted from the chunk's first
  uint64_t count = 0;
  bool eight_bit = false;
  uint64_t state_offset_bytes = 0;
  uint64_t state_bytes = 0;
};

uint64_t piece_state_bytes(bool eight_bit, uint64_t count, uint32_t block_elements) {
  if (!eight_bit) return 2 * sizeof(float) * count;
  return 2 * sizeof(float) * kernels::adamw8bit_block_count(count, block_elements) + round_up4(2 * count);
}

// Calls `visit(piece)` for each piece of the chunk, in unit order (no allocation: update_pieces
// runs per chunk per step).
template <class Visit>
void for_each_piece(const StateLayout& layout, std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count,
                    Visit&& visit) {
  uint64_t state_offset = 0;
  for (const TensorSpan& tensor : tensors) {
    const uint64_t first = std::max(begin, tensor.offset_elements);
    const uint64_t last = std::min(begin + count, tensor.offset_elements + tensor.element_count);
    if (first >= last) continue;
    Piece piece;
    piece.tensor = &tensor;
    piece.local_elements = first - begin;
    piece.count = last - first;
    piece.eight_bit = layout.eight_bit(tensor);
    piece.state_offset_bytes = state_offset;
    piece.state_bytes = piece_state_bytes(piece.eight_bit, piece.count, layout.rules().block_elements);
    state_offset += piece.state_bytes;
    visit(piece);
  }
}

// The 8-bit state views of a piece (its layout in the header): `state` is the chunk's state
// (what follows its master weights), `master` the chunk's first master weight.
kernels::AdamW8bitState eight_bit_state(float* master_chunk, std::byte* state, const Piece& piece,
                                        uint32_t block_elements) {
  const size_t blocks = kernels::adamw8bit_block_count(piece.count, block_elements);
  std::byte* base = state + piece.state_offset_bytes;
  auto* absmax_m = reinterpret_cast<float*>(base);
  auto* codes_m = reinterpret_cast<uint8_t*>(base + 2 * sizeof(float) * blocks);
  float* master = master_chunk + piece.local_elements;
  return kernels::AdamW8bitState{std::span<float>(master, piece.count),
                                 std::span<uint8_t>(codes_m, piece.count),
                                 std::span<uint8_t>(codes_m + piece.count, piece.count),
                                 std::span<float>(absmax_m, blocks),
                                 std::span<float>(absmax_m + blocks, blocks),
                                 block_elements};
}

}  // namespace

std::optional<Kind> kind_named(std::string_view name) {
  if (name == "adamw") return Kind::adamw;
  if (name == "adamw8bit") return Kind::adamw8bit;
  return std::nullopt;
}

const char* StateLayout::name() const {
  switch (kind_) {
    case Kind::adamw: return "adamw";
    case Kind::adamw8bit: return "adamw8bit";
  }
  return "?";
}

std::string StateLayout::describe() const {
  if (kind_ == Kind::adamw) return name();
  return fmt::format("adamw8bit (block_size {}, min_8bit_size {}, embedding_state {})", rules_.block_elements,
                     rules_.min_8bit_elements, rules_.embedding_fp32 ? "fp32" : "8bit");
}

bool StateLayout::eight_bit(const TensorSpan& tensor) const {
  if (kind_ != Kind::adamw8bit) return false;
  if (tensor.token_embedding && rules_.embedding_fp32) return false;
  return kernels::adamw8bit_applies(tensor.element_count, rules_.min_8bit_elements);
}

uint64_t StateLayout::snap_cut(std::span<const TensorSpan> tensors, uint64_t position) const {
  if (kind_ == Kind::adamw) return position;
  for (const TensorSpan& tensor : tensors) {
    if (position <= tensor.offset_elements || position >= tensor.offset_elements + tensor.element_count) continue;
    if (!eight_bit(tensor)) return position;
    const uint64_t inside = position - tensor.offset_elements;
    return tensor.offset_elements + inside / rules_.block_elements * rules_.block_elements;
  }
  return position;
}

uint64_t StateLayout::chunk_bytes(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count) const {
  return sizeof(float) * count + state_bytes(tensors, begin, count);
}

uint64_t StateLayout::state_bytes(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count) const {
  if (kind_ == Kind::adamw) return 2 * sizeof(float) * count;
  uint64_t bytes = 0;
  for_each_piece(*this, tensors, begin, count, [&](const Piece& piece) { bytes += piece.state_bytes; });
  return bytes;
}

double StateLayout::bytes_per_element() const {
  if (kind_ == Kind::adamw) return 3.0 * sizeof(float);
  return sizeof(float) + 2.0 + 2.0 * sizeof(float) / rules_.block_elements;
}

std::vector<int64_t> StateLayout::store_shape(std::span<const TensorSpan> tensors, uint64_t begin,
                                              uint64_t count) const {
  if (kind_ == Kind::adamw) return {3, static_cast<int64_t>(count)};
  return {static_cast<int64_t>(chunk_bytes(tensors, begin, count) / sizeof(float))};
}

void StateLayout::initialize(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count,
                             const float* master, std::byte* chunk) const {
  float* out = this->master(chunk);
  std::copy(master, master + count, out);
  initialize_state(tensors, begin, count, chunk + sizeof(float) * count);
}

void StateLayout::initialize_state(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count,
                                   std::byte* state) const {
  // Moments, absmax and padding zero first, so the store's bytes depend on nothing else.
  std::memset(state, 0, state_bytes(tensors, begin, count));
  if (kind_ == Kind::adamw) return;
  // adamw8bit_init's zero state without its master span (an embedder's master lies elsewhere):
  // absmax 0 and v's codes 0 are the memset's; m's codes are the signed table's +0.
  for_each_piece(*this, tensors, begin, count, [&](const Piece& piece) {
    if (!piece.eight_bit) return;
    const size_t blocks = kernels::adamw8bit_block_count(piece.count, rules_.block_elements);
    std::memset(state + piece.state_offset_bytes + 2 * sizeof(float) * blocks, kernels::kDynamicCodeSignedZero,
                piece.count);
  });
}

void StateLayout::update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                                uint64_t begin, uint64_t count, std::byte* chunk, const float* grads, uint16_t* copy,
                                std::vector<kernels::AdamWChunk>& pieces) const {
  update_pieces(hyper, step, tensors, begin, count, master(chunk), chunk + sizeof(float) * count, grads, copy, pieces);
}

void StateLayout::update_pieces(const kernels::AdamWConfig& hyper, uint64_t step, std::span<const TensorSpan> tensors,
                                uint64_t begin, uint64_t count, float* master, std::byte* state, const float* grads,
                                uint16_t* copy, std::vector<kernels::AdamWChunk>& pieces) const {
  pieces.clear();
  kernels::AdamWConfig config = hyper;
  const auto t = static_cast<int64_t>(step + 1);
  const kernels::AdamWStepScalars decayed = kernels::adamw_step_scalars(config, t);
  config.weight_decay = 0.0;
  const kernels::AdamWStepScalars undecayed = kernels::adamw_step_scalars(config, t);
  auto base_piece = [&](const TensorSpan& tensor, uint64_t local, uint64_t piece_count) {
    kernels::AdamWChunk piece;
    piece.scalars = tensor.weight_decay ? decayed : undecayed;
    piece.params = master + local;
    piece.grads = grads + local;
    piece.count = piece_count;
    if (copy != nullptr) {
      piece.copy_dtype = DType::bf16;
      piece.copy = copy + local;
    }
    return piece;
  };
  if (kind_ == Kind::adamw) {
    auto* moments = reinterpret_cast<float*>(state);
    for (const TensorSpan& tensor : tensors) {
      const uint64_t first = std::max(begin, tensor.offset_elements);
      const uint64_t last = std::min(begin + count, tensor.offset_elements + tensor.element_count);
      if (first >= last) continue;
      const uint64_t local = first - begin;  // within the chunk
      kernels::AdamWChunk piece = base_piece(tensor, local, last - first);
      piece.exp_avg = moments + local;
      piece.exp_avg_sq = moments + count + local;
      pieces.push_back(piece);
    }
    return;
  }
  for_each_piece(*this, tensors, begin, count, [&](const Piece& p) {
    kernels::AdamWChunk piece = base_piece(*p.tensor, p.local_elements, p.count);
    if (p.eight_bit) {
      const kernels::AdamW8bitState views = eight_bit_state(master, state, p, rules_.block_elements);
      piece.block_elements = rules_.block_elements;
      piece.exp_avg_codes = views.exp_avg_codes.data();
      piece.exp_avg_sq_codes = views.exp_avg_sq_codes.data();
      piece.exp_avg_absmax = views.exp_avg_absmax.data();
      piece.exp_avg_sq_absmax = views.exp_avg_sq_absmax.data();
    } else {
      auto* moments = reinterpret_cast<float*>(state + p.state_offset_bytes);
      piece.exp_avg = moments;
      piece.exp_avg_sq = moments + p.count;
    }
    pieces.push_back(piece);
  });
}

void StateLayout::read_moments(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count,
                               const std::byte* state, float* exp_avg, float* exp_avg_sq) const {
  if (kind_ == Kind::adamw) {
    const auto* moments = reinterpret_cast<const float*>(state);
    std::copy(moments, moments + count, exp_avg);
    std::copy(moments + count, moments + 2 * count, exp_avg_sq);
    return;
  }
  // The views are mutable spans; dequantising only reads them. Their master span is the output
  // (sized `count`, never touched): the kernel's shape check needs one.
  auto* bytes = const_cast<std::byte*>(state);
  for_each_piece(*this, tensors, begin, count, [&](const Piece& p) {
    float* m = exp_avg + p.local_elements;
    float* v = exp_avg_sq + p.local_elements;
    if (p.eight_bit) {
      kernels::adamw8bit_dequantize(eight_bit_state(exp_avg, bytes, p, rules_.block_elements), {m, p.count},
                                    {v, p.count});
    } else {
      const auto* moments = reinterpret_cast<const float*>(state + p.state_offset_bytes);
      std::copy(moments, moments + p.count, m);
      std::copy(moments + p.count, moments + 2 * p.count, v);
    }
  });
}

void StateLayout::write_moments(std::span<const TensorSpan> tensors, uint64_t begin, uint64_t count,
                                const float* exp_avg, const float* exp_avg_sq, std::byte* state) const {
  if (kind_ == Kind::adamw) {
    auto* moments = reinterpret_cast<float*>(state);
    std::copy(exp_avg, exp_avg + count, moments);
    std::copy(exp_avg_sq, exp_avg_sq + count, moments + count);
    return;
  }
  initialize_state(tensors, begin, count, state);  // padding zero, as a fresh chunk's
  // The master span of the views is never written by quantising; exp_avg's address stands in.
  auto* no_master = const_cast<float*>(exp_avg);
  for_each_piece(*this, tensors, begin, count, [&](const Piece& p) {
    const float* m = exp_avg + p.local_elements;
    const float* v = exp_avg_sq + p.local_elements;
    if (p.eight_bit) {
      kernels::adamw8bit_quantize(eight_bit_state(no_master, state, p, rules_.block_elements), {m, p.count},
                                  {v, p.count});
    } else {
      auto* moments = reinterpret_cast<float*>(state + p.state_offset_bytes);
      std::copy(m, m + p.count, moments);
      std::copy(v, v + p.count, moments + p.count);
    }
  });
}

void StateLayout::record(std::map<std::string, std::string>& metadata) const {
  metadata["optim_state"] = name();
  if (kind_ != Kind::adamw8bit) return;
  metadata["optim_block_elements"] = std::to_string(rules_.block_elements);
  metadata["optim_min_8bit_elements"] = std::to_string(rules_.min_8bit_elements);
  metadata["optim_embedding_state"] = rules_.embedding_fp32 ? "fp32" : "8bit";
}

namespace {

// A whole decimal number in [min, max] from untrusted metadata, or none.
std::optional<uint64_t> parse_bounded(const std::string& text, uint64_t min, uint64_t max) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (value < min || value > max) return std::nullopt;
  return value;
}

}  // namespace

Result<StateLayout> StateLayout::from_metadata(const std::map<std::string, std::string>& metadata,
                                               const std::string& dir) {
  auto it = metadata.find("optim_state");
  if (it == metadata.end()) return StateLayout(Kind::adamw);
  const std::optional<Kind> kind = kind_named(it->second);
  if (!kind)
    return make_error(ErrorKind::corrupt,
                      fmt::format("store {}: metadata 'optim_state' is '{}', an optimizer this strata does not know", dir,
                                  it->second));
  if (*kind == Kind::adamw) return StateLayout(Kind::adamw);
  auto bad = [&](const char* key, const std::string& value) {
    return make_error(ErrorKind::corrupt, fmt::format("store {}: metadata '{}' is '{}', not a value adamw8bit state "
                                                      "can have",
                                                      dir, key, value));
  };
  auto read = [&](const char* key) -> std::string {
    auto found = metadata.find(key);
    return found == metadata.end() ? std::string("(missing)") : found->second;
  };
  EightBitRules rules;
  const std::string block = read("optim_block_elements");
  const std::optional<uint64_t> block_elements = parse_bounded(block, 64, kernels::kAdamW8bitMaxBlockElements);
  if (!block_elements || (*block_elements & (*block_elements - 1)) != 0) return bad("optim_block_elements", block);
  rules.block_elements = static_cast<uint32_t>(*block_elements);
  const std::string min = read("optim_min_8bit_elements");
  const std::optional<uint64_t> min_elements = parse_bounded(min, 0, std::numeric_limits<uint64_t>::max());
  if (!min_elements) return bad("optim_min_8bit_elements", min);
  rules.min_8bit_elements = *min_elements;
  const std::string embedding = read("optim_embedding_state");
  if (embedding != "fp32" && embedding != "8bit") return bad("optim_embedding_state", embedding);
  rules.embedding_fp32 = embedding == "fp32";
  return StateLayout(Kind::adamw8bit, rules);
}

}  // namespace strata::optim
