// `strata bench adam`: how close the CPU AdamW step (kernels/optim) comes to memory speed.
// It runs, alternately and over the same buffers, the fused AdamW step (read p, g, m, v; write
// p, m, v and the bf16/fp16 copy) and a STREAM-style pass that touches exactly the same bytes
// in the same tiles with next to no arithmetic, and reports the medians and their ratio. After
// every timed pass a sample of elements is checked against the scalar reference of what that
// pass should have written, so a fast wrong kernel cannot pass.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "common/dtype.h"
#include "common/log.h"
#include "common/size.h"
#include "apps/cli/commands.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/adamw8bit.h"
#include "kernels/optim/cast.h"

namespace strata::cli {
namespace {

using kernels::CpuIsa;

struct BenchAdamOptions {
  uint64_t params = 200'000'000;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  unsigned repeats = 5;
  std::string copy = "bf16";
  std::string isa = "best";
  std::string mode = "stream";
  bool json = false;
};

// One 64-byte aligned allocation, freed on scope exit.
struct FreeDeleter {
  void operator()(void* pointer) const { std::free(pointer); }
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
Result<AlignedArray<T>> allocate_array(uint64_t count, const char* name) {
  const uint64_t size_bytes = align_up(std::max<uint64_t>(count, 1) * sizeof(T), 64);
  void* pointer = std::aligned_alloc(64, size_bytes);
  if (pointer == nullptr) {
    return make_error(ErrorKind::no_space, fmt::format("cannot allocate {} for the {} array",
                                                       format_size(size_bytes), name));
  }
  return AlignedArray<T>(static_cast<T*>(pointer));
}

// A cheap deterministic value per index, so buffers need no RNG pass and are first-touched by
// the threads that will stream them.
inline float pseudo_random(uint64_t index, uint64_t salt) {
  uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ salt;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * (1.0f / (1 << 23));
}

struct Buffers {
  uint64_t count = 0;
  AlignedArray<float> params, grads, exp_avg, exp_avg_sq;
  AlignedArray<uint16_t> copy;
};

// Every mode's starting values, written tile by tile by the calling arena's threads (first touch).
void fill_buffers(Buffers& b, bool with_copy) {
  tbb::parallel_for(tbb::blocked_range<uint64_t>(0, b.count, kernels::kAdamWTileElements),
                    [&](const tbb::blocked_range<uint64_t>& r) {
                      for (uint64_t i = r.begin(); i != r.end(); ++i) {
                        b.params[i] = pseudo_random(i, 1);
                        b.grads[i] = pseudo_random(i, 2) * 0.01f;
                        b.exp_avg[i] = pseudo_random(i, 3) * 0.001f;
                        b.exp_avg_sq[i] = std::abs(pseudo_random(i, 4)) * 1e-5f;
                        if (with_copy) b.copy[i] = 0;
                      }
                    });
}

// The reference pass: the same tiles of the same arrays, read p, g, m, v and write p, m, v and
// the 16-bit copy, with one multiply-add per array and a truncating copy — as little work per
// byte as a loop that moves these bytes can do. STREAM's own kernels (copy/scale/add/triad)
// touch 2-3 arrays; this one touches AdamW's 5 so the two are compared byte for byte.
constexpr float kStreamStep = 1.0f / 1024.0f;

void stream_tile_scalar(float* p, const float* g, float* m, float* v, uint16_t* copy, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float delta = g[i] * kStreamStep;
    p[i] += delta;
    m[i] += delta;
    v[i] += delta;
    if (copy != nullptr) {
      uint32_t bits;
      std::memcpy(&bits, &p[i], 4);
      copy[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

__attribute__((target("avx2"))) void stream_tile_avx2(float* p, const float* g, float* m, float* v,
                                                      uint16_t* copy, size_t count) {
  const __m256 step = _mm256_set1_ps(kStreamStep);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 delta = _mm256_mul_ps(_mm256_loadu_ps(g + i), step);
    const __m256 p2 = _mm256_add_ps(_mm256_loadu_ps(p + i), delta);
    _mm256_storeu_ps(p + i, p2);
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), delta));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), delta));
    if (copy != nullptr) {
      const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(p2), 16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(copy + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)));
    }
  }
  // The tail, fewer than 8 elements, the scalar way.
  stream_tile_scalar(p + i, g + i, m + i, v + i, copy != nullptr ? copy + i : nullptr, count - i);
}


