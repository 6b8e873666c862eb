// bench/bf16_decode_timing.cpp — one decoded token's products on bf16 weights, three ways, on
// GPT-2 small's shapes (the four block products, C 768, and the tied head, vocab 50,257):
//   widen   the weight widened whole to fp32, then the fp32 product (generation before: a block
//           widened into a scratch, then sgemm over it);
//   gemv    cpu_math::matmul_bf16 for one row: the AVX2 GEMV that widens in registers;
//   pieces  cpu_math::matmul_bf16_pieces: L2-sized widened pieces, one sgemm each.
// The weights of 12 blocks rotate so each product reads DRAM, not cache, as generation does.
// Alternated per repetition; prints the median ms per token-equivalent (12 blocks + the head)
// and per-product medians. Not a test: figures for bench/RESULTS.md.
//
// Usage: bf16_decode_timing [REPETITIONS [ROWS]]   (default 7 1)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_math.h"
#include "kernels/optim/cast.h"

namespace cm = strata::kernels::cpu_math;

namespace {

struct Product {
  const char* name;
  bool out_major;
  int64_t in, out;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 1;
  cm::pin_blas_to_one_thread();
  const int64_t c = 768, vocab = 50257, blocks = 12;
  const Product products[] = {{"c_attn", false, c, 3 * c}, {"attn.c_proj", false, c, c},
                              {"c_fc", false, c, 4 * c},   {"mlp.c_proj", false, 4 * c, c},
                              {"head", true, c, vocab}};
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> bits(0x3c00, 0x3d00);  // bf16 patterns of small positive values
  std::vector<std::vector<std::vector<uint16_t>>> weights;  // [product][block]
  size_t largest = 0;
  for (const Product& p : products) {
    const int64_t copies = p.out_major ? 1 : blocks;
    weights.emplace_back();
    for (int64_t b = 0; b < copies; ++b) {
      std::vector<uint16_t> w(static_cast<size_t>(p.in * p.out));
      for (uint16_t& v : w) v = static_cast<uint16_t>(bits(rng));
      weights.back().push_back(std::move(w));
    }
    largest = std::max(largest, static_cast<size_t>(p.in * p.out));
  }
  std::vector<float> widened(largest), x(static_cast<size_t>(rows * 4 * c), 0.01f), y(static_cast<size_t>(rows * vocab));
  std::vector<float> pieces(static_cast<size_t>(cm::kBf16PiecesFloats));
  using Clock = std::chrono::steady_clock;
  const char* ways[] = {"widen", "gemv", "pieces"};
  std::vector<std::vector<double>> token_ms(3), product_ms(3 * std::size(products));
  for (int rep = 0; rep < repetitions; ++rep) {
    for (int way = 0; way < 3; ++way) {
      double total = 0.0;
      for (size_t pi = 0; pi < std::size(products); ++pi) {
        const Product& p = products[pi];
        const Clock::time_point start = Clock::now();
        const int64_t copies = p.out_major ? 1 : blocks;
        for (int64_t b = 0; b < copies; ++b) {
          const uint16_t* w = weights[pi][static_cast<size_t>(b)].data();
          if (way == 0) {
            strata::kernels::cast_bf16_to_fp32(std::span<const uint16_t>(w, static_cast<size_t>(p.in * p.out)),
                                               std::span<float>(widened.data(), static_cast<size_t>(p.in * p.out)));
            cm::sgemm(false, p.out_major, rows, p.out, p.in, x.data(), p.in, widened.data(), p.out_major ? p.in : p.out,
                      0.0f, y.data(), p.out);
          } else if (way == 1) {
            cm::matmul_bf16(p.out_major, rows, p.in, p.out, x.data(), w, false, y.data(), pieces.data());
          } else {
            cm::matmul_bf16_pieces(p.out_major, rows, p.in, p.out, x.data(), w, false, y.data(), pieces.data());
          }
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        product_ms[static_cast<size_t>(way) * std::size(products) + pi].push_back(ms);
        total += ms;
      }
      token_ms[static_cast<size_t>(way)].push_back(total);
    }
  }
  std::printf("rows %lld, %d repetitions alternated; medians in ms (block products summed over %lld blocks)\n",
              static_cast<long long>(rows), repetitions, static_cast<long long>(blocks));
  std::printf("%-8s %10s", "way", "token");
  for (const Product& p : products) std::printf(" %12s", p.name);
  std::printf("\n");
  for (int way = 0; way < 3; ++way) {
    std::printf("%-8s %10.2f", ways[way], median(token_ms[static_cast<size_t>(way)]));
    for (size_t pi = 0; pi < std::size(products); ++pi)
      std::printf(" %12.2f", median(product_ms[static_cast<size_t>(way) * std::size(products) + pi]));
    std::printf("\n");
  }
  return 0;
}
