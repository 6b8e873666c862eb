// strata/scheduler/replay.cpp — the residency model on a simulated clock (see replay.h).
#include "scheduler/replay.h"

#include <algorithm>
#include <map>
#include <queue>

#include <fmt/format.h>

#include "memory/allocator.h"

namespace strata::scheduler {
namespace {

// The two arenas, simulated on the real arenas' allocator: the same best-fit placement, so
// the same fragmentation.
class SimulatedMemory final : public ResidencyMemory {
 public:
  SimulatedMemory(const ReplayMemory& memory, size_t tensors)
      : device_(std::max<uint64_t>(memory.device_budget_bytes, memory.alignment_bytes), memory.alignment_bytes),
        host_(std::max<uint64_t>(memory.host_arena_bytes, memory.alignment_bytes), memory.alignment_bytes),
        device_blocks_(tensors), host_blocks_(tensors) {}

  Status take_external(uint64_t bytes) {
    if (bytes == 0) return Status();
    STRATA_ASSIGN_OR_RETURN(external_, device_.allocate(bytes));
    return Status();
  }

  uint64_t allocate(Tier tier, TensorId tensor, uint64_t size_bytes) override {
    memory::RangeAllocator& arena = tier == Tier::device ? device_ : host_;
    Result<memory::Block> block = arena.allocate(size_bytes);
    if (!block.ok()) return 0;
    (tier == Tier::device ? device_blocks_ : host_blocks_)[tensor] = *block;
    return block->size_bytes;
  }
  void free(Tier tier, TensorId tensor) override {
    (tier == Tier::device ? device_ : host_).free((tier == Tier::device ? device_blocks_ : host_blocks_)[tensor]);
  }
  uint64_t device_used_bytes() const override { return device_.stats().used_bytes; }
  uint64_t device_budget_bytes() const override { return device_.capacity_bytes(); }

 private:
  memory::RangeAllocator device_, host_;
  std::vector<memory::Block> device_blocks_, host_blocks_;
  memory::Block external_{};
};

struct Event {
  double time;
  uint64_t order;  // ties: in the order issued
  ResidencyCommand command;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : order > other.order;
  }
};

TierPair pair_of(CommandKind kind) {
  switch (kind) {
    case CommandKind::h2d: return TierPair::host_to_device;
    case CommandKind::d2h: return TierPair::device_to_host;
    case CommandKind::nvme_read: return TierPair::nvme_to_host;
    case CommandKind::nvme_write: return TierPair::host_to_nvme;
  }
  return TierPair::nvme_to_host;
}

}  // namespace

