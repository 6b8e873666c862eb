// adamw8bit.h on CPU: the dynamic code tables, the scalar reference loop, and the driver that
// picks the ISA and splits a chunk into tiles of whole blocks across the TBB arena. Built with
// -ffp-contract=off like the rest of the optim library (the torch operation order is explicit).
#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cpu_kernels.h"

namespace strata::kernels {
namespace {

// torch.linspace(start, end, steps) for float32 on the CPU, as torch 1.13 computes it on an
// AVX2 machine (checked bit for bit against torch by tests/optim/adamw8bit_reference.py):
// step = (end - start) / (steps - 1) in fp32; element i is start + step*i below steps/2 and
// end - step*(steps-1-i) from there on, each one fused multiply-add (the compiler contracts
// torch's scalar lambda); but the vectorised loop, which takes 16 elements at a time while
// 16 remain, computes only the first element of each 8-lane vector that way and the others as
// that base + k*step rounded apart (Vectorized<float>::arange).
std::vector<float> torch_linspace_fp32(double start_value, double end_value, int64_t steps) {
  const float start = static_cast<float>(start_value);
  const float end = static_cast<float>(end_value);
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  const auto element = [&](int64_t index) {
    return index < halfway ? std::fma(step, static_cast<float>(index), start)
                           : std::fma(-step, static_cast<float>(steps - index - 1), end);
  };
  constexpr int64_t kLanes = 8;
  std::vector<float> out;
  out.reserve(static_cast<size_t>(steps));
  int64_t index = 0;
  while (index + 2 * kLanes <= steps) {
    for (int vector = 0; vector < 2; ++vector, index += kLanes) {
      const float base = element(index);
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        out.push_back(base + static_cast<float>(lane) * step);
      }
    }
  }
  for (; index < steps; ++index) out.push_back(element(index));
  return out;
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), step by step:
// for each exponent i = 0..6, the midpoints of torch.linspace(0.1, 1, n_i) (n_i = 2^i + 1
// signed, 2^(i+1) + 1 unsigned; (a + b) / 2 in fp32) times 10^(i-6) (a Python float rounded to
// fp32 by the tensor multiply), and their negatives when signed; then 0 and 1, sorted. With 7
// exponent bits and 8 bits in all there are no "additional items".
std::array<float, 256> build_dynamic_code(bool is_signed) {
  constexpr int kMaxExponentBits = 7;
  std::vector<float> data;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t fraction_items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const std::vector<float> boundaries = torch_linspace_fp32(0.1, 1.0, fraction_items);
    const float scale = static_cast<float>(std::pow(10.0, static_cast<double>(i - (kMaxExponentBits - 1))));
    for (size_t k = 0; k + 1 < boundaries.size(); ++k) {
      const float mean = (boundaries[k] + boundaries[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  assert(data.size() == 256);
  std::sort(data.begin(), data.end());
  std::array<float, 256> table{};
  std::copy(data.begin(), data.end(), table.begin());
  return table;
}

// quantize_entry (adamw8bit_element.h) from quantize_moment itself: per key, the code at its
// lowest x and, by bisection over the rising low bits, where it steps up; the codes at the
// key's other x must be the first code or one more (a key spanning two steps is a build bug).
void fill_quantize_entries(detail::CodeTable& table, bool is_signed) {
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t key = 0; key < detail::kQuantizeKeysPerSign; ++key) {
      // The key's x: bucket `key`'s exponent and top mantissa bits, or past the buckets, |x| > 1
      // (one code for all of them: 255, or 0 when negative).
      const uint32_t high_bits = key == detail::kCodeBucketsPerSign
                                     ? 0x40000000u  // 2.0: finite whatever the low bits
                                     : ((key >> 8) + detail::kCodeBucketMinExponent) << 23 | (key & 0xFFu) << 15;
      const auto code_at = [&](uint32_t rising_low) {
        const uint32_t low = sign == 0 ? rising_low : 0x7FFFu - rising_low;
        return detail::quantize_moment(table, is_signed, std::bit_cast<float>(sign << 31 | high_bits | low), 1.0f);
      };
      const uint32_t first = code_at(0);
      const uint32_t last = code_at(0x7FFF);
      assert(last >= first && last <= first + 1 && "a quantiser key spans two code steps");
      uint32_t limit = 0x8000;
      if (last != first) {
        uint32_t below = 0, at = 0x7FFF;  // code_at(below) == first, code_at(at) == last
        while (at - below > 1) {
          const uint32_t middle = (below + at) / 2;
          (code_at(middle) == first ? below : at) = middle;
        }
        limit = at;
      }
      table.quantize_entry[sign * detail::kQuantizeKeysPerSign + key] = first << 16 | limit;
    }
  }
}

detail::CodeTable make_code_table(const std::array<float, 256>& values, bool is_signed) {
  detail::CodeTable table{};
  std::copy(values.begin(), values.end(), table.values);
  table.midpoints[0] = -std::numeric_limits<float>::infinity();
  for (size_t k = 1; k < 256; ++k) table.midpoints[k] = (values[k - 1] + values[k]) * 0.5f;
  table.midpoints[256] = std::numeric_limits<float>::infinity();
  for (size_t code = 0; code < 256; ++code) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[code]);
    for (size_t byte = 0; byte < 4; ++byte) table.value_bytes[byte][code] = static_cast<uint8_t>(bits >> (8 * byte));
  }
  // Each bucket's first code by the reference search at its lowest x, and the threshold above
  // it if that lies inside the bucket; the lookup is exact only if no bucket spans two
  // thresholds, which the search at the bucket's highest x confirms.
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t bucket = 0; bucket < detail::kCodeBucketsPerSign; ++bucket) {
      const uint32_t low_bits = bucket == 0 ? 0u : ((bucket >> 8) + detail::kCodeBucketMinExponent) << 23 |
                                                       (bucket & 0xFFu) << 15;
      const uint32_t high_bits = bucket == 0 ? (detail::kCodeBucketMinExponent << 23 | 0x7FFFu) : (low_bits | 0x7FFFu);
      const float low = std::bit_cast<float>(low_bits), high = std::bit_cast<float>(high_bits);
      const float lowest = sign == 0 ? low : -high;
      const float highest = sign == 0 ? high : -low;
      const uint32_t first = detail::nearest_code(table.values, table.midpoints, lowest);
      [[maybe_unused]] const uint32_t last = detail::nearest_code(table.values, table.midpoints, highest);
      assert(last <= first + 1 && "a lookup bucket spans two code thresholds");
      assert((bucket != 0 || last == first) && "the lowest bucket holds a threshold");
      const uint32_t threshold_bits = std::bit_cast<uint32_t>(table.midpoints[first + 1]);
      const uint32_t bucket_high_bits = (sign << 31) | low_bits;
      const bool inside = bucket != 0 && (threshold_bits >> 15) == (bucket_high_bits >> 15);
      uint32_t entry = first << 24;
      if (inside) {
        entry |= (threshold_bits & 0x7FFFu) | ((first & 1u) != 0 ? 0x10000u : 0u);
      } else {
        entry |= sign == 0 ? 0x8000u : 0u;  // a limit no x of the bucket passes
      }
      table.bucket[sign * detail::kCodeBucketsPerSign + bucket] = entry;
    }
  }
  fill_quantize_entries(table, is_signed);
  return table;
}

