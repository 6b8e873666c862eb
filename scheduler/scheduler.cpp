// strata/scheduler/scheduler.cpp — the pump (decisions), the I/O thread (NVMe), and the
// caller-facing acquire / release. See scheduler.h for the threads and the version rules.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <cassert>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "common/size.h"

namespace strata::scheduler {
namespace {

constexpr int64_t kNoVersion = -1;
// Waits shorter than this are not drawn on the timeline (they are still counted).
constexpr uint64_t kTraceStallMinNs = 20'000;

enum class DeviceOp : uint8_t { none, loading, saving };
enum class HostOp : uint8_t { none, reading, writing, h2d_source, d2h_target, caller };

struct Book {
  PlanTensor spec;
  uint64_t aligned_bytes = 0;
  std::vector<uint32_t> uses;  // plan steps using it, ascending
  std::vector<uint8_t> use_writes;  // parallel to uses: that step writes it
  int64_t version = 0;         // bumped when a step that writes it is acquired

  device::DeviceBuffer device;
  int64_t device_version = kNoVersion;
  bool device_placeholder = false;  // allocated for a write-only step: bytes not loaded
  DeviceOp device_op = DeviceOp::none;
  uint32_t pins = 0;
  uint32_t write_pins = 0;

  memory::HostBlock host;
  bool host_allocated = false;
  int64_t host_version = kNoVersion;
  HostOp host_op = HostOp::none;

  int64_t nvme_version = kNoVersion;
  std::optional<Error> read_error;  // a failed NVMe read: returned by the acquire that needs it
};

// A caller's function to run on the I/O thread (e.g. a store commit), once nothing is in flight.
struct IoCall {
  std::function<Status()> fn;
  Status result;
  bool done = false;
};

struct IoCommand {
  IoCall* call = nullptr;  // set: run it instead of a transfer
  bool is_write = false;
  TensorId tensor = 0;
  void* buffer = nullptr;
  int64_t version = 0;
};

// A host↔device copy the pump decided on, to enqueue once it has let go of the lock.
struct CopyCommand {
  bool to_device;
  TensorId tensor;
  int64_t version;  // the version the destination will hold
  void* device_data;
  void* host_data;
  uint64_t size_bytes;
};

struct StepTensor {
  TensorId tensor;
  bool reads;
  bool writes;
};

}  // namespace

void* StepBuffers::device_data(TensorId tensor) const {
  for (const auto& [id, data] : buffers_)
    if (id == tensor) return data;
  assert(false && "tensor is not part of this step");
  return nullptr;
}

struct Scheduler::Impl {
  Impl(AccessPlan plan_in, device::Device& device_in, memory::HostArena& arena_in, NvmeBacking* backing_in,
       SchedulerOptions options_in)
      : plan(std::move(plan_in)), device(device_in), arena(arena_in), backing(backing_in),
        options(std::move(options_in)) {}

  // --- fixed at creation ---
  AccessPlan plan;
  device::Device& device;
  memory::HostArena& arena;
  NvmeBacking* backing;
  SchedulerOptions options;
  std::vector<std::vector<StepTensor>> step_tensors;  // per plan step
  uint64_t host_home_bytes = 0;
  // Device memory the caller held before the scheduler began (kernel workspace, scratch):
  // the prefetch horizon is what is left, or it would reach for space it can only get by
  // evicting what it has just prefetched.
  uint64_t external_device_bytes = 0;
  // Host room only write-backs (and the cursor step) may take: without it, read-ahead fills
  // the host budget and every write-back of a freshly updated tensor evicts a copy prefetched
  // for one of the next steps, which is then read twice. Two of the largest NVMe-homed
  // tensors a step writes, at most a quarter of the staging room.
  uint64_t write_back_reserve_bytes = 0;
  device::Stream h2d, d2h;
  std::unique_ptr<Timeline> timeline;

  // --- guarded by mutex ---
  mutable std::mutex mutex;
  std::condition_variable pump_cv, ready_cv, io_cv;
  bool work_pending = true;
  bool stopping = false;
  std::vector<Book> books;
  uint64_t cursor_abs = 0;             // absolute index of the next step to acquire
  std::vector<size_t> held_steps;      // plan indexes of acquired, unreleased steps
  uint32_t deferred_releases = 0;
  bool flushing = false;      // release_after calls whose stream has not reached them
  uint64_t host_used_bytes = 0;
  uint32_t h2d_in_flight = 0, d2h_in_flight = 0;
  uint32_t io_in_flight = 0;           // queued for or running on the I/O thread
  std::deque<IoCommand> io_queue;
  std::vector<CopyCommand> copy_queue;  // decided this pass, not yet enqueued (pump only)
  std::vector<CopyCommand> copies_to_enqueue;  // the pump's, outside the lock
  std::optional<Error> sticky_error;   // a failed write-back or copy
  SchedulerStats stats;
  std::vector<Eviction> eviction_log;
  std::vector<uint32_t> seen_epoch;    // per tensor, for the walk (no allocation per pump)
  std::vector<std::pair<uint64_t, TensorId>> victims_by_tier[2];  // eviction candidates, reused
  uint32_t epoch = 0;
  uint64_t h2d_start_ns = 0, d2h_start_ns = 0;  // the running copy of each (serial) stream

  std::thread pump_thread, io_thread;

  size_t n() const { return plan.step_count(); }

  // Steps from `from_abs` to the next use of `tensor` (0: the step at from_abs uses it).
  uint64_t distance(const Book& book, uint64_t from_abs) const {
    const uint32_t position = static_cast<uint32_t>(from_abs % n());
    auto it = std::lower_bound(book.uses.begin(), book.uses.end(), position);
    if (it != book.uses.end()) return *it - position;
    return n() - position + book.uses.front();
  }

  // Whether the next use at or after `from_abs` writes the tensor.
  bool next_use_writes(const Book& book, uint64_t from_abs) const {
    const uint32_t position = static_cast<uint32_t>(from_abs % n());
    auto it = std::lower_bound(book.uses.begin(), book.uses.end(), position);
    const size_t index = it != book.uses.end() ? static_cast<size_t>(it - book.uses.begin()) : 0;
    return book.use_writes[index] != 0;
  }

