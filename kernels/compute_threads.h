// strata/kernels/compute_threads.h — how many threads the CPU kernels may use, and which of
// OpenBLAS's kernels they run.
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
// OpenBLAS picks its kernels for the CPU once, when the library loads (before main), and reads
// OPENBLAS_CORETYPE only then. Debian 12's 0.3.21 does not know recent Xeons (cpuid family 6
// model 207, a cloud VM's) and falls back to its SSE3 "Prescott" kernels: measured there, a
// 4-layer 384-wide demo model trains at 805 tok/s on Prescott and 1831 with OPENBLAS_CORETYPE=SkylakeX.
// blas_core_advice() says which core the CPU should have had; the CLI re-executes itself once
// with the variable set (apps/cli/main.cpp). Only the CLI runs GEMMs (libstrata's store,
// scheduler and optimizer do not), so nothing else needs it.
//
// Threads: call from main before any kernel runs; the returned object must outlive every kernel call.
#pragma once

#include <memory>
#include <string>

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

struct BlasCoreAdvice {
  std::string picked;            // openblas_get_corename()
  const char* better = nullptr;  // the OPENBLAS_CORETYPE to run with; null: OpenBLAS's pick is fine
};
// `better` is set when OPENBLAS_CORETYPE is unset, OpenBLAS picked a core without AVX2 kernels,
// and this CPU has AVX-512 F/BW/DQ/VL/CD ("SkylakeX") or AVX2+FMA ("Haswell").
[[nodiscard]] BlasCoreAdvice blas_core_advice();

}  // namespace strata::kernels