void assert_state_shape(const AdamW8bitState& state) {
  [[maybe_unused]] const size_t count = state.params.size();
  [[maybe_unused]] const size_t blocks = adamw8bit_block_count(count, state.block_elements);
  assert(state.block_elements >= 1 && state.block_elements <= kAdamW8bitMaxBlockElements);
  assert(state.exp_avg_codes.size() == count && state.exp_avg_sq_codes.size() == count);
  assert(state.exp_avg_absmax.size() == blocks && state.exp_avg_sq_absmax.size() == blocks);
}

// `best` is avx512 where the CPU has it (this kernel is compute-bound, so the wider loop pays),
// else detect_cpu_isa(); an explicit choice must be supported (asserted).
CpuIsa resolve_adamw8bit_isa(CpuIsa isa) {
  if (isa == CpuIsa::best) return cpu_has_avx512() ? CpuIsa::avx512 : detect_cpu_isa();
  if (isa == CpuIsa::avx512) {
    assert(cpu_has_avx512() && "CpuIsa::avx512 asked for on a CPU without AVX-512 F/BW/DQ/VL/VBMI");
    return isa;
  }
  return resolve_cpu_isa(isa);
}

template <typename Grad>
using AdamW8bitKernel = void (*)(const AdamWStepScalars&, const detail::AdamW8bitTile&, const Grad*);

