#include "optim/state.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace strata::optim {

namespace {

constexpr uint64_t round_up4(uint64_t bytes) { return (bytes + 3) & ~uint64_t{3}; }

// One piece of a chunk under adamw8bit: the part of one tensor inside it, where it starts in
// the chunk (elements) and where its state starts (bytes from the chunk's start).
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
  uint64_t state_offset = sizeof(float) * count;
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

// The 8-bit state views of a piece (its layout in the header).
kernels::AdamW8bitState eight_bit_state(std::byte* chunk, const Piece& piece, uint32_t block_elements) {
  const size_t blocks = kernels::adamw8bit_block_count(piece.count, block_elements);
  std::byte* base = chunk + piece.state_offset_bytes;
  auto* absmax_m = reinterpret_cast<float*>(base);
  auto* codes_m = reinterpret_cast<uint8_t*>(base + 2 * sizeof(float) * blocks);
  float* master = reinterpret_cast<float*>(chunk) + piece.local_elements;
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
  if (kind_ == Kind::adamw) return 3 * sizeof(float) * count;
  uint64_t bytes = sizeof(float) * count;
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
  const uint64_t bytes = chunk_bytes(tensors, begin, count);
  // Moments, absmax and padding zero first, so the store's bytes depend on nothing else.
  std::memset(chunk + sizeof(float) * count, 0, bytes - sizeof(float) * count);
  if (kind_ == Kind::adamw) return;
  for_each_piece(*this, tensors, begin, count, [&](const Piece& piece) {
    if (piece.eight_bit) kernels::adamw8bit_init(eight_bit_state(chunk, piece, rules_.block_elements));
  });
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
    for (const TensorSpan& tensor : tensors) {
      const uint64_t first = std::max(begin, tensor.offset_elements);
      const uint64_t last = std::min(begin + count, tensor.offset_elements + tensor.element_count);
      if (first >= last) continue;
      const uint64_t local = first - begin;  // within the chunk
      kernels::AdamWChunk piece = base_piece(tensor, local, last - first);
      piece.exp_avg = master + count + local;
      piece.exp_avg_sq = master + 2 * count + local;
      pieces.push_back(piece);
    }
    return;
  }
  for_each_piece(*this, tensors, begin, count, [&](const Piece& p) {
    kernels::AdamWChunk piece = base_piece(*p.tensor, p.local_elements, p.count);
    if (p.eight_bit) {
      const kernels::AdamW8bitState state = eight_bit_state(chunk, p, rules_.block_elements);
      piece.block_elements = rules_.block_elements;
      piece.exp_avg_codes = state.exp_avg_codes.data();
      piece.exp_avg_sq_codes = state.exp_avg_sq_codes.data();
      piece.exp_avg_absmax = state.exp_avg_absmax.data();
      piece.exp_avg_sq_absmax = state.exp_avg_sq_absmax.data();
    } else {
      auto* moments = reinterpret_cast<float*>(chunk + p.state_offset_bytes);
      piece.exp_avg = moments;
      piece.exp_avg_sq = moments + p.count;
    }
    pieces.push_back(piece);
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
