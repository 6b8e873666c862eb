// quant.h on the CPU: the layout, the quantiser (init time) and the dequantising kernel (before
// every use of a frozen unit). Built with -ffp-contract=off (kernels/quant/meson.build) so each
// fp32 operation rounds on its own, as the CUDA twin's _rn intrinsics do.
#include "kernels/quant/quant.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/adamw8bit_element.h"
#include "kernels/quant/quant_element.h"

namespace strata::kernels::quant {
namespace {

constexpr uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }
constexpr uint64_t ceil_div(uint64_t value, uint64_t divisor) { return (value + divisor - 1) / divisor; }

uint64_t codes_bytes(Kind kind, uint64_t element_count) {
  return kind == Kind::nf4 ? ceil_div(element_count, 2) : element_count;
}

// Appends a piece of `size_bytes` at the next aligned offset and returns where it starts.
uint64_t place(uint64_t& cursor_bytes, uint64_t size_bytes) {
  const uint64_t at = cursor_bytes;
  cursor_bytes = align_up(cursor_bytes + size_bytes, kPieceAlignmentBytes);
  return at;
}

float abs_fp32(float value) { return value < 0.0f ? -value : value; }

// max |x| over a block; `a > max ? a : max` keeps a NaN out, as bitsandbytes' fmaxf does.
float block_absmax(const float* values, uint64_t count) {
  float absmax = 0.0f;
  for (uint64_t i = 0; i < count; ++i) {
    const float a = abs_fp32(values[i]);
    absmax = a > absmax ? a : absmax;
  }
  return absmax;
}

template <typename T>
T* at(std::byte* base, uint64_t offset_bytes) {
  return reinterpret_cast<T*>(base + offset_bytes);
}
template <typename T>
const T* at(const std::byte* base, uint64_t offset_bytes) {
  return reinterpret_cast<const T*>(base + offset_bytes);
}

// The NF4 codes of one block (first element in the high nibble) from its absmax.
void quantize_nf4_block(const float* x, uint64_t count, float absmax, uint8_t* codes) {
  const float inverse = detail::nf4_inverse_absmax(absmax);
  for (uint64_t i = 0; i < count; i += 2) {
    const uint32_t high = detail::nf4_code(detail::nf4_scaled(x[i], absmax, inverse));
    const uint32_t low = i + 1 < count ? detail::nf4_code(detail::nf4_scaled(x[i + 1], absmax, inverse)) : 0u;
    codes[i / 2] = static_cast<uint8_t>(high << 4 | low);
  }
}

void quantize_int8_block(const float* x, uint64_t count, float absmax, int8_t* codes) {
  const float scale = detail::int8_scale(absmax);
  for (uint64_t i = 0; i < count; ++i) codes[i] = detail::int8_code(x[i], scale);
}

// The absmax of block `block` of a tensor as the dequantiser reads it.
struct AbsmaxReader {
  const float* plain = nullptr;  // no double quant
  const uint8_t* codes = nullptr;
  const float* absmax2 = nullptr;
  float mean = 0.0f;
  const float* code_values = nullptr;  // the signed dynamic map

