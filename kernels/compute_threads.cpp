// strata/kernels/compute_threads.cpp — STRATA_THREADS as TBB's max_allowed_parallelism.
#include "kernels/compute_threads.h"

#include <cerrno>
#include <cstdlib>

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

}  // namespace strata::kernels
