// strata/device/cpu_device.cpp — the CPU device: streams are ordered worker threads,
// events are completion counters behind a mutex and a condition variable, memory is one
// page-aligned mapping of exactly the budget. Copies are real memcpy on the copy stream's own
// thread, so a copy and a compute task on two streams really run at the same time.
//
// The same machinery is the `emulated` discrete device (device.h): only its kind differs, so
// the engine keeps its state apart from host memory (`memory_is_host()` is false) and every
// byte reaches the region by an explicit copy on a stream, ordered like a GPU's.

#include <cassert>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/pages.h"
#include "common/size.h"
#include "device/backend.h"

namespace strata::device {
namespace {

// Tasks queued per stream at most; enqueueing blocks beyond this so a runaway producer cannot
// grow memory without bound. The ring is allocated once, with the stream.
constexpr size_t kStreamQueueSlots = 1024;

class CpuStream final : public StreamBackend {
 public:
  CpuStream(const Device* owner, std::string name)
      : owner_(owner), name_(std::move(name)), slots_(kStreamQueueSlots) {
    worker_ = std::thread([this] { run(); });
  }
  ~CpuStream() override {
    {
      std::unique_lock lock(mutex_);
      stopping_ = true;
    }
    not_empty_.notify_all();
    worker_.join();  // runs what was queued first: the worker drains before it honours stop
  }

  const std::string& name() const override { return name_; }
  void* native_handle() const override { return nullptr; }
  const Device* owner() const override { return owner_; }

  // Queues `task`; blocks while the queue is full. Returns its sequence number (1-based).
  uint64_t enqueue(std::function<void()> task) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return enqueued_ - started_ < slots_.size(); });
    slots_[enqueued_ % slots_.size()] = std::move(task);
    const uint64_t sequence = ++enqueued_;
    lock.unlock();
    not_empty_.notify_one();
    return sequence;
  }

  // Blocks until every task queued before the call has run.
  void synchronize() {
    std::unique_lock lock(mutex_);
    const uint64_t target = enqueued_;
    done_.wait(lock, [&] { return completed_ >= target; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      not_empty_.wait(lock, [&] { return started_ < enqueued_ || stopping_; });
      if (started_ == enqueued_) return;  // stopping, and nothing left
      std::function<void()> task = std::move(slots_[started_ % slots_.size()]);
      slots_[started_ % slots_.size()] = nullptr;
      ++started_;
      lock.unlock();
      not_full_.notify_one();
      task();
      task = nullptr;  // drop captures before signalling completion
      lock.lock();
      ++completed_;
      done_.notify_all();
    }
  }

  const Device* owner_;
  std::string name_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_, done_;
  std::vector<std::function<void()>> slots_;
  uint64_t enqueued_ = 0, started_ = 0, completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// An event is a pair of counters: `recorded` counts record() calls, `completed` the highest
// record whose point in its stream has run. A wait captures `recorded` when it is made, so a
// later re-record does not move the target of a wait already made (as with cudaEvent).
class CpuEvent final : public EventBackend {
 public:
  explicit CpuEvent(const Device* owner) : owner_(owner) {}
  const Device* owner() const override { return owner_; }

  uint64_t next_record() {
    std::lock_guard lock(mutex_);
    return ++recorded_;
  }
  void complete(uint64_t sequence) {
    // Notify under the lock: a waiter that sees the new count may destroy the event at once,
    // and a notify after the unlock would then touch a freed condition variable (ThreadSanitizer
    // caught exactly that in the device suite).
    std::lock_guard lock(mutex_);
    if (sequence > completed_) completed_ = sequence;
    cv_.notify_all();
  }
  uint64_t recorded() {
    std::lock_guard lock(mutex_);
    return recorded_;
  }
  void wait_for(uint64_t sequence) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return completed_ >= sequence; });
  }
  bool is_complete() {
    std::lock_guard lock(mutex_);
    return completed_ >= recorded_;
  }

 private:
  const Device* owner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0, completed_ = 0;
};

class CpuDevice final : public Device {
 public:
  CpuDevice(Kind kind, PageMapping region, uint64_t budget_bytes)
      : Device(budget_bytes, region.data()), kind_(kind), region_(std::move(region)) {}