  float operator()(uint64_t block) const {
    if (plain != nullptr) return plain[block];
    return detail::double_quant_absmax(code_values[codes[block]], absmax2[block / kAbsmaxBlockElements], mean);
  }
};

AbsmaxReader absmax_reader(const UnitLayout& layout, const TensorLayout& tensor, const std::byte* in) {
  AbsmaxReader reader;
  if (!layout.double_quant) {
    reader.plain = at<float>(in, tensor.absmax_offset_bytes);
    return reader;
  }
  reader.codes = at<uint8_t>(in, tensor.absmax_offset_bytes);
  reader.absmax2 = at<float>(in, tensor.absmax2_offset_bytes);
  reader.mean = *at<float>(in, tensor.absmax_mean_offset_bytes);
  reader.code_values = dynamic_code(true).data();
  return reader;
}

// (code of byte's high nibble, code of its low nibble) as two levels, so the inner loop does
// one table load per two elements.
struct Nf4PairTable {
  float pairs[256][2];
};
const Nf4PairTable& nf4_pair_table() {
  static const Nf4PairTable table = [] {
    Nf4PairTable t{};
    for (uint32_t byte = 0; byte < 256; ++byte) {
      t.pairs[byte][0] = kNf4Levels[byte >> 4];
      t.pairs[byte][1] = kNf4Levels[byte & 0xFu];
    }
    return t;
  }();
  return table;
}

void dequantize_nf4_block(const uint8_t* codes, uint64_t count, float absmax, const Nf4PairTable& table,
                          float* out) {
  const uint64_t pairs = count / 2;
  for (uint64_t p = 0; p < pairs; ++p) {
    const float* levels = table.pairs[codes[p]];
    out[2 * p] = detail::mul_rn(levels[0], absmax);
    out[2 * p + 1] = detail::mul_rn(levels[1], absmax);
  }
  if (count % 2 != 0) out[count - 1] = detail::mul_rn(kNf4Levels[codes[pairs] >> 4], absmax);
}

void dequantize_int8_block(const int8_t* codes, uint64_t count, float absmax, float* out) {
  const float scale = detail::int8_scale(absmax);
  for (uint64_t i = 0; i < count; ++i) out[i] = detail::mul_rn(static_cast<float>(codes[i]), scale);
}

#define STRATA_QUANT_AVX2 __attribute__((target("avx2")))

// 16 elements (8 code bytes) per step: the nibbles interleaved back into element order, then
// each 8 codes looked up in the two halves of the table (vpermps takes an index's low 3 bits)
// and the half picked by its bit 3. The same one multiply per element as the scalar loop.
STRATA_QUANT_AVX2 void dequantize_nf4_block_avx2(const uint8_t* codes, uint64_t count, float absmax,
                                                 const Nf4PairTable& table, float* out) {
  const __m256 levels_low = _mm256_loadu_ps(kNf4Levels.data());
  const __m256 levels_high = _mm256_loadu_ps(kNf4Levels.data() + 8);
  const __m256 scale = _mm256_set1_ps(absmax);
  const __m128i nibble = _mm_set1_epi8(0x0F);
  uint64_t e = 0;
  for (; e + 16 <= count; e += 16) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + e / 2));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m128i low = _mm_and_si128(bytes, nibble);
    const __m128i ordered = _mm_unpacklo_epi8(high, low);  // h0 l0 h1 l1 …: element order
    for (int half = 0; half < 2; ++half) {
      const __m256i index = _mm256_cvtepu8_epi32(half == 0 ? ordered : _mm_srli_si128(ordered, 8));
      const __m256 from_low = _mm256_permutevar8x32_ps(levels_low, index);
      const __m256 from_high = _mm256_permutevar8x32_ps(levels_high, index);
      const __m256 pick_high = _mm256_castsi256_ps(_mm256_slli_epi32(index, 28));  // bit 3 -> sign
      const __m256 level = _mm256_blendv_ps(from_low, from_high, pick_high);
      _mm256_storeu_ps(out + e + 8 * half, _mm256_mul_ps(level, scale));
    }
  }
  if (e < count) dequantize_nf4_block(codes + e / 2, count - e, absmax, table, out + e);
}

STRATA_QUANT_AVX2 void dequantize_int8_block_avx2(const int8_t* codes, uint64_t count, float absmax, float* out) {
  const __m256 scale = _mm256_set1_ps(detail::int8_scale(absmax));
  uint64_t e = 0;
  for (; e + 8 <= count; e += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + e));
    _mm256_storeu_ps(out + e, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), scale));
  }
  if (e < count) dequantize_int8_block(codes + e, count - e, absmax, out + e);
}

void for_each_chunk(const UnitLayout& layout, const auto& body) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, layout.chunks.size(), 1), [&](const tbb::blocked_range<size_t>& range) {
    for (size_t c = range.begin(); c != range.end(); ++c) body(layout.chunks[c]);
  });
}

}  // namespace

const char* kind_name(Kind kind) { return kind == Kind::nf4 ? "nf4" : "int8"; }

