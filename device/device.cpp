// strata/device/device.cpp — what every device shares: the owners, the capped arena,
// the factory.
#include "device/device.h"

#include <cassert>
#include <mutex>

#include <fmt/format.h>

#include "common/size.h"
#include "memory/allocator.h"
#include "device/backend.h"
#include "strata_build_config.h"

namespace strata::device {

// Defined in cpu_device.cpp: `cpu` and `emulated` share its streams, events and region.
[[nodiscard]] Result<std::unique_ptr<Device>> make_cpu_device(Kind kind, uint64_t budget_bytes);

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::cpu: return "cpu";
    case Kind::cuda: return "cuda";
    case Kind::emulated: return "emulated";
  }
  return "?";
}

Result<Kind> parse_kind(std::string_view name) {
  if (name == "cpu") return Kind::cpu;
  if (name == "cuda") return Kind::cuda;
  if (name == "emulated") return Kind::emulated;
  return make_error(ErrorKind::invalid_argument,
                    fmt::format("device kind '{}' is not known; use cpu, cuda or emulated", name));
}

bool memory_is_host(Kind kind) { return kind == Kind::cpu; }

bool memory_is_host(std::string_view kind_name) {
  Result<Kind> kind = parse_kind(kind_name);
  assert(kind.ok());  // device.kind is checked when the config is read
  return kind.ok() && memory_is_host(*kind);
}

// --- owners ---------------------------------------------------------------------------

Stream::Stream() = default;
Stream::Stream(std::unique_ptr<StreamBackend> backend) : backend_(std::move(backend)) {}
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;
Stream::~Stream() = default;
const std::string& Stream::name() const { return backend_->name(); }
void* Stream::native_handle() const { return backend_->native_handle(); }

Event::Event() = default;
Event::Event(std::unique_ptr<EventBackend> backend) : backend_(std::move(backend)) {}
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;
Event::~Event() = default;

DeviceBuffer::DeviceBuffer(Device* device, void* data, uint64_t offset_bytes, uint64_t size_bytes)
    : device_(device), data_(data), offset_bytes_(offset_bytes), size_bytes_(size_bytes) {}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_), data_(other.data_), offset_bytes_(other.offset_bytes_),
      size_bytes_(other.size_bytes_) {
  other.device_ = nullptr;
  other.data_ = nullptr;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    offset_bytes_ = other.offset_bytes_;
    size_bytes_ = other.size_bytes_;
    other.device_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() {
  if (device_ != nullptr) device_->free_range(offset_bytes_, size_bytes_);
  device_ = nullptr;
  data_ = nullptr;
  offset_bytes_ = 0;
  size_bytes_ = 0;
}

// --- the arena ------------------------------------------------------------------------

struct Device::Arena {
  explicit Arena(uint64_t capacity_bytes) : allocator(capacity_bytes, kDeviceAlignmentBytes) {}
  memory::RangeAllocator allocator;
  std::mutex hook_mutex;
  AllocationHook hook;
};

Device::Device(uint64_t budget_bytes, void* region_base)
    : budget_bytes_(budget_bytes), region_base_(static_cast<char*>(region_base)),
      arena_(std::make_unique<Arena>(budget_bytes)) {}

Device::~Device() = default;

Result<DeviceBuffer> Device::allocate(uint64_t size_bytes) {
  assert(size_bytes > 0);
  Result<memory::Block> block = arena_->allocator.allocate(size_bytes);
  if (!block.ok()) {
    Error error = block.error();
    error.message = fmt::format("device arena ({} budget): {}", format_size(budget_bytes_), error.message);
    return error;
  }
  const uint64_t used_bytes = arena_->allocator.stats().used_bytes;
  // The region is exactly the budget, so this holds by construction; the check guards the
  // construction itself (a wrong capacity would show here first).
  assert(used_bytes <= budget_bytes_);
  {
    std::lock_guard lock(arena_->hook_mutex);
    if (arena_->hook) arena_->hook(used_bytes, budget_bytes_);
  }
  return DeviceBuffer(this, region_base_ + block->offset_bytes, block->offset_bytes, block->size_bytes);
}

void Device::free_range(uint64_t offset_bytes, uint64_t size_bytes) {
  arena_->allocator.free(memory::Block{offset_bytes, size_bytes});
}

DeviceMemoryStats Device::memory_stats() const {
  memory::AllocatorStats stats = arena_->allocator.stats();
  DeviceMemoryStats out;
  out.budget_bytes = budget_bytes_;
  out.used_bytes = stats.used_bytes;
  out.high_water_bytes = stats.peak_used_bytes;
  out.live_buffers = stats.live_block_count;
  out.failed_allocations = stats.failed_allocations;
  return out;
}

void Device::set_allocation_hook(AllocationHook hook) {
  std::lock_guard lock(arena_->hook_mutex);
  arena_->hook = std::move(hook);
}

// --- factory --------------------------------------------------------------------------

Result<std::unique_ptr<Device>> make_device(Kind kind, uint64_t budget_bytes, int cuda_ordinal) {
  budget_bytes = align_down(budget_bytes, kDeviceAlignmentBytes);
  if (budget_bytes == 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("device budget must be at least {} bytes", kDeviceAlignmentBytes));
  switch (kind) {
    case Kind::cpu:
    case Kind::emulated:
      return make_cpu_device(kind, budget_bytes);
    case Kind::cuda:
#if STRATA_HAVE_CUDA
      return make_cuda_device(budget_bytes, cuda_ordinal);
#else
      (void)cuda_ordinal;
      return make_error(ErrorKind::unsupported,
                        "device kind 'cuda' needs a build with CUDA (nvcc was not found at setup)");
#endif
  }
  return make_error(ErrorKind::invalid_argument, "unknown device kind");
}

int cuda_device_count() {
#if STRATA_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

Result<int> cuda_device_count_or_error() {
#if STRATA_HAVE_CUDA
  return cuda_device_count_checked_impl();
#else
  return 0;
#endif
}

}  // namespace strata::device
