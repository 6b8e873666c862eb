// strata/scheduler/residency.h — the residency model: the books of every plan tensor across
// the tiers (device, pinned host, NVMe) and every decision the prefetch scheduler makes about
// them, with no thread, lock, clock or I/O of its own. Two drivers run it:
//   - the Scheduler (scheduler.h): its pump thread holds the scheduler's mutex, calls `pass`,
//     carries out the commands on the copy streams and the I/O thread, and reports each
//     completion back (`h2d_done`, `d2h_done`, `io_done`); its caller thread asks `step_ready`
//     and calls `acquire` / `release`;
//   - `strata plan`'s replay (run/step_model.cpp): the same calls on a simulated clock, so
//     the prediction follows the real policy — write-back reserve, in-place pool, Belady
//     victims, read-ahead limits and arena fragmentation included.
//
// The policy (the rules the books keep):
//   - Versions instead of flags: every tensor has a version, bumped when a step that writes it
//     is acquired; each tier copy remembers the version it holds. A copy is dirty when it is
//     newer than the copy below it; a copy may be dropped only when its version is also held
//     elsewhere (or it is stale). So dirty data always reaches host (and NVMe, for NVMe-homed
//     tensors) before its space is reused.
//   - `pass` walks the plan ahead of the cursor (the next step to acquire): dirty device copies
//     go down eagerly (device → host, then host → NVMe for NVMe-homed tensors) — except a copy
//     the cursor step itself rewrites, which goes down after its last rewrite; copies the next
//     steps read are loaded (NVMe → host → device) as far as the lookahead and the budgets
//     reach, at most `io_queue_tensors` NVMe transfers and `copies_in_flight` copies per
//     direction in flight. Victims go by Belady's rule: the copy whose next use is furthest
//     away first; pinned copies and copies in flight never.
//   - The write-back reserve: host room that read-ahead may not take (two of the largest
//     NVMe-homed tensors a step writes, at most a quarter of the staging room), so a fresh
//     write-back never evicts a copy prefetched for the next steps.
//   - The resident subset: the plan repeats, so read-ahead that evicts whatever is used
//     furthest from *now* slides a window over the plan and reads every tensor once per
//     repetition, although the pool could hold most of them. Read-only NVMe-homed tensors are
//     therefore split once, at construction: a subset kept in host memory across repetitions
//     (most uses first, then plan order or largest first — whichever keeps more bytes — as
//     many as fit beside a read-ahead ring holding the streamed
//     tensors of the two largest consecutive steps; the same count spread evenly over the plan
//     rather than bunched, so the drive reads on while each kept step computes) and the rest,
//     which stream through the ring. Read-ahead never evicts a
//     kept copy (it waits instead); the cursor step may, as a last resort, so it always
//     completes. Tensors a step writes are never kept.
//   - In place (`compute_in_place`, the CPU device): one pool, the host budget; a step's
//     tensors are used in their host blocks, there are no device copies, and a block being
//     written to NVMe is not handed to a step that writes it until the write is done.
//
// Memory goes through `ResidencyMemory`: the residency decides which tensor gets or loses
// space in which tier and keeps the host budget; the memory places the bytes (a real device
// arena and host arena, or simulated ones on the same range allocator) and may refuse a
// placement the budget allows (fragmentation) — the residency then evicts or waits, as with a
// full budget. Commands (copies and NVMe transfers) are queued in `commands()` for the driver,
// which takes them after each call that can issue work (`pass`).
//
// Not thread-safe: the driver serializes every call (the Scheduler under its mutex).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "scheduler/scheduler.h"

namespace strata::scheduler {

// Where the residency's tensors get their bytes. `allocate` returns the bytes taken (at least
// `size_bytes`), or 0 when the tier cannot place the tensor now.
class ResidencyMemory {
 public:
  virtual ~ResidencyMemory() = default;
  virtual uint64_t allocate(Tier tier, TensorId tensor, uint64_t size_bytes) = 0;
  virtual void free(Tier tier, TensorId tensor) = 0;
  // The device arena: what is in use (the driver's own buffers included) and its capacity.
  virtual uint64_t device_used_bytes() const = 0;
  virtual uint64_t device_budget_bytes() const = 0;
};

enum class CommandKind : uint8_t { h2d, d2h, nvme_read, nvme_write };

// Work decided by the residency, for the driver to carry out and report back with `version`.
struct ResidencyCommand {
  CommandKind kind;
  TensorId tensor;
  int64_t version;  // the version the destination will hold (a read: the NVMe copy's)
};

struct ResidencyCounters {
  uint64_t device_evictions = 0;
  uint64_t host_evictions = 0;
  uint64_t device_high_water_bytes = 0;
  uint64_t host_high_water_bytes = 0;
};

class Residency {
 public:
  // `alignment_bytes`: every tensor's space is its size rounded up to it (the larger of the
  // device's and the host arena's alignments). The memory must outlive the residency; what
  // it holds when the residency is made (kernel scratch) stays out of the device horizon.
  Residency(const AccessPlan& plan, const SchedulerOptions& options, ResidencyMemory& memory, uint64_t alignment_bytes);
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // Places the host-homed tensors (they hold their blocks for life), version 0 everywhere.
  [[nodiscard]] Status place_host_homed();
  // Gives back every host block (a failed create; the driver frees device buffers itself).
  void free_all_host();

  // One pass of decisions: write-backs, then prefetch. True: another pass may place more
  // without waiting for a completion (the in-place pool was just compacted).
  bool pass();
  std::vector<ResidencyCommand>& commands() { return commands_; }