void stream_pass(Buffers& b, bool with_copy, CpuIsa isa) {
  const size_t tile = kernels::kAdamWTileElements;  // the same tiles AdamW hands to TBB
  const size_t tile_count = (b.count + tile - 1) / tile;
  const auto kernel = isa == CpuIsa::avx2 ? stream_tile_avx2 : stream_tile_scalar;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tile_count, 1), [&](const tbb::blocked_range<size_t>& r) {
    const size_t begin = r.begin() * tile;
    const size_t end = std::min<size_t>(b.count, r.end() * tile);
    kernel(b.params.get() + begin, b.grads.get() + begin, b.exp_avg.get() + begin, b.exp_avg_sq.get() + begin,
           with_copy ? b.copy.get() + begin : nullptr, end - begin);
  });
}

// The elements checked after every pass: spread over the whole range, both ends included.
struct Sample {
  std::vector<uint64_t> index;
  std::vector<float> p, g, m, v;
};
Sample choose_sample(uint64_t count) {
  Sample s;
  const uint64_t wanted = std::min<uint64_t>(count, 4096);
  for (uint64_t k = 0; k < wanted; ++k) s.index.push_back(k * 2654435761ull % count);
  s.index.push_back(count - 1);
  std::sort(s.index.begin(), s.index.end());
  s.index.erase(std::unique(s.index.begin(), s.index.end()), s.index.end());
  return s;
}
void snapshot(Sample& s, const Buffers& b) {
  s.p.clear(), s.g.clear(), s.m.clear(), s.v.clear();
  for (uint64_t i : s.index) {
    s.p.push_back(b.params[i]), s.g.push_back(b.grads[i]);
    s.m.push_back(b.exp_avg[i]), s.v.push_back(b.exp_avg_sq[i]);
  }
}
bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// After an AdamW pass: every sampled element must equal the scalar element function applied to
// its snapshot, and its copy the scalar cast of the new value.
Status check_adamw(const Sample& s, const Buffers& b, const kernels::AdamWStepScalars& scalars, DType copy) {
  for (size_t k = 0; k < s.index.size(); ++k) {
    // The scalar path on one element: the reference the vector path must equal bit for bit.
    float p = s.p[k], m = s.m[k], v = s.v[k];
    uint16_t expected_copy = 0;
    kernels::adamw_step(scalars, {&p, 1}, {&s.g[k], 1}, {&m, 1}, {&v, 1},
                        kernels::ComputeCopy{copy, {&expected_copy, copy == DType::f32 ? 0u : 1u}},
                        CpuIsa::scalar);
    const uint64_t i = s.index[k];
    bool ok = same_bits(p, b.params[i]) && same_bits(m, b.exp_avg[i]) && same_bits(v, b.exp_avg_sq[i]);
    if (copy != DType::f32) ok = ok && b.copy[i] == expected_copy;
    if (!ok) {
      return make_error(ErrorKind::internal,
                        fmt::format("AdamW wrote a wrong value at element {}: param {} (expected {})", i,
                                    b.params[i], p));
    }
  }
  return Status::ok_status();
}
Status check_stream(const Sample& s, const Buffers& b, bool with_copy) {
  for (size_t k = 0; k < s.index.size(); ++k) {
    const uint64_t i = s.index[k];
    const float delta = s.g[k] * kStreamStep;
    const float p = s.p[k] + delta;
    uint32_t bits;
    std::memcpy(&bits, &p, 4);
    bool ok = same_bits(p, b.params[i]) && same_bits(s.m[k] + delta, b.exp_avg[i]) &&
              same_bits(s.v[k] + delta, b.exp_avg_sq[i]);
    if (with_copy) ok = ok && b.copy[i] == static_cast<uint16_t>(bits >> 16);
    if (!ok) return make_error(ErrorKind::internal, fmt::format("the STREAM-style pass wrote a wrong value at element {}", i));
  }
  return Status::ok_status();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

struct Figures {
  std::vector<double> seconds;
  double median_s = 0;
  double params_per_s = 0;
  double bytes_per_s = 0;
};
Figures summarise(std::vector<double> seconds, uint64_t count, uint64_t bytes) {
  Figures f;
  f.median_s = median(seconds);
  f.params_per_s = static_cast<double>(count) / f.median_s;
  f.bytes_per_s = static_cast<double>(bytes) / f.median_s;
  f.seconds = std::move(seconds);
  return f;
}
nlohmann::ordered_json to_json(const Figures& f) {
  return {{"median_s", f.median_s},
          {"min_s", *std::min_element(f.seconds.begin(), f.seconds.end())},
          {"params_per_s", f.params_per_s},
          {"gb_per_s", f.bytes_per_s / 1e9},
          {"samples_s", f.seconds}};
}

// --mode 8bit, below.
Status run_bench_adam_8bit(const BenchAdamOptions& options, DType copy, CpuIsa isa, bool with_avx512);

Status run_bench_adam(const BenchAdamOptions& options) {
  if (options.params == 0 || options.threads == 0 || options.repeats == 0) {
    return make_error(ErrorKind::invalid_argument, "--params, --threads and --repeats must be at least 1");
  }
  DType copy = DType::f32;
  if (options.copy == "bf16") copy = DType::bf16;
  else if (options.copy == "fp16") copy = DType::f16;
  else if (options.copy != "none") {
    return make_error(ErrorKind::invalid_argument, "--copy must be bf16, fp16 or none, not '" + options.copy + "'");
  }
  CpuIsa isa = CpuIsa::best;
  if (options.isa == "scalar") isa = CpuIsa::scalar;
  else if (options.isa == "avx2") isa = CpuIsa::avx2;
  else if (options.isa != "best") {
    return make_error(ErrorKind::invalid_argument, "--isa must be best, scalar or avx2, not '" + options.isa + "'");
  }
  if (isa == CpuIsa::avx2 && kernels::detect_cpu_isa() != CpuIsa::avx2) {
    return make_error(ErrorKind::unsupported, "--isa avx2: this CPU lacks AVX2/FMA/F16C");
  }
  isa = kernels::resolve_cpu_isa(isa);
  // --mode 8bit times the 8-bit AVX-512 loop as well where the CPU has it (unless --isa avx2).
  if (options.mode == "8bit") {
    return run_bench_adam_8bit(options, copy, isa, options.isa != "avx2" && kernels::cpu_has_avx512());
  }
  if (options.mode != "stream") {
    return make_error(ErrorKind::invalid_argument, "--mode must be stream or 8bit, not '" + options.mode + "'");
  }
  const bool with_copy = copy != DType::f32;

  Buffers b;
  b.count = options.params;
  STRATA_ASSIGN_OR_RETURN(b.params, allocate_array<float>(b.count, "params"));
  STRATA_ASSIGN_OR_RETURN(b.grads, allocate_array<float>(b.count, "grads"));
  STRATA_ASSIGN_OR_RETURN(b.exp_avg, allocate_array<float>(b.count, "exp_avg"));
  STRATA_ASSIGN_OR_RETURN(b.exp_avg_sq, allocate_array<float>(b.count, "exp_avg_sq"));
  STRATA_ASSIGN_OR_RETURN(b.copy, allocate_array<uint16_t>(with_copy ? b.count : 1, "compute copy"));
  // Bytes one pass moves: reads p, g, m, v; writes p, m, v and the copy.
  const uint64_t bytes_per_pass = b.count * (16 + 12 + (with_copy ? 2 : 0));

  tbb::task_arena arena(static_cast<int>(options.threads));
  arena.execute([&] {
    fill_buffers(b, with_copy);
  });
  spdlog::info("bench adam: {} params ({} per pass), {} threads, isa {}, copy {}, {} repeats",
               b.count, format_size(bytes_per_pass), options.threads, kernels::cpu_isa_name(isa),
               options.copy, options.repeats);

  const kernels::AdamWConfig config{};  // torch's defaults: lr 1e-3, betas (0.9, 0.999), wd 0.01
  int64_t step = 0;
  Sample sample = choose_sample(b.count);
  std::vector<double> adamw_s, stream_s;
  auto time_adamw = [&](bool record) -> Status {
    const auto scalars = kernels::adamw_step_scalars(config, ++step);
    snapshot(sample, b);
    const auto start = std::chrono::steady_clock::now();
    arena.execute([&] {
      kernels::adamw_step(scalars, {b.params.get(), b.count}, {b.grads.get(), b.count},
                          {b.exp_avg.get(), b.count}, {b.exp_avg_sq.get(), b.count},
                          kernels::ComputeCopy{copy, {b.copy.get(), with_copy ? b.count : 0}}, isa);
    });
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (record) adamw_s.push_back(elapsed.count());
    return check_adamw(sample, b, scalars, copy);
  };
  auto time_stream = [&](bool record) -> Status {
    snapshot(sample, b);
    const auto start = std::chrono::steady_clock::now();
    arena.execute([&] { stream_pass(b, with_copy, isa); });
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (record) stream_s.push_back(elapsed.count());
    return check_stream(sample, b, with_copy);
  };
  // One untimed pass of each warms the arena's threads and the TLB; then alternate, swapping
  // which goes first each round so a drift in the machine's speed hits both equally.
  STRATA_RETURN_IF_ERROR(time_stream(false));
  STRATA_RETURN_IF_ERROR(time_adamw(false));
  for (unsigned r = 0; r < options.repeats; ++r) {
    if (r % 2 == 0) {
      STRATA_RETURN_IF_ERROR(time_stream(true));
      STRATA_RETURN_IF_ERROR(time_adamw(true));
    } else {
      STRATA_RETURN_IF_ERROR(time_adamw(true));
      STRATA_RETURN_IF_ERROR(time_stream(true));
    }
  }
  const Figures adamw = summarise(adamw_s, b.count, bytes_per_pass);
  const Figures stream = summarise(stream_s, b.count, bytes_per_pass);
  const double ratio = stream.median_s / adamw.median_s;  // AdamW speed as a fraction of the pass's

  if (options.json) {
    nlohmann::ordered_json json = {{"params", b.count},
                                   {"threads", options.threads},
                                   {"repeats", options.repeats},
                                   {"isa", kernels::cpu_isa_name(isa)},
                                   {"copy", options.copy},
                                   {"bytes_per_pass", bytes_per_pass},
                                   {"adamw", to_json(adamw)},
                                   {"stream", to_json(stream)},
                                   {"adamw_vs_stream", ratio},
                                   {"checked_elements_per_pass", sample.index.size()}};
    fmt::print("{}\n", json.dump());
  } else {
    fmt::print("{} params, {} threads, isa {}, copy {}, {} moved per pass, median of {}\n", b.count,
               options.threads, kernels::cpu_isa_name(isa), options.copy, format_size(bytes_per_pass),
               options.repeats);
    fmt::print("  {:<22} {:>10} {:>14} {:>10}\n", "pass", "median s", "params/s", "GB/s");
    fmt::print("  {:<22} {:>10.4f} {:>14.4g} {:>10.2f}\n", "AdamW (+copy)", adamw.median_s, adamw.params_per_s,
               adamw.bytes_per_s / 1e9);
    fmt::print("  {:<22} {:>10.4f} {:>14.4g} {:>10.2f}\n", "STREAM-style, same bytes", stream.median_s,
               stream.params_per_s, stream.bytes_per_s / 1e9);
    fmt::print("  AdamW / STREAM-style: {:.3f}x (1.0 = AdamW at memory speed); {} elements checked per pass\n",
               ratio, sample.index.size());
  }
  return Status::ok_status();
}

// --- --mode 8bit: the 8-bit AdamW against fp32 AdamW and a CPUAdam reimplementation -----------

// DeepSpeed's CPUAdam step (csrc/includes/cpu_adam.h, Adam_Optimizer::Step_AVX with span 8,
// adamw_mode, bias correction), written again here so the bench needs no DeepSpeed build: per
// 8 lanes m = fma(g, 1-b1, m*b1); v = fma(g*g, 1-b2, v*b2); u = m / fma(sqrt(v), 1/sqrt(bc2), eps);
// p = fma(p, -lr*wd, p); p = fma(u, -lr/bc1, p). Its OpenMP loop splits each tile statically
// into contiguous runs of 64 elements per thread; a static TBB partition does the same. Its
// fp32 constants are computed as DeepSpeed computes them (floats, std::pow for beta^t).
struct CpuAdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, bias2_sqrt_inv, eps, step_size, w_decay;
};
CpuAdamScalars cpu_adam_scalars(const kernels::AdamWConfig& config, int64_t step) {
  CpuAdamScalars s{};
  s.beta1 = static_cast<float>(config.beta1);
  s.beta2 = static_cast<float>(config.beta2);
  s.one_minus_beta1 = 1.0f - s.beta1;
  s.one_minus_beta2 = 1.0f - s.beta2;
  const float beta1_t = static_cast<float>(std::pow(s.beta1, static_cast<float>(step)));
  const float beta2_t = static_cast<float>(std::pow(s.beta2, static_cast<float>(step)));
  s.bias2_sqrt_inv = static_cast<float>(1.0 / std::sqrt(1.0f - beta2_t));
  s.eps = static_cast<float>(config.eps);
  s.step_size = -1.0f * static_cast<float>(config.lr) / (1.0f - beta1_t);
  s.w_decay = -1.0f * static_cast<float>(config.lr) * static_cast<float>(config.weight_decay);
  return s;
}

