// strata/device/device.h — the compute device as a memory tier with a copy engine.
//
// What it owns: a `Device` owns one memory region of exactly `budget_bytes` (one cudaMalloc on
// CUDA, one page-aligned host mapping on the CPU and emulated devices) and hands out pieces of it as
// `DeviceBuffer`s through a range allocator: the device can never hold more than its budget,
// because there is nothing beyond the region to allocate from. `Stream`, `Event` and
// `DeviceBuffer` are move-only owners; destroying one releases what it holds. They must be
// destroyed before the `Device` that made them.
//
// Kinds: `cpu` — device memory IS host memory: the CPU backend computes on the scheduler's
// pinned host blocks in place (`memory_is_host()`), and the region keeps only kernel scratch.
// `cuda` — a GPU: discrete memory, cudaStream_t / cudaEvent_t, the CUDA kernels. `emulated` — a
// discrete accelerator emulated on the CPU, for verification: its region is host memory the
// process owns, but it is used as a GPU's is — a capped arena of `device.memory`, every byte in
// or out crossing by an explicit asynchronous copy on a stream's worker thread, CUDA's
// stream/event/callback semantics — and it runs the CPU backend's kernels. So it takes the
// CUDA path's every branch except the kernels and must train bit-identically to `cpu`; it is
// slower than `cpu` (the copies are real). Every decision about where state lives and who
// updates it asks `memory_is_host`, never the kind's name.
//
// Streams: work enqueued on one stream runs in order; work on different streams may run at
// the same time. On the CPU and emulated devices each stream is one worker thread with a bounded queue of
// tasks (enqueueing blocks while the queue is full), so copies on a copy stream really run
// beside compute on a compute stream — overlap, stalls and budgets behave as on a GPU and are
// tested on machines without one. On CUDA a stream is a cudaStream_t (`native_handle()`), on
// which kernels/ launches its kernels directly.
//
// Events: `record(event, stream)` marks the point reached by the work enqueued so far; `wait`
// blocks the host until that point has run, `stream_wait` makes another stream wait for it
// without blocking the host, `query` asks without blocking. An event never recorded counts as
// complete (as cudaEventSynchronize does).
//
// Copies: `copy_to_device` / `copy_to_host` are asynchronous on the given stream; the host
// buffer and the device buffer must stay valid and untouched until an event recorded after
// the copy has completed. On CUDA the host side should be pinned (`register_host_memory`, or
// the pinned host arena), otherwise the copy is staged by the driver and does not overlap.
//
// Errors: enqueueing never fails on the CPU device; CUDA errors are reported by the call that
// sees them (asynchronous failures surface at `wait` / `synchronize`). Allocation that does not
// fit right now is a `no_space` error — the caller (the scheduler) evicts and retries; it is
// never an over-allocation.
//
// Threads: a Device and its objects may be used from several threads at once (streams,
// events and the allocator lock internally). Work enqueued on one stream from several threads
// runs in the order the enqueue calls returned.
//
// Alignment: every DeviceBuffer starts at a multiple of `kDeviceAlignmentBytes` (4 KiB) from
// the region base, so it suits O_DIRECT staging and vector loads alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::device {

inline constexpr uint64_t kDeviceAlignmentBytes = 4096;

enum class Kind : uint8_t { cpu, cuda, emulated };
const char* kind_name(Kind kind);  // "cpu", "cuda", "emulated": the names device.kind accepts
[[nodiscard]] Result<Kind> parse_kind(std::string_view name);
// True when the kind's device memory is host memory the CPU computes on in place (cpu); false
// for a discrete device (cuda, emulated). The one authority for that fact.
bool memory_is_host(Kind kind);
// The same for a validated `device.kind` name, where only the config exists (plans, budgets).
bool memory_is_host(std::string_view kind_name);

class Device;
class StreamBackend;  // device/backend.h
class EventBackend;

class Stream {
 public:
  Stream();
  explicit Stream(std::unique_ptr<StreamBackend> backend);
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();  // waits for the work already enqueued, then releases the stream

  bool valid() const { return backend_ != nullptr; }
  const std::string& name() const;
  // cudaStream_t on CUDA (cast it back), nullptr on the CPU device.
  void* native_handle() const;
  StreamBackend& backend() const { return *backend_; }

 private:
  std::unique_ptr<StreamBackend> backend_;
};

class Event {
 public:
  Event();
  explicit Event(std::unique_ptr<EventBackend> backend);
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  bool valid() const { return backend_ != nullptr; }
  EventBackend& backend() const { return *backend_; }

 private:
  std::unique_ptr<EventBackend> backend_;
};