  void trace(TraceTrack track, const Book& book, uint64_t start_ns, uint64_t end_ns) {
    if (timeline) timeline->record(track, book.spec.name, start_ns, end_ns, book.spec.size_bytes);
  }

  void fail_sticky(Error error) {
    if (!sticky_error) sticky_error = std::move(error);
    ready_cv.notify_all();
  }

  bool device_current(const Book& book, bool for_read) const {
    // In place the host block is the compute copy; a block still being read from NVMe is not
    // current yet (its host_version moves only when the read completes).
    if (options.compute_in_place)
      return book.host_allocated && (!for_read || book.host_version == book.version) && book.host_op != HostOp::reading;
    return book.device.valid() && book.device_version == book.version && book.device_op != DeviceOp::loading &&
           !(for_read && book.device_placeholder);
  }
  bool device_dirty(const Book& book) const {
    if (options.compute_in_place) return false;  // there is no device copy
    if (!book.device.valid() || book.device_placeholder || book.device_op == DeviceOp::loading) return false;
    int64_t below = book.host_version;
    if (book.spec.home == Home::nvme) below = std::max(below, book.nvme_version);
    return book.device_version > below;
  }
  // Dropping the device copy loses nothing.
  bool device_droppable(const Book& book) const {
    if (book.device_placeholder) return true;
    if (book.host_version >= book.device_version) return true;
    return book.spec.home == Home::nvme && book.nvme_version >= book.device_version;
  }
  bool host_droppable(const Book& book) const {
    if (book.spec.home != Home::nvme) return false;  // the home copy stays
    if (book.host_version < book.version) return true;  // stale: the device holds newer
    if (book.nvme_version >= book.host_version) return true;
    return book.device.valid() && !book.device_placeholder && book.device_version >= book.host_version;
  }

  void on_allocate(Tier tier, uint64_t used_bytes, uint64_t budget_bytes) {
    if (tier == Tier::device)
      stats.device_high_water_bytes = std::max(stats.device_high_water_bytes, used_bytes);
    else
      stats.host_high_water_bytes = std::max(stats.host_high_water_bytes, used_bytes);
    if (options.on_allocate) options.on_allocate(tier, used_bytes, budget_bytes);
  }

