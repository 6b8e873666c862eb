// strata/scheduler/scheduler.h — the prefetch scheduler: stages each step's tensors NVMe →
// pinned host → device ahead of compute, within hard byte budgets, and counts every wait.
//
// The access plan: one iteration of work as an ordered list of steps (forward layers in order,
// backward in reverse, optimizer updates), each naming the tensors it reads and writes. The
// plan repeats: after its last step comes its first again, so the prefetcher looks across the
// iteration boundary. A tensor listed in a step's `writes` but not its `reads` is taken to be
// fully overwritten by that step: it gets device space but no load (list it in both to update
// it in place, e.g. to accumulate gradients).
//
// What the scheduler owns: the device copies of the plan's tensors (DeviceBuffers from the
// device's capped arena), the host copies (blocks of the pinned HostArena, at most
// `host_budget_bytes` of them at once), two device streams (h2d, d2h) and two threads. It does
// NOT own the device, the host arena or the NVMe backing: they must outlive it.
//
// Threads and ownership:
//   - the caller (compute) thread calls `acquire` / `release` / `flush` / stats; acquire of
//     steps must follow plan order (step 0, 1, ..., n−1, 0, ...). Several steps may be held at
//     once as long as they fit the device budget together.
//   - the pump thread runs the residency model (scheduler/residency.h: the books and every
//     decision, thread-free, also driven by `strata plan`'s replay) and carries out what it
//     decides: it walks the plan ahead of the cursor (the next step to be acquired), allocates
//     and evicts (Belady: the copy whose next use is furthest
//     away goes first; pinned copies and copies in flight never), enqueues host↔device copies
//     on the h2d / d2h streams, queues NVMe reads and writes for the I/O thread, and writes
//     dirty data back eagerly (device → host → NVMe when the home is NVMe). All tensor books
//     are guarded by one mutex; copies and I/O run outside it.
//   - the I/O thread is the only thread that touches the NVMe backing (and so its io::Engine:
//     each submitting thread owns its ring). It keeps up to `io_queue_tensors` tensor reads
//     and writes in flight, waits on the oldest a part at a time (NvmeBacking::wait_some) so it
//     submits what the pump queues meanwhile, and reports each completion to the pump.
//   - device stream threads (CPU device) or the CUDA driver run the copies and report their
//     completion through host callbacks on the same streams.
//
// Versions instead of flags: every tensor has a version, bumped when a step that writes it is
// acquired; each tier copy remembers the version it holds. A copy is dirty when it is newer
// than the copy below it; a copy may be dropped only when its version is also held elsewhere
// (or it is stale). So dirty data always reaches host (and NVMe, for NVMe-homed tensors)
// before its space is reused.
//
// Budgets are hard: the device never holds more than its arena (which is its budget); host
// copies never total more than `host_budget_bytes`. When nothing can be evicted, the pump waits
// for a completion and the caller's `acquire` waits — a measured stall, never an
// over-allocation. A plan with a step that cannot fit a budget on its own is refused by
// `create`, naming the step and the bytes.
//
// Errors: an NVMe read that fails is kept with its tensor and returned by the `acquire` that
// needs the tensor (naming tensor, file, offset); later steps are unaffected unless they need
// it too. A failed write-back is returned by the next `acquire` and by `flush`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "device/device.h"
#include "memory/host_arena.h"

namespace strata::memory {
class Store;
}

namespace strata::scheduler {

using TensorId = uint32_t;

// Where a tensor's lasting copy lives. Host-homed tensors hold a block of the host budget for
// their whole life (zero-filled at start; fill or read them through `Scheduler::begin_host_access`).
enum class Home : uint8_t { nvme, host };
const char* home_name(Home home);

struct PlanTensor {
  std::string name;
  uint64_t size_bytes = 0;
  Home home = Home::nvme;
  // Host-homed state that only the host reaches (begin_host_access), never a step: it holds its
  // host block for the scheduler's life and no step may name it — e.g. optimizer state that a
  // host-side update reads where it lives while the device computes (run/train_plan.h).
  bool host_only = false;
};

struct PlanStep {
  std::string name;
  std::vector<TensorId> reads;
  std::vector<TensorId> writes;
};

class AccessPlan {
 public:
  TensorId add_tensor(std::string name, uint64_t size_bytes, Home home = Home::nvme);
  // A host-homed tensor that no step uses (PlanTensor::host_only).
  TensorId add_host_only_tensor(std::string name, uint64_t size_bytes);
  // Returns the step's index. Ids must come from add_tensor (checked by validate).
  size_t add_step(std::string name, std::vector<TensorId> reads, std::vector<TensorId> writes = {});