inline void cpu_adam_element(const CpuAdamScalars& s, float g, float& p, float& m, float& v) {
  m = std::fma(g, s.one_minus_beta1, m * s.beta1);
  v = std::fma(g * g, s.one_minus_beta2, v * s.beta2);
  const float update = m / std::fma(std::sqrt(v), s.bias2_sqrt_inv, s.eps);
  p = std::fma(p, s.w_decay, p);
  p = std::fma(update, s.step_size, p);
}

__attribute__((target("avx2,fma"))) void cpu_adam_tile_avx2(const CpuAdamScalars& s, float* p, const float* g,
                                                             float* m, float* v, size_t count) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1), beta2 = _mm256_set1_ps(s.beta2);
  const __m256 omb1 = _mm256_set1_ps(s.one_minus_beta1), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 bias2 = _mm256_set1_ps(s.bias2_sqrt_inv), eps = _mm256_set1_ps(s.eps);
  const __m256 step_size = _mm256_set1_ps(s.step_size), w_decay = _mm256_set1_ps(s.w_decay);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 grad = _mm256_loadu_ps(g + i);
    const __m256 mom = _mm256_fmadd_ps(grad, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), beta1));
    const __m256 var = _mm256_fmadd_ps(_mm256_mul_ps(grad, grad), omb2, _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    const __m256 update = _mm256_div_ps(mom, _mm256_fmadd_ps(_mm256_sqrt_ps(var), bias2, eps));
    __m256 param = _mm256_loadu_ps(p + i);
    param = _mm256_fmadd_ps(param, w_decay, param);
    param = _mm256_fmadd_ps(update, step_size, param);
    _mm256_storeu_ps(p + i, param);
    _mm256_storeu_ps(m + i, mom);
    _mm256_storeu_ps(v + i, var);
  }
  for (; i < count; ++i) cpu_adam_element(s, g[i], p[i], m[i], v[i]);
}