uint64_t quantized_tensor_bytes(Kind kind, uint64_t element_count, bool double_quant) {
  uint64_t cursor = 0;
  const uint64_t blocks = ceil_div(element_count, kBlockElements);
  place(cursor, codes_bytes(kind, element_count));
  if (double_quant) {
    place(cursor, blocks);
    place(cursor, sizeof(float) * ceil_div(blocks, kAbsmaxBlockElements));
    place(cursor, sizeof(float));
  } else {
    place(cursor, sizeof(float) * blocks);
  }
  return cursor;
}

UnitLayout make_unit_layout(Kind kind, const std::vector<TensorPlan>& tensors, bool double_quant) {
  assert(kind == Kind::nf4 || kind == Kind::int8);
  assert(tensors.size() <= UINT32_MAX && "Chunk::tensor_index is 32 bits");
  UnitLayout layout;
  layout.kind = kind;
  layout.double_quant = double_quant;
  layout.tensors.reserve(tensors.size());
  uint64_t cursor = 0;
  uint64_t element_offset = 0;
  for (size_t index = 0; index < tensors.size(); ++index) {
    const TensorPlan& plan = tensors[index];
    TensorLayout t;
    t.element_count = plan.element_count;
    t.element_offset = element_offset;
    t.quantized = plan.quantize;
    if (plan.quantize) {
      t.block_count = ceil_div(plan.element_count, kBlockElements);
      t.codes_offset_bytes = place(cursor, codes_bytes(kind, plan.element_count));
      if (double_quant) {
        t.absmax_block_count = ceil_div(t.block_count, kAbsmaxBlockElements);
        t.absmax_offset_bytes = place(cursor, t.block_count);
        t.absmax2_offset_bytes = place(cursor, sizeof(float) * t.absmax_block_count);
        t.absmax_mean_offset_bytes = place(cursor, sizeof(float));
      } else {
        t.absmax_offset_bytes = place(cursor, sizeof(float) * t.block_count);
      }
    } else {
      t.raw_offset_bytes = place(cursor, sizeof(float) * plan.element_count);
    }
    for (uint64_t begin = 0; begin < plan.element_count; begin += kChunkElements) {
      layout.chunks.push_back(Chunk{static_cast<uint32_t>(index), begin,
                                    std::min(kChunkElements, plan.element_count - begin)});
    }
    element_offset += plan.element_count;
    layout.tensors.push_back(t);
  }
  layout.element_count = element_offset;
  layout.size_bytes = cursor;
  return layout;
}