  // Completions of commands from `commands()`. A failed read (`error` set) is kept with its
  // tensor, returned by the acquire that needs it; a failed write moves nothing and is the
  // driver's to report through `fail`.
  void h2d_done(TensorId tensor, int64_t version);
  void d2h_done(TensorId tensor, int64_t version);
  void io_done(TensorId tensor, bool is_write, int64_t version, std::optional<Error> error);
  // An NVMe command dropped unsubmitted (the driver is stopping).
  void io_dropped(TensorId tensor);
  void fail(Error error);
  const std::optional<Error>& sticky_error() const { return sticky_error_; }

  // --- the caller's side ---
  size_t next_step() const { return static_cast<size_t>(cursor_abs_ % n()); }
  uint64_t cursor_abs() const { return cursor_abs_; }
  bool step_ready(size_t step) const;
  std::optional<Error> step_error(size_t step) const;
  // The step cannot be acquired beside `held_count` held steps: together they exceed the
  // budget (no error while a release is still pending).
  std::optional<Error> over_pinned(size_t step, size_t held_count, bool release_pending) const;
  // Pins the (ready) cursor step, bumps the versions of what it writes, advances the cursor.
  void acquire(size_t step);
  void release(size_t step);
  // Every tensor's home copy holds its newest version and nothing is in flight.
  bool flushed() const;
  void set_flushing(bool flushing) { flushing_ = flushing; }
  // A host-homed tensor's block for the caller: idle (no copy using it) → take → give back,
  // which counts as a write.
  bool host_idle(TensorId tensor) const;
  void begin_host_access(TensorId tensor);
  void end_host_access(TensorId tensor);

  const AccessPlan& plan() const { return plan_; }
  const ResidencyCounters& counters() const { return counters_; }
  const std::vector<Eviction>& evictions() const { return eviction_log_; }
  uint64_t aligned_bytes(TensorId tensor) const { return books_[tensor].aligned_bytes; }

 private:
  enum class DeviceOp : uint8_t { none, loading, saving };
  enum class HostOp : uint8_t { none, reading, writing, h2d_source, d2h_target, caller };
  static constexpr int64_t kNoVersion = -1;

  struct Book {
    Home home = Home::nvme;
    uint64_t aligned_bytes = 0;
    std::vector<uint32_t> uses;        // plan steps using it, ascending
    std::vector<uint8_t> use_writes;   // parallel to uses: that step writes it
    int64_t version = 0;               // bumped when a step that writes it is acquired

    bool device_allocated = false;
    int64_t device_version = kNoVersion;
    bool device_placeholder = false;   // allocated for a write-only step: bytes not loaded
    DeviceOp device_op = DeviceOp::none;
    uint32_t pins = 0;
    uint32_t write_pins = 0;

    bool host_allocated = false;
    uint64_t host_bytes = 0;
    int64_t host_version = kNoVersion;
    HostOp host_op = HostOp::none;

    int64_t nvme_version = kNoVersion;
    std::optional<Error> read_error;
    // In the resident subset (see choose_resident_subset): read-ahead never evicts its host copy.
    bool keep = false;
  };
  struct StepTensor {
    TensorId tensor;
    bool reads;
    bool writes;
  };

  size_t n() const { return plan_.step_count(); }
  uint64_t distance(const Book& book, uint64_t from_abs) const;
  bool next_use_writes(const Book& book, uint64_t from_abs) const;
  bool device_current(const Book& book, bool for_read) const;
  bool device_dirty(const Book& book) const;
  bool device_droppable(const Book& book) const;
  bool host_droppable(const Book& book) const;
  void note_allocation(Tier tier, uint64_t used_bytes, uint64_t budget_bytes);
  void choose_resident_subset();
  std::vector<TensorId> spread_order(const std::vector<TensorId>& order) const;
  void rank_victims(Tier tier, TensorId id, uint64_t need_distance);
  bool allocate_in(Tier tier, TensorId id, uint64_t need_distance, bool write_back = false);
  void evict(Tier tier, TensorId victim);
  void start_write_back(TensorId id, uint64_t need_distance);
  void issue(CommandKind kind, TensorId id);
  void write_back();
  void prefetch();
  bool prefetch_in_place();
  bool compact_for_cursor_step(uint64_t need_distance);

  const AccessPlan& plan_;
  const SchedulerOptions& options_;
  ResidencyMemory& memory_;
  std::vector<std::vector<StepTensor>> step_tensors_;  // per plan step, largest first
  std::vector<Book> books_;
  uint64_t host_home_bytes_ = 0;
  // Device memory the driver held before the residency began (kernel workspace, scratch):
  // the prefetch horizon is what is left, or it would reach for space it can only get by
  // evicting what it has just prefetched.
  uint64_t external_device_bytes_ = 0;
  uint64_t write_back_reserve_bytes_ = 0;
  uint64_t resident_subset_bytes_ = 0;  // host bytes of the tensors marked `keep`

  uint64_t cursor_abs_ = 0;  // absolute index of the next step to acquire
  uint32_t pinned_tensors_ = 0;  // tensors with pins > 0 (held steps)
  size_t own_evictions_at_cursor_ = 0;  // device copies of the cursor step dropped since its last acquire
  bool flushing_ = false;
  uint64_t host_used_bytes_ = 0;
  uint32_t h2d_in_flight_ = 0, d2h_in_flight_ = 0, io_in_flight_ = 0;
  std::optional<Error> sticky_error_;
  std::vector<ResidencyCommand> commands_;
  ResidencyCounters counters_;
  std::vector<Eviction> eviction_log_;
  std::vector<uint32_t> seen_epoch_;  // per tensor, for the walk (no allocation per pass)
  std::vector<std::pair<uint64_t, TensorId>> victims_by_tier_[2];
  uint32_t epoch_ = 0;
};

}  // namespace strata::scheduler