  // Candidates for eviction from one tier, furthest next use first (Belady): copies used
  // after `need_distance`. When the need is the cursor step itself, the step's own idle copies
  // rank last behind them: the arenas do not move live buffers, and a step's data can be
  // stuck behind a dirty copy that needs staging space to leave — dropping (and reloading) a
  // copy the step needs is then the only way forward, so the cursor step always completes.
  void rank_victims(Tier tier, TensorId id, uint64_t need_distance) {
    auto& victims = victims_by_tier[static_cast<size_t>(tier)];
    victims.clear();
    for (size_t other = 0; other < books.size(); ++other) {
      const Book& c = books[other];
      if (other == id) continue;
      uint64_t d = distance(c, cursor_abs);
      if (tier == Tier::device) {
        if (!c.device.valid() || c.pins > 0 || c.device_op != DeviceOp::none) continue;
      } else {
        if (!c.host_allocated || c.spec.home != Home::nvme || c.host_op != HostOp::none) continue;
        if (options.compute_in_place && c.pins > 0) continue;  // a held step computes on it
        // A copy on its way to NVMe (written back from the device, its write not yet issued)
        // stays until that write is done: dropping it because the device still holds the same
        // version only means copying it down again — at small host budgets that churned ~15×
        // the state through device → host per step. Its write frees it soon enough.
        if (c.host_version > c.nvme_version) continue;
        // A host copy whose tensor is already on the device is not needed for its next use:
        // it ranks behind every copy that is — unless that use writes the tensor. Then its
        // write-back needs a host block at that very use, and giving this one away first
        // would take one from a copy prefetched for a later step (which is then read twice):
        // it ranks by its next use like any other copy.
        if (!options.compute_in_place && device_current(c, true) && !(c.spec.home == Home::nvme && next_use_writes(c, cursor_abs))) d += n();
      }
      // In place the cursor step's own blocks are never victims for it (see compact_for_cursor_step).
      const bool own_as_last_resort = need_distance == 0 && d == 0 && !options.compute_in_place;
      if (d > need_distance || own_as_last_resort) victims.emplace_back(d, static_cast<TensorId>(other));
    }
    std::stable_sort(victims.begin(), victims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  }

  // Gives `id` space in `tier`, evicting in Belady order. Evicts nothing unless the free space
  // plus the droppable victims ahead of the first one still holding the only copy of its data
  // add up to the need (so a failed attempt does not throw away prefetched data). When that
  // first victim is dirty, its write-back is started at the priority of this need. False:
  // nothing more can go now; the pump runs again at the next completion.
  bool allocate_in(Tier tier, TensorId id, uint64_t need_distance, bool write_back = false) {
    Book& book = books[id];
    const bool on_device = tier == Tier::device;
    // Read-ahead stays out of the write-back reserve; write-backs and the cursor step's own
    // reads may use the whole budget.
    const uint64_t host_budget_bytes =
        options.host_budget_bytes - (write_back || need_distance == 0 ? 0 : write_back_reserve_bytes);
    auto try_allocate = [&]() -> bool {
      if (on_device) {
        Result<device::DeviceBuffer> buffer = device.allocate(book.aligned_bytes);
        if (!buffer.ok()) return false;
        book.device = std::move(buffer).value();
        on_allocate(Tier::device, device.memory_stats().used_bytes, device.budget_bytes());
        return true;
      }
      if (host_used_bytes + book.aligned_bytes > host_budget_bytes) return false;
      Result<memory::HostBlock> block = arena.allocate(book.aligned_bytes);
      if (!block.ok()) return false;
      book.host = *block;
      book.host_allocated = true;
      host_used_bytes += book.host.size_bytes;
      on_allocate(Tier::host, host_used_bytes, options.host_budget_bytes);
      return true;
    };
    if (try_allocate()) return true;
    rank_victims(tier, id, need_distance);
    // Per tier: a device allocation may start a write-back that ranks host victims meanwhile.
    auto& victims = victims_by_tier[static_cast<size_t>(tier)];
    const uint64_t used_bytes = on_device ? device.memory_stats().used_bytes : host_used_bytes;
    const uint64_t budget_bytes = on_device ? device.budget_bytes() : host_budget_bytes;
    uint64_t reachable_bytes = budget_bytes - std::min(budget_bytes, used_bytes);
    size_t droppable_count = 0;
    int64_t blocker = -1;  // the first victim whose data lives only here
    for (const auto& [d, victim] : victims) {
      const Book& v = books[victim];
      if (!(on_device ? device_droppable(v) : host_droppable(v))) {
        blocker = victim;
        break;
      }
      reachable_bytes += on_device ? v.device.size_bytes() : v.host.size_bytes;
      ++droppable_count;
    }
    if (reachable_bytes >= book.aligned_bytes) {
      for (size_t i = 0; i < droppable_count; ++i) {
        evict(tier, victims[i].second);
        if (try_allocate()) return true;
      }
    }
    // The dirty copy stands in the way: start its write-back at the priority of this need.
    if (on_device && blocker >= 0) start_write_back(static_cast<TensorId>(blocker), need_distance);
    return false;
  }

  void evict(Tier tier, TensorId victim) {
    Book& out = books[victim];
    if (tier == Tier::device) {
      out.device.reset();
      out.device_version = kNoVersion;
      out.device_placeholder = false;
      ++stats.device_evictions;
    } else {
      arena.free(out.host);
      host_used_bytes -= out.host.size_bytes;
      out.host = {};
      out.host_allocated = false;
      out.host_version = kNoVersion;
      ++stats.host_evictions;
    }
    if (options.record_evictions) eviction_log.push_back(Eviction{tier, victim, cursor_abs});
  }

  bool allocate_device(TensorId id, uint64_t need_distance) { return allocate_in(Tier::device, id, need_distance); }
  bool allocate_host(TensorId id, uint64_t need_distance) { return allocate_in(Tier::host, id, need_distance); }

  // Device → host copy of a dirty tensor, its host block taken at the priority `need_distance`.
  void start_write_back(TensorId id, uint64_t need_distance) {
    Book& book = books[id];
    if (!device_dirty(book) || book.device_op != DeviceOp::none || book.write_pins > 0 ||
        d2h_in_flight >= options.copies_in_flight)
      return;
    if (book.host_allocated && book.host_op != HostOp::none) return;  // e.g. an older version going to NVMe
    if (!book.host_allocated && !allocate_in(Tier::host, id, need_distance, /*write_back=*/true)) return;
    issue_d2h(id);
  }

  // --- issuing work (under the lock; the work itself runs elsewhere) ---

  // Copies are decided under the lock but enqueued outside it (`enqueue_copies`): a device
  // stream's queue is bounded and its completion callbacks take this mutex, so enqueueing
  // under it deadlocks once the queue fills (the CPU stream's ring holds 1024 tasks; three per
  // copy).
  void issue_h2d(TensorId id) {
    Book& book = books[id];
    book.device_op = DeviceOp::loading;
    book.host_op = HostOp::h2d_source;
    ++h2d_in_flight;
    copy_queue.push_back(CopyCommand{true, id, book.host_version, book.device.data(), book.host.data,
                                     book.spec.size_bytes});
  }

  // Enqueues the copies decided in this pass; called by the pump with the lock released.
  void enqueue_copy(const CopyCommand& copy) {
    device::Stream& stream = copy.to_device ? h2d : d2h;
    uint64_t& start_ns = copy.to_device ? h2d_start_ns : d2h_start_ns;
    Status status = device.launch(stream, [this, &start_ns] {
      std::lock_guard lock(mutex);
      start_ns = Timeline::now_ns();
    });
    if (status.ok())
      status = copy.to_device ? device.copy_to_device(stream, copy.device_data, copy.host_data, copy.size_bytes)
                              : device.copy_to_host(stream, copy.host_data, copy.device_data, copy.size_bytes);
    const TensorId id = copy.tensor;
    const int64_t version = copy.version;
    if (status.ok() && copy.to_device)
      status = device.launch(stream, [this, id, version] {
        const uint64_t end_ns = Timeline::now_ns();
        std::lock_guard lock(mutex);
        Book& done = books[id];
        done.device_op = DeviceOp::none;
        done.host_op = HostOp::none;
        done.device_version = version;
        done.device_placeholder = false;
        --h2d_in_flight;
        copy_finished(TierPair::host_to_device, TraceTrack::h2d, done, h2d_start_ns, end_ns);
      });
    else if (status.ok())
      status = device.launch(stream, [this, id, version] {
        const uint64_t end_ns = Timeline::now_ns();
        std::lock_guard lock(mutex);
        Book& done = books[id];
        done.device_op = DeviceOp::none;
        done.host_op = HostOp::none;
        done.host_version = version;
        --d2h_in_flight;
        copy_finished(TierPair::device_to_host, TraceTrack::d2h, done, d2h_start_ns, end_ns);
      });
    if (!status.ok()) {
      std::lock_guard lock(mutex);
      fail_sticky(status.error());
    }
  }

  // The books of a finished host↔device copy (under the lock): counts, trace, wake-ups.
  void copy_finished(TierPair pair, TraceTrack track, const Book& done, uint64_t start_ns, uint64_t end_ns) {
    TransferStats& t = stats.transfers[static_cast<size_t>(pair)];
    t.bytes += done.spec.size_bytes;
    ++t.transfers;
    t.busy_ns += end_ns - start_ns;
    trace(track, done, start_ns, end_ns);
    work_pending = true;
    pump_cv.notify_one();
    ready_cv.notify_all();
  }

  void issue_d2h(TensorId id) {
    Book& book = books[id];
    book.device_op = DeviceOp::saving;
    book.host_op = HostOp::d2h_target;
    ++d2h_in_flight;
    copy_queue.push_back(CopyCommand{false, id, book.device_version, book.device.data(), book.host.data,
                                     book.spec.size_bytes});
  }

  void issue_io(TensorId id, bool is_write) {
    Book& book = books[id];
    book.host_op = is_write ? HostOp::writing : HostOp::reading;
    ++io_in_flight;
    io_queue.push_back(IoCommand{nullptr, is_write, id, book.host.data, is_write ? book.host_version : book.nvme_version});
    io_cv.notify_one();
  }

  // --- the pump: one pass of decisions ---

  // Eager write-back: dirty device copies go down as soon as their step lets go of them (host
  // space taken only from copies used later than the tensor itself), dirty host copies of
  // NVMe-homed tensors go to NVMe.
  void write_back() {
    for (size_t i = 0; i < books.size(); ++i) {
      const TensorId id = static_cast<TensorId>(i);
      Book& book = books[i];
      // While flushing, write-backs are the only need, so they may take any idle host block.
      if (device_dirty(book)) start_write_back(id, flushing ? 0 : distance(book, cursor_abs));
      // In place, a block a held step may still be writing waits for the release.
      if (book.spec.home == Home::nvme && book.host_allocated && book.host_op == HostOp::none &&
          book.host_version > book.nvme_version && io_in_flight < options.io_queue_tensors &&
          !(options.compute_in_place && book.write_pins > 0))
        issue_io(id, /*is_write=*/true);
    }
  }

  void prefetch() {
    const uint64_t device_room = device.budget_bytes() - std::min(device.budget_bytes(), external_device_bytes);
    const uint64_t device_limit =
        options.device_lookahead_bytes ? std::min(options.device_lookahead_bytes, device_room) : device_room;
    const uint64_t host_room = options.host_budget_bytes - host_home_bytes;
    const uint64_t host_limit =
        options.host_lookahead_bytes ? std::min(options.host_lookahead_bytes, host_room) : host_room;
    uint64_t device_horizon_bytes = 0, host_horizon_bytes = 0;
    bool device_blocked = false, host_blocked = false;
    ++epoch;
    for (uint64_t k = cursor_abs; k < cursor_abs + n() && !(device_blocked && host_blocked); ++k) {
      const uint64_t d = k - cursor_abs;
      for (const StepTensor& entry : step_tensors[k % n()]) {
        if (seen_epoch[entry.tensor] == epoch) continue;
        seen_epoch[entry.tensor] = epoch;
        Book& book = books[entry.tensor];
        device_horizon_bytes += book.aligned_bytes;
        if (device_horizon_bytes > device_limit && d > 0) device_blocked = true;
        if (book.read_error) continue;  // reported by acquire; never retried behind its back
        if (device_current(book, entry.reads) || book.device_op == DeviceOp::loading) continue;
        if (!entry.reads) {
          // Fully overwritten by its step: space, no load.
          if (device_blocked || book.device.valid()) continue;
          if (allocate_device(entry.tensor, d)) {
            book.device_version = book.version;
            book.device_placeholder = true;
          } else {
            device_blocked = true;
          }
          continue;
        }
        const bool host_current = book.host_allocated && book.host_version == book.version;
        if (host_current) {
          if (device_blocked || book.host_op != HostOp::none || h2d_in_flight >= options.copies_in_flight) continue;
          if (book.device.valid() || allocate_device(entry.tensor, d))
            issue_h2d(entry.tensor);
          else
            device_blocked = true;
          continue;
        }
        if (book.spec.home != Home::nvme || book.host_op != HostOp::none) continue;  // in flight
        host_horizon_bytes += book.aligned_bytes;
        if (host_horizon_bytes > host_limit && d > 0) host_blocked = true;
        if (host_blocked) continue;
        if (io_in_flight >= options.io_queue_tensors) {
          host_blocked = true;
          continue;
        }
        if (book.host_allocated || allocate_host(entry.tensor, d))
          issue_io(entry.tensor, /*is_write=*/false);
        else
          host_blocked = true;
      }
    }
  }

  // In place there is one tier to fill: NVMe → host reads, walked in plan order as far as the
  // host budget (less the host-homed tensors) reaches. The host block is what the step uses.
  void prefetch_in_place() {
    const uint64_t host_room = options.host_budget_bytes - host_home_bytes;
    const uint64_t host_limit =
        options.host_lookahead_bytes ? std::min(options.host_lookahead_bytes, host_room) : host_room;
    uint64_t horizon_bytes = 0;
    ++epoch;
    for (uint64_t k = cursor_abs; k < cursor_abs + n(); ++k) {
      const uint64_t d = k - cursor_abs;
      for (const StepTensor& entry : step_tensors[k % n()]) {
        if (seen_epoch[entry.tensor] == epoch) continue;
        seen_epoch[entry.tensor] = epoch;
        Book& book = books[entry.tensor];
        if (book.spec.home != Home::nvme) continue;  // always resident
        horizon_bytes += book.aligned_bytes;
        if (horizon_bytes > host_limit && d > 0) return;
        if (book.read_error || book.host_op != HostOp::none) continue;  // reported by acquire / in flight
        if (!entry.reads) {
          // Fully overwritten by its step: a block, no read. Its version stays "none" until
          // the step is acquired, so nothing writes it back or reads from it before then.
          if (book.host_allocated) continue;
          if (!allocate_host(entry.tensor, d)) return compact_for_cursor_step(d);
          book.host_version = kNoVersion;
          continue;
        }
        if (book.host_allocated && book.host_version == book.version) continue;
        if (io_in_flight >= options.io_queue_tensors) return;
        if (!book.host_allocated && !allocate_host(entry.tensor, d)) return compact_for_cursor_step(d);
        issue_io(entry.tensor, /*is_write=*/false);
      }
    }
  }

  // In place the cursor step needs all its blocks at once. When the arena (which does not move
  // live blocks) is too fragmented to place one although the budget has room, and nothing in
  // flight or pinned will free space by itself, every idle clean NVMe-homed block goes and the
  // pass runs again: what is left are the host-homed blocks taken at create, so the step's
  // blocks, allocated largest first, fit. Evicting the step's own blocks one at a time
  // instead only moved the hole around (each pass took the block the previous one placed).
  void compact_for_cursor_step(uint64_t need_distance) {
    if (need_distance != 0 || io_in_flight > 0) return;
    for (const Book& book : books)
      if (book.pins > 0) return;
    bool evicted = false;
    for (size_t i = 0; i < books.size(); ++i) {
      const Book& book = books[i];
      if (book.spec.home == Home::nvme && book.host_allocated && book.host_op == HostOp::none && host_droppable(book)) {
        evict(Tier::host, static_cast<TensorId>(i));
        evicted = true;
      }
    }
    if (evicted) work_pending = true;
  }

  void pump_loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      pump_cv.wait(lock, [&] { return work_pending || stopping; });
      if (stopping) return;
      work_pending = false;
      write_back();
      if (options.compute_in_place)
        prefetch_in_place();
      else
        prefetch();
      // A pass can make the cursor step ready by itself, with no completion to say so: the
      // last missing tensor was a write-only one that just got its space (an eviction and an
      // allocation, no copy). Without this wake-up, a consumer that had already looked and
      // gone back to sleep waited for a completion that never came (issue 12's stall:
      // tests `WriteOnlyTensorPlacedByThePumpWakesTheWaiter`).
      ready_cv.notify_all();
      if (copy_queue.empty()) continue;
      // The books already say these copies are in flight, so nothing decided meanwhile
      // touches their buffers; enqueue them with the lock released (see issue_h2d).
      copies_to_enqueue.swap(copy_queue);
      lock.unlock();
      for (const CopyCommand& copy : copies_to_enqueue) enqueue_copy(copy);
      copies_to_enqueue.clear();
      lock.lock();
    }
  }

