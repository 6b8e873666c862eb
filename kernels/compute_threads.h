// strata/kernels/compute_threads.h — how many threads the CPU kernels may use.
//
// The CPU kernels fan out through Intel TBB's one shared pool, which takes every core unless
// told otherwise. `STRATA_THREADS=N` (an integer from 1 to 4096) caps it for the process: the
// strata binary reads it once at start-up and holds the cap until it exits.
//
// Why a cap exists: a box shared with other jobs, and ThreadSanitizer. Debian's libtbb is not
// built with -fsanitize=thread, so the hand-off of a task from the thread that spawns it to the
// worker that runs it happens inside the library where TSan cannot see it, and every buffer a
// kernel reads on a worker looks like a race. With STRATA_THREADS=1 TBB starts no worker thread:
// each kernel runs on the thread that calls it, and what TSan checks is strata's own threads
// (scheduler pump, I/O thread, device streams, monitor server) with no suppression needed
// (scripts/sanitize.sh; docs/reliability.md).
//
// Threads: call from main before any kernel runs; the returned object must outlive every kernel call.
#pragma once

#include <memory>

#include "common/status.h"

namespace strata::kernels {

class ComputeThreadLimit {
 public:
  ~ComputeThreadLimit();
  ComputeThreadLimit(const ComputeThreadLimit&) = delete;
  ComputeThreadLimit& operator=(const ComputeThreadLimit&) = delete;

 private:
  friend Result<std::unique_ptr<ComputeThreadLimit>> limit_compute_threads_from_env();
  struct Control;
  explicit ComputeThreadLimit(int threads);
  std::unique_ptr<Control> control_;
};

// nullptr when STRATA_THREADS is unset or empty; an error naming the variable when it is not an
// integer in [1, 4096].
[[nodiscard]] Result<std::unique_ptr<ComputeThreadLimit>> limit_compute_threads_from_env();

}  // namespace strata::kernels