void cpu_adam_pass(const CpuAdamScalars& s, Buffers& b) {
  constexpr uint64_t kRun = 64;  // SIMD_WIDTH * span: the unit OpenMP hands out
  const uint64_t runs = (b.count + kRun - 1) / kRun;
  tbb::parallel_for(
      tbb::blocked_range<uint64_t>(0, runs),
      [&](const tbb::blocked_range<uint64_t>& r) {
        const uint64_t begin = r.begin() * kRun;
        const uint64_t end = std::min(b.count, r.end() * kRun);
        cpu_adam_tile_avx2(s, b.params.get() + begin, b.grads.get() + begin, b.exp_avg.get() + begin,
                           b.exp_avg_sq.get() + begin, end - begin);
      },
      tbb::static_partitioner());
}

Status check_cpu_adam(const Sample& sample, const Buffers& b, const CpuAdamScalars& s) {
  for (size_t k = 0; k < sample.index.size(); ++k) {
    float p = sample.p[k], m = sample.m[k], v = sample.v[k];
    cpu_adam_element(s, sample.g[k], p, m, v);
    const uint64_t i = sample.index[k];
    if (!same_bits(p, b.params[i]) || !same_bits(m, b.exp_avg[i]) || !same_bits(v, b.exp_avg_sq[i])) {
      return make_error(ErrorKind::internal, fmt::format("the CPUAdam pass wrote a wrong value at element {}", i));
    }
  }
  return Status::ok_status();
}