  // --- the I/O thread ---

  void io_loop() {
    struct Pending {
      IoCommand command;
      uint64_t ticket;
      uint64_t start_ns;
    };
    std::deque<Pending> running;
    std::vector<IoCommand> batch;
    batch.reserve(options.io_queue_tensors);
    uint32_t reads_running = 0, writes_running = 0;
    uint64_t read_busy_start_ns = 0, write_busy_start_ns = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex);
        io_cv.wait(lock, [&] { return stopping || !io_queue.empty() || !running.empty(); });
        if (stopping && !io_queue.empty() && io_queue.front().call == nullptr) {
          // Work not yet submitted is dropped; what is in flight completes below.
          io_in_flight -= static_cast<uint32_t>(io_queue.size());
          io_queue.clear();
        }
        if (stopping && io_queue.empty() && running.empty()) return;
        // Transfers up to the first call; a call waits for everything before it.
        while (!io_queue.empty()) {
          if (io_queue.front().call != nullptr) {
            if (!batch.empty() || !running.empty()) break;
            IoCall* call = io_queue.front().call;
            io_queue.pop_front();
            lock.unlock();
            Status result = call->fn();
            lock.lock();
            call->result = std::move(result);
            call->done = true;
            ready_cv.notify_all();
            continue;
          }
          batch.push_back(io_queue.front());
          io_queue.pop_front();
        }
      }
      for (const IoCommand& command : batch) {
        const Book& book = books[command.tensor];  // spec and size are immutable
        const uint64_t start_ns = Timeline::now_ns();
        Result<uint64_t> ticket = command.is_write
                                      ? backing->submit_write(command.tensor, book.spec, command.buffer)
                                      : backing->submit_read(command.tensor, book.spec, command.buffer);
        if (!ticket.ok()) {
          complete_io(command, ticket.status(), start_ns, start_ns);
          continue;
        }
        if (command.is_write) {
          if (writes_running++ == 0) write_busy_start_ns = start_ns;
        } else {
          if (reads_running++ == 0) read_busy_start_ns = start_ns;
        }
        running.push_back(Pending{command, *ticket, start_ns});
      }
      batch.clear();
      if (running.empty()) continue;
      // Oldest first: the pump queues in the order it needs things.
      Pending front = running.front();
      running.pop_front();
      Status status = backing->wait(front.ticket);
      const uint64_t end_ns = Timeline::now_ns();
      uint64_t busy_ns = 0;
      if (front.command.is_write) {
        if (--writes_running == 0) busy_ns = end_ns - write_busy_start_ns, write_busy_start_ns = end_ns;
      } else {
        if (--reads_running == 0) busy_ns = end_ns - read_busy_start_ns, read_busy_start_ns = end_ns;
      }
      complete_io(front.command, std::move(status), front.start_ns, end_ns, busy_ns);
    }
  }

  void complete_io(const IoCommand& command, Status status, uint64_t start_ns, uint64_t end_ns,
                   uint64_t busy_ns = 0) {
    std::lock_guard lock(mutex);
    Book& book = books[command.tensor];
    book.host_op = HostOp::none;
    --io_in_flight;
    TransferStats& t =
        stats.transfers[static_cast<size_t>(command.is_write ? TierPair::host_to_nvme : TierPair::nvme_to_host)];
    t.busy_ns += busy_ns;
    if (status.ok()) {
      t.bytes += book.spec.size_bytes;
      ++t.transfers;
      if (command.is_write)
        book.nvme_version = std::max(book.nvme_version, command.version);
      else
        book.host_version = command.version;
      trace(command.is_write ? TraceTrack::io_write : TraceTrack::io, book, start_ns, end_ns);
    } else {
      Error error = status.error();
      if (error.tensor.empty()) error.tensor = book.spec.name;
      if (command.is_write) {
        error.message = fmt::format("write-back of '{}' to NVMe failed: {}", book.spec.name, error.message);
        fail_sticky(std::move(error));
      } else {
        book.read_error = std::move(error);
      }
    }
    work_pending = true;
    pump_cv.notify_one();
    ready_cv.notify_all();
  }

  // --- caller side ---

  bool step_ready(size_t step) const {
    for (const StepTensor& entry : step_tensors[step]) {
      const Book& book = books[entry.tensor];
      if (!device_current(book, entry.reads)) return false;
      if (entry.writes && book.device_op != DeviceOp::none) return false;  // a d2h still reads it
      // In place: a block on its way to NVMe is not written under the write (crash safety).
      if (entry.writes && options.compute_in_place && book.host_op != HostOp::none) return false;
    }
    return true;
  }

  std::optional<Error> step_error(size_t step) const {
    for (const StepTensor& entry : step_tensors[step]) {
      const Book& book = books[entry.tensor];
      if (book.read_error && !device_current(book, entry.reads)) {
        Error error = *book.read_error;
        error.message = fmt::format("step '{}' needs tensor '{}', whose prefetch from NVMe failed: {}",
                                    plan.steps()[step].name, book.spec.name, error.message);
        return error;
      }
    }
    if (sticky_error) return *sticky_error;
    return std::nullopt;
  }
};