template <typename Grad>
void adamw8bit_span(const AdamWStepScalars& scalars, const AdamW8bitState& state, std::span<const Grad> grads,
                    ComputeCopy copy, CpuIsa isa, AdamW8bitKernel<Grad> scalar, AdamW8bitKernel<Grad> avx2,
                    AdamW8bitKernel<Grad> avx512) {
  assert_state_shape(state);
  const size_t count = state.params.size();
  assert(grads.size() == count);
  assert(copy.dtype == DType::f32 || copy.bits.size() == count);
  const CpuIsa resolved = resolve_adamw8bit_isa(isa);
  const auto kernel = resolved == CpuIsa::avx512 ? avx512 : resolved == CpuIsa::avx2 ? avx2 : scalar;
  const size_t block_elements = state.block_elements;
  // Tiles of whole blocks, about kAdamWTileElements each (the fp32 kernel's reasoning holds:
  // a tile's bytes stay in L2 between the read and the write).
  const size_t tile_blocks = std::max<size_t>(1, kAdamWTileElements / block_elements);
  const size_t tile_elements = tile_blocks * block_elements;
  const auto run = [&](size_t begin, size_t end) {
    detail::AdamW8bitTile tile;
    tile.exp_avg_table = &detail::cpu_code_table(true);
    tile.exp_avg_sq_table = &detail::cpu_code_table(false);
    tile.block_elements = block_elements;
    tile.params = state.params.data() + begin;
    tile.exp_avg_codes = state.exp_avg_codes.data() + begin;
    tile.exp_avg_sq_codes = state.exp_avg_sq_codes.data() + begin;
    tile.exp_avg_absmax = state.exp_avg_absmax.data() + begin / block_elements;
    tile.exp_avg_sq_absmax = state.exp_avg_sq_absmax.data() + begin / block_elements;
    tile.copy_dtype = copy.dtype;
    tile.copy = copy.dtype == DType::f32 ? nullptr : copy.bits.data() + begin;
    tile.count = end - begin;
    kernel(scalars, tile, grads.data() + begin);
  };
  if (count <= tile_elements) {
    if (count > 0) run(0, count);
    return;
  }
  const size_t tile_count = (count + tile_elements - 1) / tile_elements;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tile_count, 1), [&](const tbb::blocked_range<size_t>& tiles) {
    run(tiles.begin() * tile_elements, std::min(count, tiles.end() * tile_elements));
  });
}

}  // namespace

const std::array<float, 256>& dynamic_code(bool is_signed) {
  static const std::array<float, 256> signed_code = build_dynamic_code(true);
  static const std::array<float, 256> unsigned_code = build_dynamic_code(false);
  return is_signed ? signed_code : unsigned_code;
}

void adamw8bit_init(const AdamW8bitState& state) {
  assert_state_shape(state);
  std::fill(state.exp_avg_codes.begin(), state.exp_avg_codes.end(), kDynamicCodeSignedZero);
  std::fill(state.exp_avg_sq_codes.begin(), state.exp_avg_sq_codes.end(), uint8_t{0});
  std::fill(state.exp_avg_absmax.begin(), state.exp_avg_absmax.end(), 0.0f);
  std::fill(state.exp_avg_sq_absmax.begin(), state.exp_avg_sq_absmax.end(), 0.0f);
}

void adamw8bit_step(const AdamWStepScalars& scalars, const AdamW8bitState& state, std::span<const float> grads,
                    ComputeCopy copy, CpuIsa isa) {
  adamw8bit_span(scalars, state, grads, copy, isa, detail::adamw8bit_fp32_grads_scalar,
                 detail::adamw8bit_fp32_grads_avx2, detail::adamw8bit_fp32_grads_avx512);
}

void adamw8bit_step_bf16_grads(const AdamWStepScalars& scalars, const AdamW8bitState& state,
                               std::span<const uint16_t> grads_bf16, ComputeCopy copy, CpuIsa isa) {
  adamw8bit_span(scalars, state, grads_bf16, copy, isa, detail::adamw8bit_bf16_grads_scalar,
                 detail::adamw8bit_bf16_grads_avx2, detail::adamw8bit_bf16_grads_avx512);
}