  Kind kind() const override { return kind_; }
  std::string describe() const override {
    if (kind_ == Kind::emulated)
      return fmt::format("emulated discrete device ({} arena, copies and CPU kernels on one worker thread per "
                         "stream; for verification)",
                         format_size(budget_bytes()));
    return fmt::format("cpu device ({} arena, one worker thread per stream)", format_size(budget_bytes()));
  }

  Result<Stream> create_stream(std::string name) override {
    return Stream(std::make_unique<CpuStream>(this, std::move(name)));
  }
  Result<Event> create_event() override { return Event(std::make_unique<CpuEvent>(this)); }

  Status record(Event& event, Stream& stream) override {
    CpuEvent& e = own(event);
    const uint64_t sequence = e.next_record();
    own(stream).enqueue([&e, sequence] { e.complete(sequence); });
    return Status();
  }
  Status wait(Event& event) override {
    CpuEvent& e = own(event);
    e.wait_for(e.recorded());
    return Status();
  }
  Result<bool> query(Event& event) override { return own(event).is_complete(); }
  Status stream_wait(Stream& stream, Event& event) override {
    CpuEvent& e = own(event);
    const uint64_t target = e.recorded();
    if (target == 0) return Status();
    own(stream).enqueue([&e, target] { e.wait_for(target); });
    return Status();
  }
  Status synchronize(Stream& stream) override {
    own(stream).synchronize();
    return Status();
  }

  Status copy_to_device(Stream& stream, void* device_dst, const void* host_src,
                        uint64_t size_bytes) override {
    assert(in_region(device_dst, size_bytes));
    assert(host_side_ok(host_src, size_bytes));
    own(stream).enqueue([=] { std::memcpy(device_dst, host_src, size_bytes); });
    return Status();
  }
  Status copy_to_host(Stream& stream, void* host_dst, const void* device_src,
                      uint64_t size_bytes) override {
    assert(in_region(device_src, size_bytes));
    assert(host_side_ok(host_dst, size_bytes));
    own(stream).enqueue([=] { std::memcpy(host_dst, device_src, size_bytes); });
    return Status();
  }
  Status copy_on_device(Stream& stream, void* device_dst, const void* device_src,
                        uint64_t size_bytes) override {
    assert(in_region(device_dst, size_bytes) && in_region(device_src, size_bytes));
    own(stream).enqueue([=] { std::memcpy(device_dst, device_src, size_bytes); });
    return Status();
  }
  Status launch(Stream& stream, std::function<void()> fn) override {
    own(stream).enqueue(std::move(fn));
    return Status();
  }
  Status register_host_memory(void*, uint64_t) override { return Status(); }
  void unregister_host_memory(void*) override {}

 private:
  CpuStream& own(Stream& stream) const {
    assert(stream.valid() && stream.backend().owner() == this);
    return static_cast<CpuStream&>(stream.backend());
  }
  CpuEvent& own(Event& event) const {
    assert(event.valid() && event.backend().owner() == this);
    return static_cast<CpuEvent&>(event.backend());
  }
  bool in_region(const void* data, uint64_t size_bytes) const {
    auto* begin = reinterpret_cast<const char*>(region_.data());
    auto* p = static_cast<const char*>(data);
    return p >= begin && p + size_bytes <= begin + budget_bytes();
  }

  Kind kind_;  // cpu or emulated
  // Emulated: the host side of a host↔device copy must be host memory, as cudaMemcpyAsync's
  // direction demands — a device address there is a bug a GPU would fault on.
  bool host_side_ok(const void* data, uint64_t size_bytes) const {
    if (kind_ != Kind::emulated) return true;
    auto* begin = reinterpret_cast<const char*>(region_.data());
    auto* p = static_cast<const char*>(data);
    return p + size_bytes <= begin || p >= begin + budget_bytes();
  }

  // The budget's one anonymous mapping (rounded to 2 MiB), in huge pages and pre-faulted
  // (common/pages.h): the first copies are neither page-fault bound nor split per 4 KiB page.
  PageMapping region_;
};

}  // namespace

Result<std::unique_ptr<Device>> make_cpu_device(Kind kind, uint64_t budget_bytes) {
  assert(kind == Kind::cpu || kind == Kind::emulated);
  STRATA_ASSIGN_OR_RETURN(PageMapping region,
                          PageMapping::map(budget_bytes, PageMappingOptions{},
                                           kind == Kind::emulated ? "emulated device region" : "cpu device region"));
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>(kind, std::move(region), budget_bytes));
}

}  // namespace strata::device
