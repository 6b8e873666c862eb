// strata/kernels/compute_threads.cpp — STRATA_THREADS as TBB's max_allowed_parallelism; the
// OpenBLAS core check.
#include "kernels/compute_threads.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include <string_view>

#include <cblas.h>
#include <fmt/format.h>
#include <oneapi/tbb/global_control.h>

namespace strata::kernels {

struct ComputeThreadLimit::Control {
  explicit Control(int threads) : control(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads)) {}
  tbb::global_control control;
};

ComputeThreadLimit::ComputeThreadLimit(int threads) : control_(std::make_unique<Control>(threads)) {}

ComputeThreadLimit::~ComputeThreadLimit() = default;

Result<std::unique_ptr<ComputeThreadLimit>> limit_compute_threads_from_env() {
  const char* text = std::getenv("STRATA_THREADS");
  if (text == nullptr || *text == '\0') return std::unique_ptr<ComputeThreadLimit>();
  errno = 0;
  char* end = nullptr;
  const long threads = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || threads < 1 || threads > 4096)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("environment variable STRATA_THREADS: '{}' is not a thread count; expected an "
                                  "integer from 1 to 4096 (or unset: every core)",
                                  text));
  return std::unique_ptr<ComputeThreadLimit>(new ComputeThreadLimit(static_cast<int>(threads)));
}

BlasCoreAdvice blas_core_advice() {
  BlasCoreAdvice advice{.picked = openblas_get_corename()};
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return advice;  // the user chose
  // OpenBLAS's names for x86 cores whose kernels predate AVX2.
  static constexpr std::array<std::string_view, 12> kPreAvx2 = {
      "prescott", "core2", "penryn", "dunnington", "nehalem", "sandybridge",
      "atom",     "katmai", "coppermine", "northwood", "banias", "unknown"};
  std::string name = advice.picked;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (std::find(kPreAvx2.begin(), kPreAvx2.end(), name) == kPreAvx2.end()) return advice;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
    advice.better = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    advice.better = "Haswell";
  return advice;
}

}  // namespace strata::kernels