// The 8-bit state of the whole range, and the blocks checked after every 8-bit pass.
struct State8bit {
  AlignedArray<uint8_t> m_codes, v_codes;
  AlignedArray<float> m_absmax, v_absmax;
  uint64_t blocks = 0;
};
struct BlockSample {
  std::vector<uint64_t> blocks;
  std::vector<float> params, grads, m_absmax, v_absmax;
  std::vector<uint8_t> m_codes, v_codes;
};
void snapshot_blocks(BlockSample& s, const Buffers& b, const State8bit& st) {
  const uint64_t bs = kernels::kAdamW8bitBlockElements;
  s.params.clear(), s.grads.clear(), s.m_codes.clear(), s.v_codes.clear(), s.m_absmax.clear(), s.v_absmax.clear();
  for (uint64_t block : s.blocks) {
    const uint64_t begin = block * bs, end = std::min(b.count, begin + bs);
    s.params.insert(s.params.end(), b.params.get() + begin, b.params.get() + end);
    s.grads.insert(s.grads.end(), b.grads.get() + begin, b.grads.get() + end);
    s.m_codes.insert(s.m_codes.end(), st.m_codes.get() + begin, st.m_codes.get() + end);
    s.v_codes.insert(s.v_codes.end(), st.v_codes.get() + begin, st.v_codes.get() + end);
    s.m_absmax.push_back(st.m_absmax[block]);
    s.v_absmax.push_back(st.v_absmax[block]);
  }
}
// Every sampled block, stepped again by the scalar path from its snapshot, must equal what the
// timed pass wrote: params, copy, codes and absmax.
Status check_8bit(BlockSample& s, const Buffers& b, const State8bit& st, const kernels::AdamWStepScalars& scalars,
                  DType copy) {
  const uint64_t bs = kernels::kAdamW8bitBlockElements;
  uint64_t offset = 0;
  for (size_t k = 0; k < s.blocks.size(); ++k) {
    const uint64_t begin = s.blocks[k] * bs, n = std::min(b.count, begin + bs) - begin;
    std::vector<uint16_t> expected_copy(n);
    const kernels::AdamW8bitState state{{s.params.data() + offset, n},
                                        {s.m_codes.data() + offset, n},
                                        {s.v_codes.data() + offset, n},
                                        {&s.m_absmax[k], 1},
                                        {&s.v_absmax[k], 1},
                                        bs};
    kernels::adamw8bit_step(scalars, state, {s.grads.data() + offset, n},
                            kernels::ComputeCopy{copy, {expected_copy.data(), copy == DType::f32 ? 0 : n}},
                            CpuIsa::scalar);
    bool ok = std::memcmp(s.params.data() + offset, b.params.get() + begin, n * 4) == 0 &&
              std::memcmp(s.m_codes.data() + offset, st.m_codes.get() + begin, n) == 0 &&
              std::memcmp(s.v_codes.data() + offset, st.v_codes.get() + begin, n) == 0 &&
              same_bits(s.m_absmax[k], st.m_absmax[s.blocks[k]]) && same_bits(s.v_absmax[k], st.v_absmax[s.blocks[k]]);
    if (copy != DType::f32) ok = ok && std::memcmp(expected_copy.data(), b.copy.get() + begin, n * 2) == 0;
    if (!ok) return make_error(ErrorKind::internal, fmt::format("the 8-bit AdamW wrote a wrong block {}", s.blocks[k]));
    offset += n;
  }
  return Status::ok_status();
}

