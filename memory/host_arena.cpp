// strata/memory/host_arena.cpp — one pinned region, carved by the range allocator.
#include "memory/host_arena.h"

#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>

#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/pages.h"
#include "common/size.h"
#include "io/io.h"
#include "strata_build_config.h"

#if STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::memory {

const char* pin_kind_name(PinKind kind) {
  switch (kind) {
    case PinKind::cuda_host: return "cuda-host";
    case PinKind::mlock: return "mlock";
    case PinKind::unpinned: return "unpinned";
  }
  return "?";
}

struct HostArena::Region {
  Region(std::byte* base, uint64_t capacity, uint64_t alignment, PinKind kind, PageMapping pages = {})
      : base(base),
        capacity_bytes(capacity),
        alignment_bytes(alignment),
        pin_kind(kind),
        pages(std::move(pages)),
        allocator(capacity, alignment) {}
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() {
#if STRATA_HAVE_CUDA
    if (base != nullptr && pin_kind == PinKind::cuda_host) cudaFreeHost(base);
#endif
    // Otherwise `pages` unlocks and unmaps.
  }

  std::byte* base;
  uint64_t capacity_bytes;
  uint64_t alignment_bytes;
  PinKind pin_kind;
  PageMapping pages;  // the mapping on the mlock / unpinned path; empty under cudaHostAlloc
  RangeAllocator allocator;
};

namespace {

#if STRATA_HAVE_CUDA
// cudaHostAlloc when a GPU is really there; nullptr (and no error) otherwise, so CPU-only
// machines with a CUDA build fall through to mlock.
std::byte* try_cuda_host_alloc(uint64_t size_bytes) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error for whoever asks next
    return nullptr;
  }
  void* pointer = nullptr;
  const cudaError_t rc = cudaHostAlloc(&pointer, size_bytes, cudaHostAllocPortable);
  if (rc != cudaSuccess) {
    spdlog::warn("host arena: cudaHostAlloc of {} failed ({}); trying mlock", format_size(size_bytes),
                 cudaGetErrorString(rc));
    cudaGetLastError();
    return nullptr;
  }
  return static_cast<std::byte*>(pointer);
}
#endif

}  // namespace

Result<HostArena> HostArena::create(const HostArenaOptions& options) {
  assert(is_power_of_two(options.alignment_bytes) && options.alignment_bytes >= 64);
  if (options.capacity_bytes == 0) {
    return make_error(ErrorKind::invalid_argument, "host arena capacity must be more than 0 bytes");
  }
  const uint64_t page_bytes = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t capacity = align_up(options.capacity_bytes, options.alignment_bytes);
  const uint64_t mapped = align_up(capacity, page_bytes);

#if STRATA_HAVE_CUDA
  if (options.try_cuda) {
    if (std::byte* base = try_cuda_host_alloc(mapped)) {
      spdlog::debug("host arena: {} pinned with cudaHostAlloc", format_size(capacity));
      return HostArena(std::make_unique<Region>(base, capacity, options.alignment_bytes, PinKind::cuda_host));
    }
  }
#endif

  // Huge pages, faulted in now (common/pages.h): the store's direct reads land here, and a
  // 4 KiB-page buffer costs them a split request per 254 pages on virtio-blk.
  PageMappingOptions page_options;
  page_options.lock = options.try_mlock;
  STRATA_ASSIGN_OR_RETURN(PageMapping pages, PageMapping::map(mapped, page_options, "host arena"));
  PinKind kind = pages.locked() ? PinKind::mlock : PinKind::unpinned;
  if (kind == PinKind::unpinned) {
    std::string why_unpinned = "pinning not requested";
    if (options.try_mlock) {
      // Root with CAP_IPC_LOCK may lock past the limit, so mlock was tried whatever the limit
      // says; the limit only explains a refusal.
      rlimit limit{};
      getrlimit(RLIMIT_MEMLOCK, &limit);
      why_unpinned = std::string("mlock failed: ") + std::strerror(pages.lock_errno()) +
                     (limit.rlim_cur == RLIM_INFINITY
                          ? std::string()
                          : " (RLIMIT_MEMLOCK is " + format_size(limit.rlim_cur) +
                                "; raise it with `ulimit -l` or grant CAP_IPC_LOCK)");
    }
    spdlog::warn("host arena: {} of plain pageable memory, not pinned — {}; NVMe reads may be slower",
                 format_size(capacity), why_unpinned);
  }
  std::byte* base = pages.data();
  return HostArena(std::make_unique<Region>(base, capacity, options.alignment_bytes, kind, std::move(pages)));
}

HostArena::HostArena(std::unique_ptr<Region> region) : region_(std::move(region)) {}
HostArena::HostArena(HostArena&&) noexcept = default;
HostArena& HostArena::operator=(HostArena&&) noexcept = default;
HostArena::~HostArena() {
  if (region_ != nullptr && region_->allocator.stats().live_block_count != 0) {
    // A caller leaked blocks; the region goes away regardless, so say so rather than abort
    // (an early error return upstream is the usual cause).
    spdlog::warn("host arena destroyed with {} live blocks", region_->allocator.stats().live_block_count);
  }
}

Result<HostBlock> HostArena::allocate(uint64_t size_bytes, uint64_t alignment_bytes) {
  assert(region_ != nullptr);
  STRATA_ASSIGN_OR_RETURN(Block block, region_->allocator.allocate(size_bytes, alignment_bytes));
  return HostBlock{block.offset_bytes, block.size_bytes, region_->base + block.offset_bytes};
}

void HostArena::free(const HostBlock& block) {
  assert(region_ != nullptr);
  assert(block.data == region_->base + block.offset_bytes);
  region_->allocator.free(Block{block.offset_bytes, block.size_bytes});
}

Status HostArena::register_with(io::Engine& engine) {
  assert(region_ != nullptr);
  return engine.register_buffer(region_->base, region_->capacity_bytes);
}

std::byte* HostArena::base() const { return region_->base; }
uint64_t HostArena::capacity_bytes() const { return region_->capacity_bytes; }
uint64_t HostArena::alignment_bytes() const { return region_->alignment_bytes; }
PinKind HostArena::pin_kind() const { return region_->pin_kind; }
RangeAllocator& HostArena::allocator() const { return region_->allocator; }

bool HostArena::contains(const void* data, uint64_t size_bytes) const {
  const auto* p = static_cast<const std::byte*>(data);
  return p >= region_->base && size_bytes <= region_->capacity_bytes &&
         p - region_->base <= static_cast<std::ptrdiff_t>(region_->capacity_bytes - size_bytes);
}

HostArenaStats HostArena::stats() const {
  return HostArenaStats{region_->pin_kind, region_->allocator.stats()};
}

Result<HostBuffer> HostBuffer::allocate(HostArena& arena, uint64_t size_bytes) {
  STRATA_ASSIGN_OR_RETURN(HostBlock block, arena.allocate(size_bytes));
  return HostBuffer(&arena.allocator(), block);
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)), block_(other.block_) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    block_ = other.block_;
  }
  return *this;
}

HostBuffer::~HostBuffer() { reset(); }

void HostBuffer::reset() {
  if (allocator_ != nullptr) {
    allocator_->free(Block{block_.offset_bytes, block_.size_bytes});
    allocator_ = nullptr;
    block_ = HostBlock{};
  }
}

}  // namespace strata::memory