// --- public ---------------------------------------------------------------------------

Scheduler::Scheduler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Scheduler>> Scheduler::create(AccessPlan plan, device::Device& device,
                                                     memory::HostArena& host_arena, NvmeBacking* backing,
                                                     SchedulerOptions options) {
  STRATA_RETURN_IF_ERROR(plan.validate());
  if (options.host_budget_bytes == 0)
    return make_error(ErrorKind::invalid_argument, "the scheduler needs a host budget (host_budget_bytes)");
  if (options.io_queue_tensors == 0) options.io_queue_tensors = 1;
  if (options.copies_in_flight == 0) options.copies_in_flight = 1;
  const uint64_t device_alignment = device::kDeviceAlignmentBytes;
  const uint64_t host_alignment = host_arena.alignment_bytes();

  uint64_t host_home_bytes = 0;
  bool any_nvme = false;
  for (const PlanTensor& tensor : plan.tensors()) {
    if (tensor.home == Home::host)
      host_home_bytes += align_up(tensor.size_bytes, host_alignment);
    else
      any_nvme = true;
  }
  if (any_nvme && backing == nullptr)
    return make_error(ErrorKind::invalid_argument, "the plan has NVMe-homed tensors but no NVMe backing was given");
  if (host_home_bytes > options.host_budget_bytes)
    return make_error(ErrorKind::no_space,
                      fmt::format("host-homed tensors need {} but the host budget is {}", format_size(host_home_bytes),
                                  format_size(options.host_budget_bytes)));
  // Refuse up front a step that cannot fit a budget on its own.
  for (size_t step = 0; step < plan.step_count(); ++step) {
    const uint64_t device_bytes = plan.step_bytes(step, device_alignment);
    if (!options.compute_in_place && device_bytes > device.budget_bytes())
      return make_error(ErrorKind::no_space,
                        fmt::format("plan step '{}' needs {} ({} bytes) on the device at once, but the device "
                                    "budget is {} ({} bytes)",
                                    plan.steps()[step].name, format_size(device_bytes), device_bytes,
                                    format_size(device.budget_bytes()), device.budget_bytes()));
    uint64_t largest_nvme_bytes = 0, step_nvme_bytes = 0;
    for (TensorId id : plan.step_tensors(step))
      if (plan.tensors()[id].home == Home::nvme) {
        const uint64_t bytes = align_up(plan.tensors()[id].size_bytes, std::max(device_alignment, host_alignment));
        largest_nvme_bytes = std::max(largest_nvme_bytes, bytes);
        step_nvme_bytes += bytes;
      }
    // In place every NVMe-homed tensor of the step is in host memory at once.
    if (options.compute_in_place && host_home_bytes + step_nvme_bytes > options.host_budget_bytes)
      return make_error(ErrorKind::no_space,
                        fmt::format("plan step '{}' computes in place on {} of NVMe-homed tensors beside {} of "
                                    "host-homed tensors, but the host budget (the one pool of a CPU device) is {}",
                                    plan.steps()[step].name, format_size(step_nvme_bytes),
                                    format_size(host_home_bytes), format_size(options.host_budget_bytes)));
    // Every NVMe-homed tensor passes through a host block on its way up or down.
    if (host_home_bytes + largest_nvme_bytes > options.host_budget_bytes)
      return make_error(ErrorKind::no_space,
                        fmt::format("plan step '{}' needs a {} host staging block beside {} of host-homed "
                                    "tensors, but the host budget is {}",
                                    plan.steps()[step].name, format_size(largest_nvme_bytes),
                                    format_size(host_home_bytes), format_size(options.host_budget_bytes)));
  }
  if (options.host_budget_bytes > host_arena.capacity_bytes())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("the host budget {} is larger than the pinned arena ({})",
                                  format_size(options.host_budget_bytes), format_size(host_arena.capacity_bytes())));

  auto impl = std::make_unique<Impl>(std::move(plan), device, host_arena, backing, std::move(options));
  Impl& s = *impl;
  s.host_home_bytes = host_home_bytes;
  s.external_device_bytes = device.memory_stats().used_bytes;
  {
    uint64_t largest_written_bytes = 0;
    for (const PlanStep& step : s.plan.steps())
      for (TensorId id : step.writes)
        if (s.plan.tensors()[id].home == Home::nvme)
          largest_written_bytes = std::max(largest_written_bytes, align_up(s.plan.tensors()[id].size_bytes,
                                                                           std::max(device_alignment, host_alignment)));
    const uint64_t staging_bytes = s.options.host_budget_bytes - host_home_bytes;
    // In place a write-back needs no block of its own: the step's block goes to NVMe as it is.
    if (!s.options.compute_in_place && 2 * largest_written_bytes <= staging_bytes / 4) s.write_back_reserve_bytes = 2 * largest_written_bytes;
  }
  s.books.resize(s.plan.tensors().size());
  s.seen_epoch.assign(s.books.size(), 0);
  for (auto& victims : s.victims_by_tier) victims.reserve(s.books.size());
  s.step_tensors.resize(s.n());
  for (size_t step = 0; step < s.n(); ++step) {
    const PlanStep& spec = s.plan.steps()[step];
    for (TensorId id : s.plan.step_tensors(step)) {
      const bool reads = std::find(spec.reads.begin(), spec.reads.end(), id) != spec.reads.end();
      const bool writes = std::find(spec.writes.begin(), spec.writes.end(), id) != spec.writes.end();
      s.step_tensors[step].push_back(StepTensor{id, reads, writes});
      s.books[id].uses.push_back(static_cast<uint32_t>(step));
      s.books[id].use_writes.push_back(writes ? 1 : 0);
    }
    // Largest first: the walk allocates in this order, which packs a step's tensors tightly.
    std::stable_sort(s.step_tensors[step].begin(), s.step_tensors[step].end(),
                     [&](const StepTensor& a, const StepTensor& b) {
                       return s.plan.tensors()[a.tensor].size_bytes > s.plan.tensors()[b.tensor].size_bytes;
                     });
  }
  // Until the scheduler is handed out, a failure part-way gives back every host block taken
  // (the arena outlives us: a leaked block would shrink it for good) and the registration.
  bool registered_host = false;
  auto undo = [&] {
    for (Book& taken : s.books)
      if (taken.host_allocated) {
        host_arena.free(taken.host);
        taken.host_allocated = false;
      }
    if (registered_host) device.unregister_host_memory(host_arena.base());
  };
  for (size_t id = 0; id < s.books.size(); ++id) {
    Book& book = s.books[id];
    book.spec = s.plan.tensors()[id];
    book.aligned_bytes = align_up(book.spec.size_bytes, std::max(device_alignment, host_alignment));
    if (book.spec.home == Home::nvme) {
      book.nvme_version = 0;
    } else {
      Result<memory::HostBlock> block = host_arena.allocate(book.aligned_bytes);
      if (!block.ok()) {
        undo();
        return block.error();
      }
      book.host = *block;
      book.host_allocated = true;
      book.host_version = 0;
      std::memset(book.host.data, 0, book.host.size_bytes);
      s.host_used_bytes += book.host.size_bytes;
    }
  }
  s.stats.stall_ns_by_step.assign(s.n(), 0);
  s.stats.host_budget_bytes = s.options.host_budget_bytes;
  s.stats.device_budget_bytes = device.budget_bytes();
  s.stats.host_high_water_bytes = s.host_used_bytes;
  if (s.options.trace_capacity_events > 0) s.timeline = std::make_unique<Timeline>(s.options.trace_capacity_events);
  if (backing != nullptr) {
    Status registered = backing->register_host(host_arena);
    if (!registered.ok())
      spdlog::warn("scheduler: host arena not registered with the NVMe engine ({}); reads still work, through the slower path",
                   registered.to_string());
  }
  // CUDA copies overlap only from pinned memory; the arena is pinned already when it came
  // from cudaHostAlloc, and registering it again is a no-op there.
  if (Status pinned = device.register_host_memory(host_arena.base(), host_arena.capacity_bytes()); !pinned.ok()) {
    undo();
    return pinned.error();
  }
  registered_host = true;
  for (auto [stream, name] : {std::pair{&s.h2d, "h2d"}, std::pair{&s.d2h, "d2h"}}) {
    Result<device::Stream> created = device.create_stream(name);
    if (!created.ok()) {
      undo();
      return created.error();
    }
    *stream = std::move(created).value();
  }
  s.copy_queue.reserve(2 * static_cast<size_t>(s.options.copies_in_flight));
  s.copies_to_enqueue.reserve(s.copy_queue.capacity());
  s.pump_thread = std::thread([&s] { s.pump_loop(); });
  s.io_thread = std::thread([&s] { s.io_loop(); });
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(impl)));
}

