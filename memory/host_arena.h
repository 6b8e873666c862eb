// strata/memory/host_arena.h — the pinned host arena: one region sized at start-up.
//
// What it owns: one host region of `capacity_bytes`, obtained once when the arena is
// created and returned when it is destroyed. How it is pinned, in order of preference:
//   1. cudaHostAlloc (CUDA builds, only when asked — `try_cuda`, which a run sets when its
//      device is CUDA — and cudaGetDeviceCount finds a GPU): page-locked and mapped for the
//      GPU's copy engines. Never by default: a cpu or emulated run in a CUDA build must not
//      initialise CUDA at all (a context costs time, host memory and, on a shared GPU, VRAM);

//   2. mmap + mlock, when RLIMIT_MEMLOCK (or CAP_IPC_LOCK) allows it: locked pages the kernel
//      never swaps or migrates, so O_DIRECT reads land in them at full rate;
//   3. mmap'd plain pages, pre-faulted, with ONE warning saying why pinning failed.
// `pin_kind()` says which one this arena got. The region is carved by a RangeAllocator
// (memory/allocator.h): any size fits, no fixed slots. Nothing is allocated per I/O.
//
// Alignment: the base is page-aligned and every block is aligned to `alignment_bytes`
// (default 4096, which covers every direct-I/O alignment strata meets), and its size is
// rounded up to it — so a block's whole rounded size may be used for aligned I/O.
//
// Ownership: `allocate` returns a plain `HostBlock` that the caller hands back with `free`
// exactly once (the registry and the scheduler keep blocks in their own tables). For scoped
// use, `HostBuffer` is a move-only RAII owner of one block. Blocks and buffers must not
// outlive their arena. The arena itself is move-only; moving it does not move the region (nor
// its allocator), so pointers into it and live HostBuffers stay valid.
//
// I/O registration: `register_with(engine)` registers the whole region with an io::Engine
// (uring fixed buffers) so reads from NVMe land in it without a bounce or a page walk.
//
// Budget: the capacity is a hard budget; an allocation that does not fit is a `no_space`
// result. Threads: allocate / free / stats may be called from any thread (the allocator locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "memory/allocator.h"

namespace strata::io {
class Engine;
}

namespace strata::memory {

enum class PinKind : uint8_t { cuda_host, mlock, unpinned };
const char* pin_kind_name(PinKind kind);

struct HostArenaOptions {
  uint64_t capacity_bytes = 0;
  uint64_t alignment_bytes = 4096;  // power of two, ≥ 64
  bool try_cuda = false;            // cudaHostAlloc (CUDA build, GPU present): runs on a CUDA device only
  bool try_mlock = true;            // else mmap + mlock where the limit allows
};

struct HostBlock {
  uint64_t offset_bytes = 0;  // from the arena base
  uint64_t size_bytes = 0;    // rounded up to the arena alignment
  std::byte* data = nullptr;
};

struct HostArenaStats {
  PinKind pin_kind = PinKind::unpinned;
  AllocatorStats allocator;  // budget (capacity), used, largest free, fragmentation
};

class HostArena {
 public:
  // Obtains and pins the region; a failure to map is an error, a failure to pin is not.
  [[nodiscard]] static Result<HostArena> create(const HostArenaOptions& options);
  HostArena(HostArena&&) noexcept;
  HostArena& operator=(HostArena&&) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  // Best-fit block of at least `size_bytes`; `alignment_bytes` 0 means the arena alignment.
  [[nodiscard]] Result<HostBlock> allocate(uint64_t size_bytes, uint64_t alignment_bytes = 0);
  void free(const HostBlock& block);  // asserts the block is live

  // Registers the whole region with `engine` (io::Engine::register_buffer).
  [[nodiscard]] Status register_with(io::Engine& engine);

  std::byte* base() const;
  uint64_t capacity_bytes() const;
  uint64_t alignment_bytes() const;
  PinKind pin_kind() const;
  bool contains(const void* data, uint64_t size_bytes) const;
  HostArenaStats stats() const;

 private:
  friend class HostBuffer;
  struct Region;
  explicit HostArena(std::unique_ptr<Region> region);
  RangeAllocator& allocator() const;
  std::unique_ptr<Region> region_;
};

// Move-only owner of one HostBlock; frees it when destroyed. The arena must outlive it.
class HostBuffer {
 public:
  HostBuffer() = default;
  [[nodiscard]] static Result<HostBuffer> allocate(HostArena& arena, uint64_t size_bytes);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() const { return block_.data; }
  uint64_t size_bytes() const { return block_.size_bytes; }
  const HostBlock& block() const { return block_; }
  explicit operator bool() const { return allocator_ != nullptr; }
  void reset();

 private:
  HostBuffer(RangeAllocator* allocator, HostBlock block) : allocator_(allocator), block_(block) {}
  RangeAllocator* allocator_ = nullptr;  // the arena's, which does not move with the arena
  HostBlock block_;
};

}  // namespace strata::memory