void quantize_unit(const UnitLayout& layout, const float* unit_fp32, std::byte* out) {
  assert(reinterpret_cast<uintptr_t>(out) % kPieceAlignmentBytes == 0);
  std::memset(out, 0, layout.size_bytes);
  // Double quant needs every exact absmax of a tensor before its mean: kept here (init-time
  // work, one float per 64 elements), indexed by the tensor's first block in `block_base`.
  std::vector<uint64_t> block_base(layout.tensors.size(), 0);
  std::vector<float> exact_absmax;
  if (layout.double_quant) {
    uint64_t blocks = 0;
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      block_base[i] = blocks;
      blocks += layout.tensors[i].block_count;
    }
    exact_absmax.resize(blocks);
  }
  for_each_chunk(layout, [&](const Chunk& chunk) {
    const TensorLayout& t = layout.tensors[chunk.tensor_index];
    const float* x = unit_fp32 + t.element_offset + chunk.begin_element;
    if (!t.quantized) {
      std::memcpy(at<float>(out, t.raw_offset_bytes) + chunk.begin_element, x, sizeof(float) * chunk.element_count);
      return;
    }
    const uint64_t first_block = chunk.begin_element / kBlockElements;
    float* absmax_out = layout.double_quant ? exact_absmax.data() + block_base[chunk.tensor_index]
                                            : at<float>(out, t.absmax_offset_bytes);
    for (uint64_t begin = 0; begin < chunk.element_count; begin += kBlockElements) {
      const uint64_t count = std::min(kBlockElements, chunk.element_count - begin);
      const uint64_t block = first_block + begin / kBlockElements;
      const float absmax = block_absmax(x + begin, count);
      absmax_out[block] = absmax;
      const uint64_t element = chunk.begin_element + begin;
      if (layout.kind == Kind::nf4) {
        quantize_nf4_block(x + begin, count, absmax, at<uint8_t>(out, t.codes_offset_bytes) + element / 2);
      } else {
        quantize_int8_block(x + begin, count, absmax, at<int8_t>(out, t.codes_offset_bytes) + element);
      }
    }
  });
  if (!layout.double_quant) return;

  const kernels::detail::CodeTable& table = kernels::detail::cpu_code_table(true);
  for (size_t index = 0; index < layout.tensors.size(); ++index) {
    const TensorLayout& t = layout.tensors[index];
    if (!t.quantized || t.block_count == 0) continue;
    const float* absmax = exact_absmax.data() + block_base[index];
    // The mean's order is part of the format (quant.h): first block first, in double.
    double sum = 0.0;
    for (uint64_t b = 0; b < t.block_count; ++b) sum += static_cast<double>(absmax[b]);
    const float mean = static_cast<float>(sum / static_cast<double>(t.block_count));
    *at<float>(out, t.absmax_mean_offset_bytes) = mean;
    uint8_t* codes = at<uint8_t>(out, t.absmax_offset_bytes);
    float* absmax2 = at<float>(out, t.absmax2_offset_bytes);
    tbb::parallel_for(uint64_t{0}, t.absmax_block_count, [&](uint64_t group) {
      const uint64_t begin = group * kAbsmaxBlockElements;
      const uint64_t end = std::min(t.block_count, begin + kAbsmaxBlockElements);
      float centred[kAbsmaxBlockElements];
      for (uint64_t b = begin; b < end; ++b) centred[b - begin] = absmax[b] - mean;
      const float group_absmax = block_absmax(centred, end - begin);
      absmax2[group] = group_absmax;
      const float inverse = kernels::detail::inverse_absmax(group_absmax);
      for (uint64_t b = begin; b < end; ++b) {
        const float scaled = detail::mul_rn(centred[b - begin], inverse);
        codes[b] = static_cast<uint8_t>(kernels::detail::nearest_code(table.values, table.midpoints, scaled));
      }
    });
  }
}

void dequantize_unit(const UnitLayout& layout, const std::byte* in, float* unit_fp32, CpuIsa isa) {
  assert(reinterpret_cast<uintptr_t>(in) % kPieceAlignmentBytes == 0);
  const Nf4PairTable& pair_table = nf4_pair_table();
  const bool avx2 = resolve_cpu_isa(isa) != CpuIsa::scalar;
  const auto nf4_block = avx2 ? dequantize_nf4_block_avx2 : dequantize_nf4_block;
  const auto int8_block = avx2 ? dequantize_int8_block_avx2 : dequantize_int8_block;
  for_each_chunk(layout, [&](const Chunk& chunk) {
    const TensorLayout& t = layout.tensors[chunk.tensor_index];
    float* out = unit_fp32 + t.element_offset + chunk.begin_element;
    if (!t.quantized) {
      std::memcpy(out, at<float>(in, t.raw_offset_bytes) + chunk.begin_element, sizeof(float) * chunk.element_count);
      return;
    }
    const AbsmaxReader absmax = absmax_reader(layout, t, in);
    const uint64_t first_block = chunk.begin_element / kBlockElements;
    for (uint64_t begin = 0; begin < chunk.element_count; begin += kBlockElements) {
      const uint64_t count = std::min(kBlockElements, chunk.element_count - begin);
      const float block_absmax_value = absmax(first_block + begin / kBlockElements);
      const uint64_t element = chunk.begin_element + begin;
      if (layout.kind == Kind::nf4) {
        nf4_block(at<uint8_t>(in, t.codes_offset_bytes) + element / 2, count, block_absmax_value, pair_table,
                  out + begin);
      } else {
        int8_block(at<int8_t>(in, t.codes_offset_bytes) + element, count, block_absmax_value, out + begin);
      }
    }
  });
}

}  // namespace strata::kernels::quant
