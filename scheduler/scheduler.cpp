// strata/scheduler/scheduler.cpp — the threaded driver of the residency model: the pump
// carries out the decisions of scheduler/residency.h (copies on the streams, NVMe transfers on
// the I/O thread) and feeds their completions back; the caller-facing acquire / release. See
// scheduler.h for the threads and residency.h for the policy and the version rules.
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
#include "scheduler/residency.h"

namespace strata::scheduler {
namespace {

// Waits shorter than this are not drawn on the timeline (they are still counted).
constexpr uint64_t kTraceStallMinNs = 20'000;

// The driver's side of a tensor: its bytes in each tier (the residency keeps the books).
struct Book {
  PlanTensor spec;
  device::DeviceBuffer device;
  memory::HostBlock host;
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

}  // namespace

void* StepBuffers::device_data(TensorId tensor) const {
  for (const auto& [id, data] : buffers_)
    if (id == tensor) return data;
  assert(false && "tensor is not part of this step");
  return nullptr;
}

struct Scheduler::Impl final : ResidencyMemory {
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
  device::Stream h2d, d2h;
  std::unique_ptr<Timeline> owned_timeline;  // trace_capacity_events > 0 and no options.timeline
  Timeline* timeline = nullptr;              // owned_timeline, or the caller's options.timeline

  // --- guarded by mutex ---
  mutable std::mutex mutex;
  std::condition_variable pump_cv, ready_cv, io_cv;
  bool work_pending = true;
  bool stopping = false;
  std::unique_ptr<Residency> residency;  // the books and every decision
  std::vector<Book> books;
  std::vector<size_t> held_steps;      // plan indexes of acquired, unreleased steps
  uint32_t deferred_releases = 0;      // release_after calls whose stream has not reached them
  std::deque<IoCommand> io_queue;
  std::vector<CopyCommand> copy_queue;  // decided this pass, not yet enqueued (pump only)
  std::vector<CopyCommand> copies_to_enqueue;  // the pump's, outside the lock
  SchedulerStats stats;
  uint64_t h2d_start_ns = 0, d2h_start_ns = 0;  // the running copy of each (serial) stream

  std::thread pump_thread, io_thread;

  size_t n() const { return plan.step_count(); }

  // --- ResidencyMemory: the real arenas (called by the residency, under the lock) ---
  uint64_t allocate(Tier tier, TensorId tensor, uint64_t size_bytes) override {
    Book& book = books[tensor];
    if (tier == Tier::device) {
      Result<device::DeviceBuffer> buffer = device.allocate(size_bytes);
      if (!buffer.ok()) return 0;
      book.device = std::move(buffer).value();
      return book.device.size_bytes();
    }
    Result<memory::HostBlock> block = arena.allocate(size_bytes);
    if (!block.ok()) return 0;
    book.host = *block;
    return book.host.size_bytes;
  }
  void free(Tier tier, TensorId tensor) override {
    Book& book = books[tensor];
    if (tier == Tier::device) {
      book.device.reset();
    } else {
      arena.free(book.host);
      book.host = {};
    }
  }
  uint64_t device_used_bytes() const override { return device.memory_stats().used_bytes; }
  uint64_t device_budget_bytes() const override { return device.budget_bytes(); }

  void trace(TraceTrack track, const Book& book, uint64_t start_ns, uint64_t end_ns) {
    if (timeline) timeline->record(track, book.spec.name, start_ns, end_ns, book.spec.size_bytes);
  }

  void fail_sticky(Error error) {
    residency->fail(std::move(error));
    ready_cv.notify_all();
  }

  // Binds the calling (pump or I/O) thread to the device. A thread that cannot bind does no
  // work: the sticky error fails the next acquire and flush, which is how a caller learns it.
  bool bind_thread() {
    Status bound = device.bind_thread();
    if (bound.ok()) return true;
    std::lock_guard lock(mutex);
    fail_sticky(bound.error());
    return false;
  }

  // --- carrying out the residency's commands ---

  // Takes the commands of the pass just made (under the lock): NVMe transfers go to the I/O
  // thread's queue, copies to `copy_queue`. Copies are enqueued outside the lock
  // (`enqueue_copy`): a device stream's queue is bounded and its completion callbacks take
  // this mutex, so enqueueing under it deadlocks once the queue fills (the CPU stream's ring
  // holds 1024 tasks; three per copy).
  void take_commands() {
    for (const ResidencyCommand& command : residency->commands()) {
      Book& book = books[command.tensor];
      switch (command.kind) {
        case CommandKind::h2d:
        case CommandKind::d2h:
          copy_queue.push_back(CopyCommand{command.kind == CommandKind::h2d, command.tensor, command.version,
                                           book.device.data(), book.host.data, book.spec.size_bytes});
          break;
        case CommandKind::nvme_read:
        case CommandKind::nvme_write:
          io_queue.push_back(IoCommand{nullptr, command.kind == CommandKind::nvme_write, command.tensor,
                                       book.host.data, command.version});
          io_cv.notify_one();
          break;
      }
    }
    residency->commands().clear();
  }