void adamw8bit_dequantize(const AdamW8bitState& state, std::span<float> exp_avg, std::span<float> exp_avg_sq) {
  assert_state_shape(state);
  const size_t count = state.params.size();
  assert(exp_avg.size() == count && exp_avg_sq.size() == count);
  const std::array<float, 256>& m_code = dynamic_code(true);
  const std::array<float, 256>& v_code = dynamic_code(false);
  for (size_t i = 0; i < count; ++i) {
    const size_t block = i / state.block_elements;
    exp_avg[i] = detail::mul_rn(m_code[state.exp_avg_codes[i]], state.exp_avg_absmax[block]);
    exp_avg_sq[i] = detail::mul_rn(v_code[state.exp_avg_sq_codes[i]], state.exp_avg_sq_absmax[block]);
  }
}

void adamw8bit_quantize(const AdamW8bitState& state, std::span<const float> exp_avg,
                        std::span<const float> exp_avg_sq) {
  assert_state_shape(state);
  const size_t count = state.params.size();
  assert(exp_avg.size() == count && exp_avg_sq.size() == count);
  const detail::CodeTable& m_table = detail::cpu_code_table(true);
  const detail::CodeTable& v_table = detail::cpu_code_table(false);
  for (size_t begin = 0, block = 0; begin < count; begin += state.block_elements, ++block) {
    const size_t n = std::min<size_t>(state.block_elements, count - begin);
    float m_max = 0.0f, v_max = 0.0f;
    for (size_t i = begin; i < begin + n; ++i) {
      assert(detail::is_finite_fp32(exp_avg[i]) && detail::is_finite_fp32(exp_avg_sq[i]));
      m_max = std::max(m_max, std::fabs(exp_avg[i]));
      v_max = std::max(v_max, std::fabs(exp_avg_sq[i]));
    }
    state.exp_avg_absmax[block] = m_max;
    state.exp_avg_sq_absmax[block] = v_max;
    const float m_inverse = detail::inverse_absmax(m_max), v_inverse = detail::inverse_absmax(v_max);
    for (size_t i = begin; i < begin + n; ++i) {
      state.exp_avg_codes[i] = detail::quantize_moment(m_table, true, exp_avg[i], m_inverse);
      state.exp_avg_sq_codes[i] = detail::quantize_moment(v_table, false, exp_avg_sq[i], v_inverse);
    }
  }
}

// --- the scalar reference loop --------------------------------------------------------------------

namespace detail {

const CodeTable& cpu_code_table(bool is_signed) {
  static const CodeTable signed_table = make_code_table(dynamic_code(true), true);
  static const CodeTable unsigned_table = make_code_table(dynamic_code(false), false);
  return is_signed ? signed_table : unsigned_table;
}

namespace {

// Per block: pass 1 dequantises, updates the param from the fresh fp32 moments and keeps them
// (and their block maximum); pass 2 quantises them against the new absmax.
template <typename Grad>
void adamw8bit_loop(const AdamWStepScalars& s, const AdamW8bitTile& t, const Grad* grads) {
  float fresh_m[kAdamW8bitMaxBlockElements];
  float fresh_v[kAdamW8bitMaxBlockElements];
  const CodeTable& m_table = *t.exp_avg_table;
  const CodeTable& v_table = *t.exp_avg_sq_table;
  for (size_t begin = 0, block = 0; begin < t.count; begin += t.block_elements, ++block) {
    const size_t n = std::min(t.block_elements, t.count - begin);
    const float m_scale = t.exp_avg_absmax[block];
    const float v_scale = t.exp_avg_sq_absmax[block];
    float m_max = 0.0f, v_max = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      adamw8bit_scalar_element(s, t, grads, begin + i, m_scale, v_scale, fresh_m[i], fresh_v[i], m_max, v_max);
    }
    t.exp_avg_absmax[block] = m_max;
    t.exp_avg_sq_absmax[block] = v_max;
    const float m_inverse = inverse_absmax(m_max), v_inverse = inverse_absmax(v_max);
    for (size_t i = 0; i < n; ++i) {
      t.exp_avg_codes[begin + i] = quantize_moment(m_table, true, fresh_m[i], m_inverse);
      t.exp_avg_sq_codes[begin + i] = quantize_moment(v_table, false, fresh_v[i], v_inverse);
    }
  }
}

}  // namespace

void adamw8bit_fp32_grads_scalar(const AdamWStepScalars& s, const AdamW8bitTile& tile, const float* grads) {
  adamw8bit_loop(s, tile, grads);
}
void adamw8bit_bf16_grads_scalar(const AdamWStepScalars& s, const AdamW8bitTile& tile, const uint16_t* grads) {
  adamw8bit_loop(s, tile, grads);
}

}  // namespace detail
}  // namespace strata::kernels
