// strata/memory/allocator.h — a range allocator over [0, capacity): offsets, not pointers.
//
// What it is for: every budgeted byte space in strata is carved by this one allocator — the
// pinned host arena, the device arena (a cudaMalloc'd region or the CPU device's capped
// region) and the NVMe store's logical byte space. It hands out offsets; the owner of the
// region adds its base pointer (or uses the offset as a file offset).
//
// How: best fit over free lists kept in two ordered indexes — by offset (to coalesce a freed
// block with its neighbours in O(log n)) and by (size, offset) (to find the smallest block
// that fits in O(log n)). There are no fixed slots: any size up to the largest free block
// fits. Every size is rounded up to the allocator's granule (its minimum alignment), so all
// offsets are granule-aligned; a larger per-call alignment is honoured by splitting the
// unaligned head off as a free block of its own.
//
// Budget: the capacity is a hard budget. An allocation that does not fit returns a
// `no_space` error (with what was asked, what is free and the largest free block) — it never
// over-allocates and never blocks; the caller decides to wait, evict or fail.
//
// Ownership: a `Block` is a plain value the caller must hand back with `free` exactly once.
// Freeing a block the allocator did not hand out (or twice) is a programmer error and
// asserts. `reserve` marks a given range as used (the store rebuilds its free space from the
// manifest on open) and is freed with `free` like any block.
//
// Threads: every method takes an internal mutex, so one allocator may be shared by several
// threads (e.g. the scheduler allocating while an I/O completion thread frees).
// Memory: the indexes are node-based containers: one small node per free block and per live
// block. That is per tensor, never per I/O.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "common/status.h"

namespace strata::memory {

struct Block {
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;  // as reserved: the request rounded up to the granule
};

struct AllocatorStats {
  uint64_t capacity_bytes = 0;        // the budget
  uint64_t used_bytes = 0;            // sum of live blocks (rounded sizes)
  uint64_t free_bytes = 0;            // capacity − used
  uint64_t largest_free_bytes = 0;    // the biggest single allocation that would succeed (granule-aligned)
  uint64_t free_block_count = 0;
  uint64_t live_block_count = 0;
  uint64_t peak_used_bytes = 0;
  uint64_t failed_allocations = 0;    // no_space results returned so far
  // 1 − largest_free / free: 0 when all free space is one block (or none is free), close to 1
  // when free space is shattered into many small holes.
  double fragmentation = 0.0;
};

class RangeAllocator {
 public:
  // `granule_bytes` (a power of two) is the minimum alignment and size rounding of every block.
  RangeAllocator(uint64_t capacity_bytes, uint64_t granule_bytes);
  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;

  // Best-fit allocation of `size_bytes` (> 0) at an offset that is a multiple of
  // `alignment_bytes` (a power of two; 0 means the granule). `no_space` when nothing fits.
  [[nodiscard]] Result<Block> allocate(uint64_t size_bytes, uint64_t alignment_bytes = 0);
  // Returns a block handed out by `allocate` or `reserve`. Asserts it is live.
  void free(const Block& block);
  // Marks exactly [offset, offset + size rounded to the granule) as used; `invalid_argument`
  // if the offset is not granule-aligned, the range runs past the capacity or overlaps a
  // live block.
  [[nodiscard]] Result<Block> reserve(uint64_t offset_bytes, uint64_t size_bytes);

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t granule_bytes() const { return granule_bytes_; }
  AllocatorStats stats() const;
  // Free blocks in offset order, for tests and `store inspect`.
  std::map<uint64_t, uint64_t> free_blocks() const;

 private:
  void insert_free_locked(uint64_t offset_bytes, uint64_t size_bytes);
  void erase_free_locked(std::map<uint64_t, uint64_t>::iterator it);

  const uint64_t capacity_bytes_;
  const uint64_t granule_bytes_;
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> free_by_offset_;                 // offset → size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;        // (size, offset)
  std::unordered_map<uint64_t, uint64_t> live_;                 // offset → size
  uint64_t used_bytes_ = 0;
  uint64_t peak_used_bytes_ = 0;
  uint64_t failed_allocations_ = 0;
};

}  // namespace strata::memory