  // Enqueues a copy decided in a pass; called by the pump with the lock released.
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
        residency->h2d_done(id, version);
        copy_finished(TierPair::host_to_device, TraceTrack::h2d, books[id], h2d_start_ns, end_ns);
      });
    else if (status.ok())
      status = device.launch(stream, [this, id, version] {
        const uint64_t end_ns = Timeline::now_ns();
        std::lock_guard lock(mutex);
        residency->d2h_done(id, version);
        copy_finished(TierPair::device_to_host, TraceTrack::d2h, books[id], d2h_start_ns, end_ns);
      });
    if (!status.ok()) {
      std::lock_guard lock(mutex);
      fail_sticky(status.error());
    }
  }

  // The counts of a finished host↔device copy (under the lock): counts, trace, wake-ups.
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

  // --- the pump ---

  void pump_loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      pump_cv.wait(lock, [&] { return work_pending || stopping; });
      if (stopping) return;
      work_pending = false;
      // True: the in-place pool was compacted; the next pass places the cursor step.
      if (residency->pass()) work_pending = true;
      take_commands();
      // A pass can make the cursor step ready by itself, with no completion to say so: the
      // last missing tensor was a write-only one that just got its space (an eviction and an
      // allocation, no copy). Without this wake-up, a consumer that had already looked and
      // gone back to sleep waited for a completion that never came (issue 12's stall:
      // tests `WriteOnlyTensorPlacedByThePumpWakesTheWaiter`).
      ready_cv.notify_all();
      if (copy_queue.empty()) continue;
      // The books already say these copies are in flight, so nothing decided meanwhile
      // touches their buffers; enqueue them with the lock released (see take_commands).
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
          for (const IoCommand& dropped : io_queue) residency->io_dropped(dropped.tensor);
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
      // Oldest first: the pump queues in the order it needs things. Waited for an extent at a
      // time, so what the pump queues meanwhile goes to the drive within an extent, not a whole
      // tensor: a step released while its successor loads has the read after next submitted at
      // once, and a double-buffered ring keeps two reads in flight instead of one (measured
      // with whole-tensor waits: `strata bench overlap` streamed 64 MiB layers one at a time,
      // each ending with its queue drained).
      if (!backing->wait_some(running.front().ticket)) continue;
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
    const Book& book = books[command.tensor];
    TransferStats& t =
        stats.transfers[static_cast<size_t>(command.is_write ? TierPair::host_to_nvme : TierPair::nvme_to_host)];
    t.busy_ns += busy_ns;
    if (status.ok()) {
      t.bytes += book.spec.size_bytes;
      ++t.transfers;
      residency->io_done(command.tensor, command.is_write, command.version, std::nullopt);
      trace(command.is_write ? TraceTrack::io_write : TraceTrack::io, book, start_ns, end_ns);
    } else {
      Error error = status.error();
      if (error.tensor.empty()) error.tensor = book.spec.name;
      if (command.is_write) {
        residency->io_done(command.tensor, true, command.version, error);
        error.message = fmt::format("write-back of '{}' to NVMe failed: {}", book.spec.name, error.message);
        fail_sticky(std::move(error));
      } else {
        residency->io_done(command.tensor, false, command.version, std::move(error));
      }
    }
    work_pending = true;
    pump_cv.notify_one();
    ready_cv.notify_all();
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
  s.books.resize(s.plan.tensors().size());
  for (size_t id = 0; id < s.books.size(); ++id) s.books[id].spec = s.plan.tensors()[id];
  s.residency = std::make_unique<Residency>(s.plan, s.options, s, std::max(device_alignment, host_alignment));
  // Until the scheduler is handed out, a failure part-way gives back every host block taken
  // (the arena outlives us: a leaked block would shrink it for good) and the registration.
  bool registered_host = false;
  auto undo = [&] {
    s.residency->free_all_host();
    if (registered_host) device.unregister_host_memory(host_arena.base());
  };
  if (Status placed = s.residency->place_host_homed(); !placed.ok()) {
    undo();
    return placed.error();
  }
  for (const Book& book : s.books)
    if (book.spec.home == Home::host) std::memset(book.host.data, 0, book.host.size_bytes);
  s.stats.stall_ns_by_step.assign(s.n(), 0);
  s.stats.host_budget_bytes = s.options.host_budget_bytes;
  s.stats.device_budget_bytes = device.budget_bytes();
  if (s.options.timeline != nullptr) {
    s.timeline = s.options.timeline;
  } else if (s.options.trace_capacity_events > 0) {
    s.owned_timeline = std::make_unique<Timeline>(s.options.trace_capacity_events);
    s.timeline = s.owned_timeline.get();
  }
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
  // Both threads bind to the run's device before their first device call: on CUDA an unbound
  // thread would open a context on GPU 0 and enqueue the copies there (device.h, bind_thread).
  s.pump_thread = std::thread([&s] {
    if (s.bind_thread()) s.pump_loop();
  });
  s.io_thread = std::thread([&s] {
    if (s.bind_thread()) s.io_loop();
  });
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
  for (Book& book : s.books) book.device.reset();
  s.residency->free_all_host();
  s.device.unregister_host_memory(s.arena.base());
}

