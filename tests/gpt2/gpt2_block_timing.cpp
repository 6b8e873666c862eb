// tests/gpt2/gpt2_block_timing.cpp — rough timing of one GPT-2-small-shaped block (C 768,
// 12 heads) on the CPU kernels: block_forward and block_backward (which recomputes the
// forward, as the streaming trainer calls it). A figure to size the trainer's compute by, not
// a benchmark gate. Alternating with the kernels in the same run it times a floor: the
// block's four forward products alone as plain cblas_sgemm calls with OpenBLAS's own
// threading on every core, so on a noisy machine the ratio (kernel time / GEMM floor) is the
// number to quote. It also times a LoRA step's backward: the base frozen (a default
// BlockGrads{}: no weight gradient products) with rank-16 adapters on the four linears, against
// the full backward. Prints medians of several repetitions.
//
// Usage: gpt2_block_timing [BATCH [SEQ_LEN [REPETITIONS [N_EMBD [N_HEAD]]]]]
//        (default 8 128 5 768 12: GPT-2 small)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include <cblas.h>

#include "tests/reference/gpt2_reference.h"
#include "kernels/lora/lora.h"
#include "tests/gpt2/gpt2_test_model.h"

namespace g2 = strata::reference::gpt2;
using strata::testing::AlignedFloats;