Status run_bench_adam_8bit(const BenchAdamOptions& options, DType copy, CpuIsa isa, bool with_avx512) {
  if (isa != CpuIsa::avx2) {
    return make_error(ErrorKind::unsupported,
                      "--mode 8bit compares AVX2 kernels: it needs --isa best or avx2 on an AVX2 CPU");
  }
  const bool with_copy = copy != DType::f32;
  Buffers b;
  b.count = options.params;
  State8bit st;
  st.blocks = kernels::adamw8bit_block_count(b.count);
  STRATA_ASSIGN_OR_RETURN(b.params, allocate_array<float>(b.count, "params"));
  STRATA_ASSIGN_OR_RETURN(b.grads, allocate_array<float>(b.count, "grads"));
  STRATA_ASSIGN_OR_RETURN(b.exp_avg, allocate_array<float>(b.count, "exp_avg"));
  STRATA_ASSIGN_OR_RETURN(b.exp_avg_sq, allocate_array<float>(b.count, "exp_avg_sq"));
  STRATA_ASSIGN_OR_RETURN(b.copy, allocate_array<uint16_t>(with_copy ? b.count : 1, "compute copy"));
  STRATA_ASSIGN_OR_RETURN(st.m_codes, allocate_array<uint8_t>(b.count, "exp_avg codes"));
  STRATA_ASSIGN_OR_RETURN(st.v_codes, allocate_array<uint8_t>(b.count, "exp_avg_sq codes"));
  STRATA_ASSIGN_OR_RETURN(st.m_absmax, allocate_array<float>(st.blocks, "exp_avg absmax"));
  STRATA_ASSIGN_OR_RETURN(st.v_absmax, allocate_array<float>(st.blocks, "exp_avg_sq absmax"));
  const kernels::AdamW8bitState state8{{b.params.get(), b.count},
                                       {st.m_codes.get(), b.count},
                                       {st.v_codes.get(), b.count},
                                       {st.m_absmax.get(), st.blocks},
                                       {st.v_absmax.get(), st.blocks},
                                       kernels::kAdamW8bitBlockElements};
  // Bytes per pass. fp32 moments: read p, g, m, v; write p, m, v. 8-bit: read p, g and two
  // codes; write p and two codes (the absmax, 8 bytes per 256 elements, left out). Plus the copy.
  const uint64_t copy_bytes = with_copy ? 2 : 0;
  const uint64_t fp32_bytes = b.count * (28 + copy_bytes);
  const uint64_t bytes_8bit = b.count * (16 + copy_bytes);

  tbb::task_arena arena(static_cast<int>(options.threads));
  arena.execute([&] {
    fill_buffers(b, with_copy);
    kernels::adamw8bit_init(state8);
  });
  spdlog::info("bench adam --mode 8bit: {} params, {} threads, copy {}, {} repeats", b.count, options.threads,
               options.copy, options.repeats);

  const kernels::AdamWConfig config{};
  int64_t step_fp32 = 0, step_8bit = 0, step_cpu_adam = 0;
  Sample sample = choose_sample(b.count);
  BlockSample blocks;
  for (uint64_t k = 0; k < std::min<uint64_t>(st.blocks, 64); ++k) {
    blocks.blocks.push_back(k * 2654435761ull % st.blocks);
  }
  blocks.blocks.push_back(st.blocks - 1);
  std::sort(blocks.blocks.begin(), blocks.blocks.end());
  blocks.blocks.erase(std::unique(blocks.blocks.begin(), blocks.blocks.end()), blocks.blocks.end());
  std::vector<double> fp32_s, s8bit_s, s8bit_avx512_s, cpu_adam_s;
  const auto timed = [&](auto&& body) {
    const auto start = std::chrono::steady_clock::now();
    arena.execute(body);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return elapsed.count();
  };
  auto time_fp32 = [&](bool record) -> Status {
    const auto scalars = kernels::adamw_step_scalars(config, ++step_fp32);
    snapshot(sample, b);
    const double s = timed([&] {
      kernels::adamw_step(scalars, {b.params.get(), b.count}, {b.grads.get(), b.count}, {b.exp_avg.get(), b.count},
                          {b.exp_avg_sq.get(), b.count},
                          kernels::ComputeCopy{copy, {b.copy.get(), with_copy ? b.count : 0}}, isa);
    });
    if (record) fp32_s.push_back(s);
    return check_adamw(sample, b, scalars, copy);
  };
  auto time_8bit = [&](bool record, CpuIsa isa8, std::vector<double>& seconds) -> Status {
    const auto scalars = kernels::adamw_step_scalars(config, ++step_8bit);
    snapshot_blocks(blocks, b, st);
    const double s = timed([&] {
      kernels::adamw8bit_step(scalars, state8, {b.grads.get(), b.count},
                              kernels::ComputeCopy{copy, {b.copy.get(), with_copy ? b.count : 0}}, isa8);
    });
    if (record) seconds.push_back(s);
    return check_8bit(blocks, b, st, scalars, copy);
  };
  auto time_cpu_adam = [&](bool record) -> Status {
    const auto scalars = cpu_adam_scalars(config, ++step_cpu_adam);
    snapshot(sample, b);
    const double s = timed([&] { cpu_adam_pass(scalars, b); });
    if (record) cpu_adam_s.push_back(s);
    return check_cpu_adam(sample, b, scalars);
  };
  // The 8-bit passes share one state (each checks its own blocks against the scalar path).
  // Warm each once, then rotate which goes first each round so drift hits all alike.
  const unsigned passes = with_avx512 ? 4 : 3;
  const auto time_pass = [&](unsigned which, bool record) -> Status {
    switch (which) {
      case 0: return time_cpu_adam(record);
      case 1: return time_fp32(record);
      case 2: return time_8bit(record, isa, s8bit_s);
      default: return time_8bit(record, CpuIsa::avx512, s8bit_avx512_s);
    }
  };
  for (unsigned which = 0; which < passes; ++which) STRATA_RETURN_IF_ERROR(time_pass(which, false));
  for (unsigned r = 0; r < options.repeats; ++r) {
    for (unsigned k = 0; k < passes; ++k) STRATA_RETURN_IF_ERROR(time_pass((r + k) % passes, true));
  }
  // CPUAdam writes no compute copy: its bytes are the fp32 pass's without it.
  const Figures cpu_adam = summarise(cpu_adam_s, b.count, b.count * 28);
  const Figures fp32 = summarise(fp32_s, b.count, fp32_bytes);
  const Figures eight = summarise(s8bit_s, b.count, bytes_8bit);
  const double vs_cpu_adam = cpu_adam.median_s / eight.median_s;
  const double vs_fp32 = fp32.median_s / eight.median_s;
  const Figures eight512 = with_avx512 ? summarise(s8bit_avx512_s, b.count, bytes_8bit) : Figures{};
  if (options.json) {
    nlohmann::ordered_json json = {{"params", b.count},
                                   {"threads", options.threads},
                                   {"repeats", options.repeats},
                                   {"copy", options.copy},
                                   {"adamw8bit", to_json(eight)},
                                   {"adamw_fp32", to_json(fp32)},
                                   {"cpu_adam", to_json(cpu_adam)},
                                   {"adamw8bit_vs_cpu_adam", vs_cpu_adam},
                                   {"adamw8bit_vs_fp32", vs_fp32},
                                   {"checked_blocks_per_8bit_pass", blocks.blocks.size()}};
    if (with_avx512) {
      json["adamw8bit_avx512"] = to_json(eight512);
      json["adamw8bit_avx512_vs_cpu_adam"] = cpu_adam.median_s / eight512.median_s;
      json["adamw8bit_avx512_vs_fp32"] = fp32.median_s / eight512.median_s;
    }
    fmt::print("{}\n", json.dump());
  } else {
    fmt::print("{} params, {} threads, copy {} (strata's passes; CPUAdam writes none), median of {}\n", b.count,
               options.threads, options.copy, options.repeats);
    fmt::print("  {:<30} {:>10} {:>14} {:>10}\n", "pass", "median s", "params/s", "GB/s");
    fmt::print("  {:<30} {:>10.4f} {:>14.4g} {:>10.2f}\n", "8-bit AdamW (block 256, avx2)", eight.median_s,
               eight.params_per_s, eight.bytes_per_s / 1e9);
    if (with_avx512) {
      fmt::print("  {:<30} {:>10.4f} {:>14.4g} {:>10.2f}\n", "8-bit AdamW (block 256, avx512)", eight512.median_s,
                 eight512.params_per_s, eight512.bytes_per_s / 1e9);
    }
    fmt::print("  {:<30} {:>10.4f} {:>14.4g} {:>10.2f}\n", "fp32 AdamW (strata)", fp32.median_s, fp32.params_per_s,
               fp32.bytes_per_s / 1e9);
    fmt::print("  {:<30} {:>10.4f} {:>14.4g} {:>10.2f}\n", "CPUAdam (DeepSpeed, reimpl.)", cpu_adam.median_s,
               cpu_adam.params_per_s, cpu_adam.bytes_per_s / 1e9);
    fmt::print("  8-bit / CPUAdam: {:.3f}x params/s; 8-bit / fp32 AdamW: {:.3f}x; {} blocks checked per 8-bit pass\n",
               vs_cpu_adam, vs_fp32, blocks.blocks.size());
    if (with_avx512) {
      fmt::print("  8-bit avx512 / CPUAdam: {:.3f}x params/s; 8-bit avx512 / fp32 AdamW: {:.3f}x\n",
                 cpu_adam.median_s / eight512.median_s, fp32.median_s / eight512.median_s);
    }
  }
  return Status::ok_status();
}

}  // namespace