Result<ReplayResult> replay_plan(const AccessPlan& plan, const SchedulerOptions& options_in,
                                 const ReplayMemory& memory_spec, const ReplayTiming& timing,
                                 uint32_t warm_iterations, uint32_t counted_iterations) {
  STRATA_RETURN_IF_ERROR(plan.validate());
  if (timing.compute_s.size() != plan.step_count())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("replay: {} compute times for a plan of {} steps", timing.compute_s.size(),
                                  plan.step_count()));
  SchedulerOptions options = options_in;
  if (options.io_queue_tensors == 0) options.io_queue_tensors = 1;
  if (options.copies_in_flight == 0) options.copies_in_flight = 1;
  options.on_allocate = nullptr;
  options.record_evictions = false;
  SimulatedMemory memory(memory_spec, plan.tensors().size());
  STRATA_RETURN_IF_ERROR(memory.take_external(memory_spec.device_external_bytes));
  Residency residency(plan, options, memory, memory_spec.alignment_bytes);
  STRATA_RETURN_IF_ERROR(residency.place_host_homed());

  const size_t n = plan.step_count();
  const uint64_t first_counted = uint64_t{warm_iterations} * n;
  const uint64_t end_abs = first_counted + uint64_t{counted_iterations} * n;
  ReplayResult result;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t order = 0;
  double now = 0, io_free = 0, h2d_free = 0, d2h_free = 0;
  double window_start = -1, wait_since = 0, stall = 0, compute = 0;
  bool holding = false;
  size_t held_step = 0;
  // A bound on the work of one replay: far above any plan's (a few transfers per tensor and
  // step), it turns a livelock of the policy into an error instead of a hang.
  const uint64_t kMaxEvents = 64 * (uint64_t{warm_iterations} + counted_iterations + 1) * n * (plan.tensors().size() + 1);
  uint64_t handled_events = 0;
  double release_at = 0;

  auto schedule = [&](const ResidencyCommand& command) {
    const auto bytes = static_cast<double>(plan.tensors()[command.tensor].size_bytes);
    auto serve = [&](double& free_at, double bytes_per_s) {
      const double start = std::max(now, free_at);
      free_at = start + (bytes_per_s > 0 ? bytes / bytes_per_s : 0.0);
      return free_at;
    };
    double done = now;
    switch (command.kind) {
      case CommandKind::nvme_read: done = serve(io_free, timing.read_bytes_per_s); break;
      case CommandKind::nvme_write: done = serve(io_free, timing.write_bytes_per_s); break;
      case CommandKind::h2d: done = serve(h2d_free, timing.h2d_bytes_per_s); break;
      case CommandKind::d2h: done = serve(d2h_free, timing.d2h_bytes_per_s); break;
    }
    events.push(Event{done, order++, command});
  };
  auto run_passes = [&] {
    // A compacted in-place pool asks for another pass at once; a bound keeps a bug from spinning.
    for (int i = 0; i < 4; ++i) {
      const bool again = residency.pass();
      for (const ResidencyCommand& command : residency.commands()) schedule(command);
      residency.commands().clear();
      if (!again) break;
    }
  };

  // The window runs from the acquire of the first counted step to the acquire of the step
  // after the last (acquire to acquire, as the trainer's step times are).
  for (;;) {
    run_passes();
    // The caller looks after every pass, as the real one wakes at every completion.
    if (!holding) {
      const size_t step = residency.next_step();
      if (std::optional<Error> error = residency.step_error(step)) return *error;
      if (std::optional<Error> error = residency.over_pinned(step, 0, false)) return *error;
      if (residency.step_ready(step)) {
        const uint64_t abs = residency.cursor_abs();
        if (abs > first_counted) stall += now - wait_since;  // the waits inside the window
        if (abs == end_abs) break;
        if (abs == first_counted) window_start = now;
        if (abs >= first_counted) compute += timing.compute_s[step];
        residency.acquire(step);
        holding = true;
        held_step = step;
        release_at = now + timing.compute_s[step];
        continue;
      }
    }
    // Nothing to do now: move the clock to the next completion or release.
    const bool have_event = !events.empty();
    if (!have_event && !holding)
      return make_error(ErrorKind::internal,
                        fmt::format("replay: step '{}' can never become ready (nothing in flight, nothing held)",
                                    plan.steps()[residency.next_step()].name));
    if (holding && (!have_event || release_at <= events.top().time)) {
      now = release_at;
      residency.release(held_step);
      holding = false;
      wait_since = now;
      continue;
    }
    if (++handled_events > kMaxEvents)
      return make_error(ErrorKind::internal,
                        fmt::format("replay: no progress after {} transfers at step '{}' (copies that undo each other)",
                                    kMaxEvents, plan.steps()[residency.next_step()].name));
    const Event event = events.top();
    events.pop();
    now = event.time;
    const ResidencyCommand& c = event.command;
    switch (c.kind) {
      case CommandKind::h2d: residency.h2d_done(c.tensor, c.version); break;
      case CommandKind::d2h: residency.d2h_done(c.tensor, c.version); break;
      case CommandKind::nvme_read: residency.io_done(c.tensor, false, c.version, std::nullopt); break;
      case CommandKind::nvme_write: residency.io_done(c.tensor, true, c.version, std::nullopt); break;
    }
    if (window_start >= 0) {
      const auto pair = static_cast<size_t>(pair_of(c.kind));
      result.bytes[pair] += plan.tensors()[c.tensor].size_bytes;
      ++result.transfers[pair];
    }
  }
  const double counted = std::max<uint32_t>(counted_iterations, 1);
  result.iteration_s = (now - std::max(window_start, 0.0)) / counted;
  result.stall_s = stall / counted;
  result.compute_s = compute / counted;
  result.counters = residency.counters();
  return result;
}

}  // namespace strata::scheduler