namespace {

double median_ms(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 8;
  const int64_t seq_len = argc > 2 ? std::atoll(argv[2]) : 128;
  const int repetitions = argc > 3 ? std::atoi(argv[3]) : 5;
  const int64_t n_embd = argc > 4 ? std::atoll(argv[4]) : 768;
  const int64_t n_head = argc > 5 ? std::atoll(argv[5]) : 12;
  const g2::Config config{1, n_head, n_embd, 50257, std::max<int64_t>(1024, seq_len)};
  const g2::BatchShape shape{batch, seq_len};
  const int64_t c = config.n_embd;
  const int64_t act = shape.rows() * c;

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> weights(static_cast<size_t>(g2::block_param_count(config)));
  for (float& w : weights) w = normal(rng);
  std::vector<float> grads(weights.size(), 0.0f);
  std::vector<float> x(static_cast<size_t>(act));
  std::vector<float> y(static_cast<size_t>(act));
  std::vector<float> d_in(static_cast<size_t>(act));
  for (float& v : x) v = 50.0f * normal(rng);
  const g2::BlockWeights w = g2::bind_block(config, static_cast<const float*>(weights.data()));
  const g2::BlockGrads g = g2::bind_block(config, grads.data());
  const size_t ws_bytes = g2::workspace_size_bytes(config, shape);
  AlignedFloats ws(ws_bytes / sizeof(float));
  const g2::Workspace workspace{ws.data(), ws_bytes};

  // LoRA, rank 16, on c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj (no dropout).
  namespace lora = strata::kernels::lora;
  constexpr int64_t kLoraRank = 16;
  const int64_t lora_in[4] = {c, c, c, 4 * c};
  const int64_t lora_out[4] = {3 * c, c, 4 * c, c};
  std::vector<std::vector<float>> lora_tensors;  // A, B, d_A, d_B per target
  lora::BlockAdapters adapters;
  adapters.spec = lora::Spec{kLoraRank, 2.0f, 0.0f};
  for (size_t t = 0; t < 4; ++t) {
    for (const int64_t count : {kLoraRank * lora_in[t], lora_out[t] * kLoraRank, kLoraRank * lora_in[t],
                                lora_out[t] * kLoraRank}) {
      lora_tensors.emplace_back(static_cast<size_t>(count));
      for (float& v : lora_tensors.back()) v = normal(rng);
    }
    adapters.adapters[t] = {lora_tensors[4 * t].data(), lora_tensors[4 * t + 1].data()};
    adapters.grads[t] = {lora_tensors[4 * t + 2].data(), lora_tensors[4 * t + 3].data()};
  }
  const size_t lora_bytes = lora::scratch_size_bytes(shape.rows(), 4 * c, 4 * c, kLoraRank, 0.0f);
  AlignedFloats lora_scratch(lora_bytes / sizeof(float));
  adapters.scratch = {lora_scratch.data(), lora_bytes};

  // The floor's operands: the forward's four products on buffers of the right shapes.
  const int64_t n = shape.rows();
  std::vector<float> a_buf(static_cast<size_t>(n * 4 * c), 0.5f);
  std::vector<float> c_buf(static_cast<size_t>(n * 4 * c));
  auto gemm_floor = [&] {
    openblas_set_num_threads(static_cast<int>(std::thread::hardware_concurrency()));
    const auto gemm = [&](int64_t in, int64_t out, const float* weight) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n),
                  static_cast<int>(out), static_cast<int>(in), 1.0f, a_buf.data(),
                  static_cast<int>(in), weight, static_cast<int>(out), 0.0f, c_buf.data(),
                  static_cast<int>(out));
    };
    gemm(c, 3 * c, w.attn_c_attn_weight);
    gemm(c, c, w.attn_c_proj_weight);
    gemm(c, 4 * c, w.mlp_c_fc_weight);
    gemm(4 * c, c, w.mlp_c_proj_weight);
  };

  using clock = std::chrono::steady_clock;
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  std::vector<double> floor_ms;
  std::vector<double> lora_backward_ms;
  for (int rep = 0; rep <= repetitions; ++rep) {  // rep 0 warms caches and thread pools
    const auto t_floor = clock::now();
    gemm_floor();
    const auto t0 = clock::now();
    g2::block_forward(config, shape, w, x.data(), y.data(), workspace);
    const auto t1 = clock::now();
    g2::block_backward(config, shape, w, x.data(), y.data(), d_in.data(), g, workspace);
    const auto t2 = clock::now();
    g2::block_backward(config, shape, w, x.data(), y.data(), d_in.data(), g2::BlockGrads{}, workspace, true, {},
                       &adapters);
    const auto t3 = clock::now();
    if (rep == 0) continue;
    floor_ms.push_back(std::chrono::duration<double, std::milli>(t0 - t_floor).count());
    forward_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    backward_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    lora_backward_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  // GEMM work only: 24·N·C² forward; backward = recompute + 2× the forward's products.
  const double gemm_forward_gflop = 24.0 * static_cast<double>(shape.rows()) * c * c / 1e9;
  const double f_ms = median_ms(forward_ms);
  const double b_ms = median_ms(backward_ms);
  const double floor = median_ms(floor_ms);
  std::printf("block (C=%lld, %lld heads), B=%lld T=%lld, workspace %.1f MiB, "
              "median of %d\n",
              static_cast<long long>(c), static_cast<long long>(config.n_head),
              static_cast<long long>(batch), static_cast<long long>(seq_len),
              static_cast<double>(ws_bytes) / (1 << 20), repetitions);
  std::printf("block_forward            %8.1f ms  (%.1f GFLOP/s of GEMM work)\n", f_ms,
              gemm_forward_gflop / (f_ms / 1e3));
  std::printf("block_backward+recompute %8.1f ms  (%.1f GFLOP/s of GEMM work)\n", b_ms,
              3.0 * gemm_forward_gflop / (b_ms / 1e3));
  std::printf("GEMM floor (forward's 4 products, plain sgemm, %u threads) %.1f ms  (%.1f GFLOP/s)\n",
              std::thread::hardware_concurrency(), floor, gemm_forward_gflop / (floor / 1e3));
  std::printf("ratios: forward / floor %.2f, backward / (3 x floor) %.2f\n", f_ms / floor,
              b_ms / (3.0 * floor));
  const double lora_ms = median_ms(lora_backward_ms);
  std::printf("block_backward+recompute, frozen base + LoRA r%lld on 4 linears %8.1f ms  (%.2f of the full backward)\n",
              static_cast<long long>(kLoraRank), lora_ms, lora_ms / b_ms);
  return 0;
}