Scheduler::~Scheduler() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mutex);
    s.stopping = true;
  }
  s.pump_cv.notify_all();
  s.io_cv.notify_all();
  s.pump_thread.join();
  // Copies in flight finish (their callbacks take the lock, which nobody holds now).
  (void)s.device.synchronize(s.h2d);
  (void)s.device.synchronize(s.d2h);
  s.io_thread.join();
  s.h2d = device::Stream();
  s.d2h = device::Stream();
  for (Book& book : s.books) {
    book.device.reset();
    if (book.host_allocated) s.arena.free(book.host);
  }
  s.device.unregister_host_memory(s.arena.base());
}

Result<StepBuffers> Scheduler::acquire(size_t step) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  assert(step < s.n());
  if (step != s.cursor_abs % s.n())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("acquire of step {} ('{}') out of plan order: step {} is next", step,
                                  s.plan.steps()[step].name, s.cursor_abs % s.n()));
  if (std::optional<Error> error = s.step_error(step)) return *error;
  // Held steps and this one must fit together, or the wait below could never end — unless a
  // deferred release (release_after) is still to come and will unpin some of them.
  auto over_pinned = [&]() -> std::optional<Error> {
    if (s.deferred_releases > 0) return std::nullopt;
    // In place, pinned NVMe-homed blocks share the host budget with the host-homed tensors.
    const bool in_place = s.options.compute_in_place;
    uint64_t pinned_bytes = in_place ? s.host_home_bytes : 0;
    for (size_t id = 0; id < s.books.size(); ++id) {
      if (in_place && s.books[id].spec.home != Home::nvme) continue;
      const bool in_step = std::any_of(s.step_tensors[step].begin(), s.step_tensors[step].end(),
                                       [&](const StepTensor& e) { return e.tensor == id; });
      if (in_step || s.books[id].pins > 0) pinned_bytes += s.books[id].aligned_bytes;
    }
    const uint64_t budget_bytes = in_place ? s.options.host_budget_bytes : s.device.budget_bytes();
    if (pinned_bytes <= budget_bytes) return std::nullopt;
    return make_error(ErrorKind::no_space,
                      fmt::format("step '{}' cannot be acquired while {} step(s) are held: together they need {} "
                                  "{}, whose budget is {}",
                                  s.plan.steps()[step].name, s.held_steps.size(), format_size(pinned_bytes),
                                  in_place ? "in host memory" : "on the device", format_size(budget_bytes)));
  };
  if (std::optional<Error> error = over_pinned()) return *error;
  const uint64_t start_ns = Timeline::now_ns();
  s.work_pending = true;
  s.pump_cv.notify_one();
  std::optional<Error> error;
  s.ready_cv.wait(lock, [&] {
    if (s.step_ready(step)) return true;
    error = s.step_error(step);
    if (!error) error = over_pinned();
    return error.has_value();
  });
  const uint64_t end_ns = Timeline::now_ns();
  const uint64_t stall_ns = end_ns - start_ns;
  s.stats.stall_ns += stall_ns;
  s.stats.stall_ns_by_step[step] += stall_ns;
  s.stats.max_step_stall_ns = std::max(s.stats.max_step_stall_ns, stall_ns);
  if (s.timeline && stall_ns >= kTraceStallMinNs)
    s.timeline->record(TraceTrack::stall, s.plan.steps()[step].name, start_ns, end_ns);
  if (error) return *error;

  StepBuffers buffers;
  buffers.step_ = step;
  for (const StepTensor& entry : s.step_tensors[step]) {
    Book& book = s.books[entry.tensor];
    ++book.pins;
    if (entry.writes) {
      ++book.write_pins;
      ++book.version;  // the copies below are now stale; the device copy is the newest
      if (s.options.compute_in_place) {
        book.host_version = book.version;  // the host block is the compute copy
      } else {
        book.device_version = book.version;
        book.device_placeholder = false;
      }
    }
    buffers.buffers_.emplace_back(entry.tensor, s.options.compute_in_place ? book.host.data : book.device.data());
  }
  ++s.stats.steps_acquired;
  ++s.cursor_abs;
  s.held_steps.push_back(step);
  s.work_pending = true;
  s.pump_cv.notify_one();
  return buffers;
}