void add_bench_adam_command(CLI::App& bench, CliState& state) {
  auto options = std::make_shared<BenchAdamOptions>();
  CLI::App* command = bench.add_subcommand(
      "adam",
      "CPU AdamW over N fp32 params (emitting the bf16 copy) against a STREAM-style pass over the same "
      "bytes, alternately; prints the medians, params/s, GB/s and their ratio.");
  command->add_option("--params", options->params, "number of fp32 parameters")->capture_default_str();
  command->add_option("--threads", options->threads, "TBB threads for both passes")->capture_default_str();
  command->add_option("--repeats", options->repeats, "timed passes of each kind (medians reported)")
      ->capture_default_str();
  command->add_option("--copy", options->copy, "compute copy written in the same pass: bf16, fp16 or none")
      ->capture_default_str();
  command->add_option("--isa", options->isa,
                      "best, scalar or avx2 (every pass; --mode 8bit also times its AVX-512 loop where the CPU has it, "
                      "unless avx2)")->capture_default_str();
  command->add_option("--mode", options->mode,
                      "stream: AdamW vs a STREAM-style pass; 8bit: 8-bit block-wise AdamW vs fp32 AdamW vs "
                      "a CPUAdam (DeepSpeed) reimplementation")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print one JSON object on stdout");
  command->callback([options, &state] {
    const Status status = run_bench_adam(*options);
    if (!status.ok()) state.exit_code = report_error(status.error());
  });
}

}  // namespace strata::cli
