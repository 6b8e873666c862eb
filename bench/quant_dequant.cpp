// bench/quant_dequant.cpp — how fast the frozen base's dequantisation (kernels/quant, run before
// every forward and backward of a frozen unit) goes on this CPU, against a reference pass in the
// same run: a STREAM-style fill writing the same fp32 output across the same TBB arena and
// chunks — the write floor of the op, whose output is 4 bytes per element against 0.5-1 read. Reports, per format, the median of --repeats runs in ms (the
// default loop, AVX2 here, and the scalar one), the fp32 output rate (GB/s written) and the
// ratio reference ms / op ms (1 = at the floor); after the timed runs it checks the
// output against one dequantisation made before them (bit for bit), so a run that did nothing
// cannot look fast.
//
// Usage: quant_dequant [--elements N] [--repeats R]   (default N = 4096 * 11008: one Llama-2-7B
// MLP projection; R = 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "kernels/quant/quant.h"

namespace {

namespace q = strata::kernels::quant;

struct AlignedBytes {
  explicit AlignedBytes(uint64_t size_bytes) : storage(size_bytes + q::kPieceAlignmentBytes) {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + (q::kPieceAlignmentBytes - address % q::kPieceAlignmentBytes) % q::kPieceAlignmentBytes;
  }
  std::vector<std::byte> storage;
  std::byte* data = nullptr;
};

template <typename F>
double median_ms(int repeats, const F& run) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The reference, a STREAM-style fill: write every fp32 byte the op writes, with glibc's memset
// (its widest stores; std::fill of a float compiles to a scalar loop at -O2), per chunk as the
// op splits its work. The op also reads ~0.5-1 byte of codes per element; the fill is the write
// floor.
void reference_pass(const q::UnitLayout& layout, float* out) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, layout.chunks.size(), 1), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t c = r.begin(); c != r.end(); ++c) {
      const q::Chunk& chunk = layout.chunks[c];
      const q::TensorLayout& t = layout.tensors[chunk.tensor_index];
      std::memset(out + t.element_offset + chunk.begin_element, 0, chunk.element_count * sizeof(float));
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t elements = uint64_t{4096} * 11008;
  int repeats = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--elements" && i + 1 < argc) {
      elements = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: quant_dequant [--elements N] [--repeats R]\n");
      return 2;
    }
  }
  if (elements == 0 || repeats < 1) {
    std::fprintf(stderr, "quant_dequant: --elements and --repeats must be positive\n");
    return 2;
  }
  std::vector<float> weights(elements);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& w : weights) w = normal(rng);
  std::vector<float> out(elements), expected(elements);

  std::printf("dequantise %llu elements (fp32 out %.1f MiB), median of %d\n",
              static_cast<unsigned long long>(elements), elements * 4.0 / (1 << 20), repeats);
  std::printf("%-9s %10s %9s %10s %10s %9s %10s %7s\n", "format", "in MiB", "ms", "GB/s out", "scalar ms", "fill ms",
              "fill GB/s", "ratio");
  int status = 0;
  for (const auto& [kind, double_quant] : {std::pair{q::Kind::nf4, false}, std::pair{q::Kind::nf4, true},
                                           std::pair{q::Kind::int8, false}, std::pair{q::Kind::int8, true}}) {
    const q::UnitLayout layout = q::make_unit_layout(kind, {{elements, true}}, double_quant);
    AlignedBytes bytes(layout.size_bytes);
    q::quantize_unit(layout, weights.data(), bytes.data);
    q::dequantize_unit(layout, bytes.data, expected.data());
    const double op_ms = median_ms(repeats, [&] { q::dequantize_unit(layout, bytes.data, out.data()); });
    bool same = std::memcmp(out.data(), expected.data(), elements * sizeof(float)) == 0;
    const double scalar_ms = median_ms(repeats, [&] {
      q::dequantize_unit(layout, bytes.data, out.data(), strata::kernels::CpuIsa::scalar);
    });
    same = same && std::memcmp(out.data(), expected.data(), elements * sizeof(float)) == 0;
    const double ref_ms = median_ms(repeats, [&] { reference_pass(layout, out.data()); });
    const double out_gb = elements * 4.0 / 1e9;
    const std::string name = std::string(q::kind_name(kind)) + (double_quant ? "+dq" : "");
    std::printf("%-9s %10.1f %9.2f %10.2f %10.2f %9.2f %10.2f %7.2f%s\n", name.c_str(),
                layout.size_bytes / double(1 << 20), op_ms, out_gb / (op_ms / 1e3), scalar_ms, ref_ms,
                out_gb / (ref_ms / 1e3), ref_ms / op_ms, same ? "" : "  OUTPUT DIFFERS");
    if (!same) status = 1;
  }
  return status;
}