Result<StepBuffers> Scheduler::acquire(size_t step) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  Residency& r = *s.residency;
  assert(step < s.n());
  if (step != r.next_step())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("acquire of step {} ('{}') out of plan order: step {} is next", step,
                                  s.plan.steps()[step].name, r.next_step()));
  if (std::optional<Error> error = r.step_error(step)) return *error;
  // Held steps and this one must fit together, or the wait below could never end — unless a
  // deferred release (release_after) is still to come and will unpin some of them.
  auto over_pinned = [&] { return r.over_pinned(step, s.held_steps.size(), s.deferred_releases > 0); };
  if (std::optional<Error> error = over_pinned()) return *error;
  const uint64_t start_ns = Timeline::now_ns();
  s.work_pending = true;
  s.pump_cv.notify_one();
  std::optional<Error> error;
  s.ready_cv.wait(lock, [&] {
    if (r.step_ready(step)) return true;
    error = r.step_error(step);
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

  r.acquire(step);
  StepBuffers buffers;
  buffers.step_ = step;
  for (TensorId id : s.plan.step_tensors(step)) {
    const Book& book = s.books[id];
    buffers.buffers_.emplace_back(id, s.options.compute_in_place ? book.host.data : book.device.data());
  }
  ++s.stats.steps_acquired;
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
  s.residency->release(step);
  s.work_pending = true;
  s.pump_cv.notify_one();
  // A waiting acquire's budget check (over_pinned) counts pins: it must look again.
  s.ready_cv.notify_all();
  return Status();
}

Status Scheduler::release_after(size_t step, device::Stream& stream) {
  STRATA_RETURN_IF_ERROR(promise_release(step));
  return release_promised_after(step, stream);
}

Status Scheduler::promise_release(size_t step) {
  std::lock_guard lock(impl_->mutex);
  if (std::find(impl_->held_steps.begin(), impl_->held_steps.end(), step) == impl_->held_steps.end())
    return make_error(ErrorKind::invalid_argument, fmt::format("release of step {} which is not held", step));
  ++impl_->deferred_releases;
  return Status();
}

Status Scheduler::release_promised_after(size_t step, device::Stream& stream) {
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
    // The promise is kept even so: a step left held would make a later acquire wait forever.
    Status released = release(step);
    assert(released.ok());
    (void)released;
    std::lock_guard lock(impl_->mutex);
    --impl_->deferred_releases;
    impl_->ready_cv.notify_all();
  }
  return launched;
}

Status Scheduler::flush() {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  if (!s.held_steps.empty())
    return make_error(ErrorKind::invalid_argument, "flush while steps are held: release them first");
  s.residency->set_flushing(true);
  s.work_pending = true;
  s.pump_cv.notify_one();
  s.ready_cv.wait(lock, [&] { return s.residency->sticky_error() || s.residency->flushed(); });
  s.residency->set_flushing(false);
  if (s.residency->sticky_error()) return *s.residency->sticky_error();
  return Status();
}

void* Scheduler::begin_host_access(TensorId tensor) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mutex);
  // No copy may be reading or filling the block while the caller has it.
  s.ready_cv.wait(lock, [&] { return s.residency->host_idle(tensor); });
  s.residency->begin_host_access(tensor);
  return s.books[tensor].host.data;
}

void Scheduler::end_host_access(TensorId tensor) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mutex);
  s.residency->end_host_access(tensor);
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
  SchedulerStats stats = impl_->stats;
  const ResidencyCounters& counters = impl_->residency->counters();
  stats.device_evictions = counters.device_evictions;
  stats.host_evictions = counters.host_evictions;
  stats.device_high_water_bytes = counters.device_high_water_bytes;
  stats.host_high_water_bytes = counters.host_high_water_bytes;
  return stats;
}

std::vector<Eviction> Scheduler::evictions() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->residency->evictions();
}

Timeline* Scheduler::timeline() { return impl_->timeline; }

}  // namespace strata::scheduler