  const std::vector<PlanTensor>& tensors() const { return tensors_; }
  const std::vector<PlanStep>& steps() const { return steps_; }
  size_t step_count() const { return steps_.size(); }
  // Distinct tensors of a step (reads ∪ writes) in first-mention order.
  std::vector<TensorId> step_tensors(size_t step) const;
  // Bytes of those tensors, each rounded up to `alignment_bytes`.
  uint64_t step_bytes(size_t step, uint64_t alignment_bytes = 1) const;
  // Non-empty, ids in range, sizes > 0, names unique, each tensor used by some step except
  // host-only ones, which no step may use.
  [[nodiscard]] Status validate() const;

 private:
  std::vector<PlanTensor> tensors_;
  std::vector<PlanStep> steps_;
};

// The lasting home of NVMe-homed tensors. Called only from the scheduler's I/O thread (so an
// implementation may own a per-thread io::Engine); tickets are waited for exactly once, in any
// order. Buffers stay valid until their ticket is waited for.
class NvmeBacking {
 public:
  virtual ~NvmeBacking() = default;
  [[nodiscard]] virtual Result<uint64_t> submit_read(TensorId tensor, const PlanTensor& spec, void* host_dst) = 0;
  [[nodiscard]] virtual Result<uint64_t> submit_write(TensorId tensor, const PlanTensor& spec,
                                                      const void* host_src) = 0;
  [[nodiscard]] virtual Status wait(uint64_t ticket) = 0;
  // Blocks until part of the ticket's transfer has finished, or all of it; returns whether it
  // is done (`wait` then returns at once). The I/O thread waits on its oldest transfer a part
  // at a time so it can submit what the pump queued meanwhile. Default: no parts, done at once.
  virtual bool wait_some(uint64_t ticket) {
    (void)ticket;
    return true;
  }
  // Registers the pinned host region with the backing's engine (optional, for fixed buffers).
  [[nodiscard]] virtual Status register_host(memory::HostArena& arena) = 0;
};

// NvmeBacking over memory::Store: each plan tensor is the store tensor of the same name (it
// must exist, with that size), read and written through the store's engine with checksums.
// The store belongs to the scheduler's I/O thread while the scheduler lives: open it but do
// not submit to it from another thread (an engine binds to the thread that first submits);
// reach it through Scheduler::run_on_io_thread.
[[nodiscard]] Result<std::unique_ptr<NvmeBacking>> make_store_backing(memory::Store& store,
                                                                      const AccessPlan& plan);

// `io` is NVMe reads, `io_write` NVMe writes (their own rows: a tensor read twice shows).
enum class TraceTrack : uint8_t { io, h2d, d2h, compute, stall, io_write };
const char* trace_track_name(TraceTrack track);

// A Chrome-trace / Perfetto timeline: complete ("X") events, one track (tid) per kind. The
// event buffer is reserved up front; events beyond it are counted as dropped, not allocated.
class Timeline {
 public:
  explicit Timeline(size_t capacity_events);
  // Nanoseconds on the steady clock, the same clock `now_ns` reads.
  void record(TraceTrack track, std::string_view name, uint64_t start_ns, uint64_t end_ns,
              uint64_t size_bytes = 0);
  static uint64_t now_ns();
  [[nodiscard]] Status write_json(const std::string& path) const;
  size_t event_count() const;
  uint64_t dropped_events() const;