// A piece of the device region. `data()` is a device address: dereference it on the host only
// on the CPU device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, void* data, uint64_t offset_bytes, uint64_t size_bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();  // returns the range to the arena; no work may still use it

  bool valid() const { return device_ != nullptr; }
  void* data() const { return data_; }
  uint64_t offset_bytes() const { return offset_bytes_; }
  uint64_t size_bytes() const { return size_bytes_; }
  void reset();

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  uint64_t offset_bytes_ = 0;
  uint64_t size_bytes_ = 0;
};

struct DeviceMemoryStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;        // allocated now (rounded to the alignment)
  uint64_t high_water_bytes = 0;  // the most ever allocated at once
  uint64_t live_buffers = 0;
  uint64_t failed_allocations = 0;  // no_space answers (the caller then evicts or waits)
};

class Device {
 public:
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual Kind kind() const = 0;
  virtual std::string describe() const = 0;
  // See `memory_is_host(Kind)`: whether buffers of this device may be computed on in place.
  bool memory_is_host() const { return device::memory_is_host(kind()); }

  // --- streams and events ---
  [[nodiscard]] virtual Result<Stream> create_stream(std::string name) = 0;
  [[nodiscard]] virtual Result<Event> create_event() = 0;
  [[nodiscard]] virtual Status record(Event& event, Stream& stream) = 0;
  [[nodiscard]] virtual Status wait(Event& event) = 0;        // the host waits
  [[nodiscard]] virtual Result<bool> query(Event& event) = 0;  // true: complete
  [[nodiscard]] virtual Status stream_wait(Stream& stream, Event& event) = 0;
  [[nodiscard]] virtual Status synchronize(Stream& stream) = 0;

  // --- work ---
  // Copies `size_bytes` host → device / device → host, ordered on `stream`.
  [[nodiscard]] virtual Status copy_to_device(Stream& stream, void* device_dst, const void* host_src,
                                              uint64_t size_bytes) = 0;
  [[nodiscard]] virtual Status copy_to_host(Stream& stream, void* host_dst, const void* device_src,
                                            uint64_t size_bytes) = 0;
  // Copies `size_bytes` device → device (both inside this device's memory), ordered on `stream`.
  [[nodiscard]] virtual Status copy_on_device(Stream& stream, void* device_dst, const void* device_src,
                                              uint64_t size_bytes) = 0;
  // Runs `fn` on the host in stream order: on the CPU device this is how compute runs; on
  // CUDA it is a host callback (cudaLaunchHostFunc) that must not call CUDA itself.
  [[nodiscard]] virtual Status launch(Stream& stream, std::function<void()> fn) = 0;
  // Makes the calling thread's device calls reach this device. CUDA keeps a current device per
  // thread, device 0 until set: a thread that calls CUDA without this first opens a context on
  // GPU 0 and enqueues there, whatever ordinal the run uses. So every thread strata starts that
  // may call the device (the scheduler's pump and I/O threads, the host-optimizer worker) calls
  // this before anything else. A no-op on the CPU and emulated devices.
  [[nodiscard]] virtual Status bind_thread() { return Status(); }
  // Pins a host range for fast asynchronous copies (no-op on the CPU device).
  [[nodiscard]] virtual Status register_host_memory(void* base, uint64_t size_bytes) = 0;
  virtual void unregister_host_memory(void* base) = 0;

  // --- memory: a hard budget, one region ---
  // A buffer of at least `size_bytes` (rounded up to kDeviceAlignmentBytes) or `no_space`.
  [[nodiscard]] Result<DeviceBuffer> allocate(uint64_t size_bytes);
  uint64_t budget_bytes() const { return budget_bytes_; }
  DeviceMemoryStats memory_stats() const;
  // Called after every successful allocation with the bytes in use and the budget, on the
  // allocating thread: tests use it to assert the budget at every allocation.
  using AllocationHook = std::function<void(uint64_t used_bytes, uint64_t budget_bytes)>;
  void set_allocation_hook(AllocationHook hook);

 protected:
  Device(uint64_t budget_bytes, void* region_base);

 private:
  friend class DeviceBuffer;
  void free_range(uint64_t offset_bytes, uint64_t size_bytes);

  struct Arena;
  uint64_t budget_bytes_;
  char* region_base_;
  std::unique_ptr<Arena> arena_;
};

// A device of `kind` with a region of exactly `budget_bytes` (rounded down to the alignment).
// `cuda` in a build without CUDA, or on a machine without a GPU, is an `unsupported` error.
[[nodiscard]] Result<std::unique_ptr<Device>> make_device(Kind kind, uint64_t budget_bytes,
                                                          int cuda_ordinal = 0);
// How many CUDA devices this process can see (0 in a build without CUDA, and 0 on any error).
int cuda_device_count();
// The same, telling "no GPU here" from a broken one: 0 in a build without CUDA, with no device
// or with no (or too old a) driver — the only reasons a CUDA test may skip (exit 77) — and an
// error for any other CUDA failure, which a test must report as a failure.
[[nodiscard]] Result<int> cuda_device_count_or_error();

}  // namespace strata::device