Status Scheduler::release(size_t step) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  auto it = std::find(s.held_steps.begin(), s.held_steps.end(), step);
  if (it == s.held_steps.end())
    return make_error(ErrorKind::invalid_argument, fmt::format("release of step {} which is not held", step));
  s.held_steps.erase(it);
  for (const StepTensor& entry : s.step_tensors[step]) {
    Book& book = s.books[entry.tensor];
    assert(book.pins > 0);
    --book.pins;
    if (entry.writes) --book.write_pins;
  }
  s.work_pending = true;
  s.pump_cv.notify_one();
  // A waiting acquire's budget check (over_pinned) counts pins: it must look again.
  s.ready_cv.notify_all();
  return Status();
}

Status Scheduler::release_after(size_t step, device::Stream& stream) {
  {
    std::lock_guard lock(impl_->mutex);
    if (std::find(impl_->held_steps.begin(), impl_->held_steps.end(), step) == impl_->held_steps.end())
      return make_error(ErrorKind::invalid_argument, fmt::format("release of step {} which is not held", step));
  }
  {
    std::lock_guard lock(impl_->mutex);
    ++impl_->deferred_releases;
  }
  Status launched = impl_->device.launch(stream, [this, step] {
    // Unpin first, then stop counting the release as deferred: the other order leaves a moment
    // where the step is still held but no longer deferred, and an `acquire` checking its budget
    // then refuses with a no_space that the release an instant later would have avoided.
    Status released = release(step);
    assert(released.ok());
    (void)released;
    std::lock_guard lock(impl_->mutex);
    --impl_->deferred_releases;
    impl_->ready_cv.notify_all();  // the budget check of a waiting acquire depends on it
  });
  if (!launched.ok()) {
    std::lock_guard lock(impl_->mutex);
    --impl_->deferred_releases;
  }
  return launched;
}