 private:
  struct Event {
    TraceTrack track;
    char name[48];
    uint64_t start_ns, end_ns, size_bytes;
  };
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  size_t capacity_events_;
  uint64_t dropped_events_ = 0;
  uint64_t origin_ns_;
};

enum class TierPair : uint8_t { nvme_to_host, host_to_device, device_to_host, host_to_nvme };
inline constexpr size_t kTierPairCount = 4;
const char* tier_pair_name(TierPair pair);

struct TransferStats {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  uint64_t busy_ns = 0;  // time with at least one such transfer running
  double gb_per_s() const { return busy_ns == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(busy_ns); }
};

struct SchedulerStats {
  uint64_t steps_acquired = 0;
  uint64_t stall_ns = 0;                       // total time acquire waited
  uint64_t max_step_stall_ns = 0;
  std::vector<uint64_t> stall_ns_by_step;      // per plan step, summed over iterations
  TransferStats transfers[kTierPairCount];     // indexed by TierPair
  uint64_t device_evictions = 0;
  uint64_t host_evictions = 0;
  uint64_t device_high_water_bytes = 0;
  uint64_t host_high_water_bytes = 0;
  uint64_t host_budget_bytes = 0;
  uint64_t device_budget_bytes = 0;
};

enum class Tier : uint8_t { device, host };

struct Eviction {
  Tier tier;
  TensorId tensor;
  uint64_t cursor_step;  // absolute step count (iterations × steps + step) when it happened
};

struct SchedulerOptions {
  uint64_t host_budget_bytes = 0;              // required
  // Caps on how far ahead, in bytes of distinct upcoming tensors, each tier prefetches.
  // 0: as far as the tier's budget allows.
  uint64_t device_lookahead_bytes = 0;
  uint64_t host_lookahead_bytes = 0;
  uint32_t io_queue_tensors = 4;               // NVMe tensor transfers in flight at most
  uint32_t copies_in_flight = 8;               // per copy stream
  size_t trace_capacity_events = 0;            // 0: no timeline
  // The caller's timeline instead (it must outlive the scheduler): one trace across several
  // schedulers in turn — the trainer's, and its evaluation's (train/trainer.h).
  Timeline* timeline = nullptr;
  bool record_evictions = false;               // keep an Eviction log (tests)
  // Compute in place (the CPU device, whose memory is host memory): a step's tensors are
  // handed out as their pinned host blocks, used where they lie — no device copy and no copy
  // stream traffic. The device arena is then left to the caller's scratch, and the host
  // budget is the one pool that staging and compute share. Crash safety: a block being
  // written to NVMe is never handed to a step that writes it until that write is done (the
  // acquire waits; a step that only reads it may proceed).
  bool compute_in_place = false;
  // Called under the scheduler's lock after every allocation in a tier with the bytes in use
  // and the budget: tests assert the budget at every allocation.
  std::function<void(Tier, uint64_t used_bytes, uint64_t budget_bytes)> on_allocate;
};

// Device addresses of one acquired step's tensors, valid until its release (host addresses
// when the scheduler computes in place).
class StepBuffers {
 public:
  size_t step() const { return step_; }
  // Asserts that the tensor belongs to the step.
  void* device_data(TensorId tensor) const;
  const std::vector<std::pair<TensorId, void*>>& all() const { return buffers_; }

 private:
  friend class Scheduler;
  size_t step_ = 0;
  std::vector<std::pair<TensorId, void*>> buffers_;
};

class Scheduler {
 public:
  // Checks the plan against the budgets (refusing a step that cannot fit on its own), takes
  // the host blocks of host-homed tensors, creates the copy streams and starts the threads.
  // `backing` may be null only if no tensor is NVMe-homed.
  [[nodiscard]] static Result<std::unique_ptr<Scheduler>> create(AccessPlan plan, device::Device& device,
                                                                 memory::HostArena& host_arena,
                                                                 NvmeBacking* backing,
                                                                 SchedulerOptions options);
  ~Scheduler();  // waits for copies and I/O in flight; does not flush
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Blocks until every tensor of `step` (the next in plan order) is on the device at its
  // newest version, pins them and returns their addresses. The wait is a counted stall.
  [[nodiscard]] Result<StepBuffers> acquire(size_t step);
  // Unpins the step's tensors now: the caller's work on them must be complete.
  [[nodiscard]] Status release(size_t step);
  // Unpins them once the work already enqueued on `stream` has run (a host callback on it).
  [[nodiscard]] Status release_after(size_t step, device::Stream& stream);
  // release_after in two halves, for a release another thread enqueues later (the trainer's
  // host-optimizer worker, which copies the step's P back before it may be released).
  // `promise_release` counts the release as coming at once — an acquire that needs its budget
  // then waits for it instead of refusing — and `release_promised_after` (any thread) enqueues
  // it. Every promise must be kept exactly once: if the stream cannot take the release, the
  // step is released at once and the launch's error returned.
  [[nodiscard]] Status promise_release(size_t step);
  [[nodiscard]] Status release_promised_after(size_t step, device::Stream& stream);
  // Waits until every tensor's home copy holds its newest version (write-backs done). No step
  // may be held. Returns the first write-back error, if any.
  [[nodiscard]] Status flush();

  // A host-homed tensor's bytes, to fill before training or read after `flush`, between
  // begin and end; only while no step that uses it is held. `begin` waits for copies using the
  // block and keeps new ones off it; `end` counts as a write: the host copy becomes the newest
  // and a device copy is loaded again before its next use.
  void* begin_host_access(TensorId tensor);
  void end_host_access(TensorId tensor);

  // Runs `fn` on the I/O thread once the transfers queued before it are done, and returns its
  // status: the way to use the NVMe backing's store (e.g. commit a checkpoint) while the
  // scheduler owns it, since its engine belongs to that thread.
  [[nodiscard]] Status run_on_io_thread(std::function<Status()> fn);

  const AccessPlan& plan() const;
  SchedulerStats stats() const;
  std::vector<Eviction> evictions() const;
  // The timeline (null when options.trace_capacity_events was 0): the caller may add its own
  // compute spans to it; write it with Timeline::write_json.
  Timeline* timeline();

 private:
  struct Impl;
  explicit Scheduler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::scheduler
