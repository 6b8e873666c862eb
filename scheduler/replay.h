// strata/scheduler/replay.h — the scheduler's residency model (residency.h) driven on a
// simulated clock instead of threads: what `strata plan` uses to predict the bytes a step
// moves and how long it takes, from the same decisions the Scheduler makes.
//
// The simulated driver does what the Scheduler's pump, I/O thread, copy streams and the
// trainer's loop do, with time instead of work:
//   - memory: a device arena and a pinned host arena on the same best-fit range allocator the
//     real arenas use (memory/allocator.h), so fragmentation refusals happen as they do; the
//     caller's device scratch is taken first, as the trainer does before creating the scheduler;
//   - NVMe: one drive, commands served in the order issued at the given read / write
//     bandwidths (the residency keeps at most `io_queue_tensors` of them in flight, as the real
//     I/O thread does); host↔device copies: one serial server per direction;
//   - the caller: acquires the plan's steps in order, each as soon as it is ready, holds it for
//     its compute time, releases it, and goes on (one step held at a time, as the trainer on the
//     CPU device, whose kernels run on the calling thread).
// After every completion and release a pass runs, as the pump does after each wake-up.
//
// Where the real scheduler can differ: its passes run whenever its threads get to them, so
// completions that the replay sees one at a time may reach the pump together (and the other
// way round). Decisions that depend on what is in flight at a pass — which victim goes, whether
// a read-ahead finds room — can then differ; the bytes of a whole iteration stay close (the
// tests bound it), the decisions' rules are the same code.
//
// Pure computation, no threads; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "scheduler/residency.h"
#include "scheduler/scheduler.h"

namespace strata::scheduler {

struct ReplayTiming {
  std::vector<double> compute_s;   // per plan step: how long the caller holds it
  double read_bytes_per_s = 2e9;   // NVMe
  double write_bytes_per_s = 1.5e9;
  double h2d_bytes_per_s = 0;      // 0: a copy takes no time
  double d2h_bytes_per_s = 0;
};

struct ReplayMemory {
  uint64_t device_budget_bytes = 0;    // the device arena's capacity
  uint64_t device_external_bytes = 0;  // the caller's scratch, taken before the scheduler starts
  uint64_t host_arena_bytes = 0;       // the pinned arena (≥ the host budget)
  uint64_t alignment_bytes = 4096;     // of both arenas and every tensor
};

struct ReplayResult {
  // Over the counted iterations, per TierPair (the Scheduler's SchedulerStats::transfers).
  uint64_t bytes[kTierPairCount] = {};
  uint64_t transfers[kTierPairCount] = {};
  double iteration_s = 0;   // simulated seconds per counted iteration
  double stall_s = 0;       // per counted iteration: the caller waiting for a step
  double compute_s = 0;     // per counted iteration: the sum of the steps' compute
  ResidencyCounters counters;  // over the whole replay
};

// Runs `warm_iterations` unmeasured (the tiers fill, as at the start of a run), then
// `counted_iterations` measured. Errors: a plan the options refuse, or a replay that can make no
// progress (which the real scheduler would report as a stall that never ends), naming the step.
[[nodiscard]] Result<ReplayResult> replay_plan(const AccessPlan& plan, const SchedulerOptions& options,
                                               const ReplayMemory& memory, const ReplayTiming& timing,
                                               uint32_t warm_iterations = 1, uint32_t counted_iterations = 1);

}  // namespace strata::scheduler
