// strata/io/fault_engine.h — an engine that injects faults, for tests of everything above
// the I/O layer (the NVMe store's ENOSPC and EIO handling) and of the engine core itself.
//
// What it is: the ordinary engine core over a real backend (uring, aio or psync, as the
// config says) with a fault layer between the two. The core's splitting, bounce, resubmit,
// retry and error-mapping code runs exactly as in production; only the raw results of
// backend pieces are altered, the way a failing drive or a full filesystem would alter them.
//
// Faults (all off by default; any combination):
//  - EIO: a piece whose file range contains `eio.file_offset_bytes` (in a file whose path
//    contains `eio.path_contains`, and of the given direction) fails with `eio.errno_value`
//    (EIO unless set) without touching the disk or the buffer.
//  - Short transfers: every piece reports at most `short_transfer_max_bytes` moved (the
//    real I/O moved them all, as a real short transfer leaves the bytes past the count
//    undefined); the core must resubmit the rest.
//  - ENOSPC: writes may move `write_budget_bytes` in total; the write that crosses the
//    budget reports a short count, later writes fail with ENOSPC without touching the disk.
//  - EAGAIN: every `eagain_every_n_pieces`-th piece fails once with EAGAIN (retry path).
//  - Delay: each reap that returns completions first sleeps `delay_us`.
//
// Threads: the engine belongs to one thread like any engine; `FaultPlan` may be read and
// changed from any thread (a mutex) — tests flip rules between requests.
// Offsets are file offsets (what a drive sees), not logical offsets of a striped volume.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "io/io.h"

namespace strata::io {

struct FaultRules {
  struct Eio {
    uint64_t file_offset_bytes = 0;
    std::string path_contains;  // empty: any file
    bool on_reads = true;
    bool on_writes = true;
    int errno_value = 0;        // 0: EIO
  };
  std::optional<Eio> eio;
  uint32_t short_transfer_max_bytes = 0;      // 0: off
  std::optional<uint64_t> write_budget_bytes; // unset: unlimited
  uint32_t eagain_every_n_pieces = 0;         // 0: off
  uint32_t delay_us = 0;
};

struct FaultCounters {
  uint64_t eio_injected = 0;
  uint64_t short_transfers_injected = 0;
  uint64_t enospc_injected = 0;
  uint64_t eagain_injected = 0;
  uint64_t bytes_written = 0;  // counted against write_budget_bytes
};

class FaultPlan {
 public:
  FaultPlan() = default;
  explicit FaultPlan(FaultRules rules) : rules_(std::move(rules)) {}
  void set_rules(FaultRules rules) {
    std::lock_guard lock(mutex_);
    rules_ = std::move(rules);
  }
  FaultRules rules() const {
    std::lock_guard lock(mutex_);
    return rules_;
  }
  FaultCounters counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }
  // The fault layer's hooks (internal): each takes the lock once.
  template <typename F>
  auto with_state(F&& f) {
    std::lock_guard lock(mutex_);
    return f(rules_, counters_);
  }

 private:
  mutable std::mutex mutex_;
  FaultRules rules_;
  FaultCounters counters_;
};

// An engine of `config.backend` whose pieces pass through `plan`'s faults. The plan is
// shared: the test keeps a pointer to change rules and read counters.
[[nodiscard]] Result<std::unique_ptr<Engine>> make_fault_engine(const EngineConfig& config,
                                                               std::shared_ptr<FaultPlan> plan);

}  // namespace strata::io