Status Scheduler::flush() {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  if (!s.held_steps.empty())
    return make_error(ErrorKind::invalid_argument, "flush while steps are held: release them first");
  s.flushing = true;
  s.work_pending = true;
  s.pump_cv.notify_one();
  s.ready_cv.wait(lock, [&] {
    if (s.sticky_error) return true;
    for (const Book& book : s.books) {
      if (book.device_op != DeviceOp::none || book.host_op != HostOp::none) return false;
      if (book.spec.home == Home::nvme ? book.nvme_version != book.version : book.host_version != book.version)
        return false;
    }
    return true;
  });
  s.flushing = false;
  if (s.sticky_error) return *s.sticky_error;
  return Status();
}

void* Scheduler::begin_host_access(TensorId tensor) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  Book& book = s.books[tensor];
  assert(book.spec.home == Home::host && book.pins == 0);
  // No copy may be reading or filling the block while the caller has it.
  s.ready_cv.wait(lock, [&] { return book.host_op == HostOp::none && book.device_op == DeviceOp::none; });
  book.host_op = HostOp::caller;
  return book.host.data;
}

void Scheduler::end_host_access(TensorId tensor) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  Book& book = s.books[tensor];
  assert(book.host_op == HostOp::caller);
  book.host_op = HostOp::none;
  // The caller may have changed the bytes: the host copy becomes the newest, a device copy stale.
  book.version = std::max(book.version, book.device_version) + 1;
  book.host_version = book.version;
  s.work_pending = true;
  s.pump_cv.notify_one();
}

Status Scheduler::run_on_io_thread(std::function<Status()> fn) {
  Impl& s = *impl_;
  IoCall call{std::move(fn), Status(), false};
  std::unique_lock lock(s.mutex);
  s.io_queue.push_back(IoCommand{&call});
  s.io_cv.notify_one();
  s.ready_cv.wait(lock, [&] { return call.done; });
  return call.result;
}

const AccessPlan& Scheduler::plan() const { return impl_->plan; }

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

std::vector<Eviction> Scheduler::evictions() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->eviction_log;
}

Timeline* Scheduler::timeline() { return impl_->timeline.get(); }

}  // namespace strata::scheduler
