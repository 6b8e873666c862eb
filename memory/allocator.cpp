// strata/memory/allocator.cpp — best-fit range allocator with coalescing free lists.
#include "memory/allocator.h"

#include <cassert>
#include <string>

#include "common/size.h"

namespace strata::memory {

RangeAllocator::RangeAllocator(uint64_t capacity_bytes, uint64_t granule_bytes)
    : capacity_bytes_(align_down(capacity_bytes, granule_bytes)), granule_bytes_(granule_bytes) {
  assert(is_power_of_two(granule_bytes));
  // A capacity that is not a whole number of granules loses its tail: a block there could
  // not be granule-sized.
  if (capacity_bytes_ > 0) insert_free_locked(0, capacity_bytes_);
}

void RangeAllocator::insert_free_locked(uint64_t offset_bytes, uint64_t size_bytes) {
  free_by_offset_.emplace(offset_bytes, size_bytes);
  free_by_size_.emplace(size_bytes, offset_bytes);
}

void RangeAllocator::erase_free_locked(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

Result<Block> RangeAllocator::allocate(uint64_t size_bytes, uint64_t alignment_bytes) {
  assert(size_bytes > 0);
  if (alignment_bytes < granule_bytes_) alignment_bytes = granule_bytes_;
  assert(is_power_of_two(alignment_bytes));
  const uint64_t rounded_bytes = align_up(size_bytes, granule_bytes_);

  std::lock_guard lock(mutex_);
  // Smallest free block of at least the rounded size; with a stricter alignment the aligned
  // start may not leave room, so walk up the size order until one fits. With the granule as
  // alignment the first candidate always fits.
  for (auto it = free_by_size_.lower_bound({rounded_bytes, 0}); it != free_by_size_.end(); ++it) {
    const auto [free_size, free_offset] = *it;
    const uint64_t start = align_up(free_offset, alignment_bytes);
    const uint64_t head_bytes = start - free_offset;
    if (head_bytes + rounded_bytes > free_size) continue;
    const uint64_t tail_bytes = free_size - head_bytes - rounded_bytes;
    erase_free_locked(free_by_offset_.find(free_offset));
    if (head_bytes > 0) insert_free_locked(free_offset, head_bytes);
    if (tail_bytes > 0) insert_free_locked(start + rounded_bytes, tail_bytes);
    live_.emplace(start, rounded_bytes);
    used_bytes_ += rounded_bytes;
    if (used_bytes_ > peak_used_bytes_) peak_used_bytes_ = used_bytes_;
    return Block{start, rounded_bytes};
  }
  ++failed_allocations_;
  const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  return make_error(ErrorKind::no_space,
                    "allocation of " + format_size(size_bytes) + " does not fit: " +
                        format_size(capacity_bytes_ - used_bytes_) + " of " +
                        format_size(capacity_bytes_) + " free, largest free block " +
                        format_size(largest));
}

void RangeAllocator::free(const Block& block) {
  std::lock_guard lock(mutex_);
  auto live = live_.find(block.offset_bytes);
  assert(live != live_.end() && "free of a block this allocator did not hand out (or freed twice)");
  assert(live->second == block.size_bytes && "free with a size other than the block's");
  if (live == live_.end()) return;  // release builds: refuse to corrupt the free lists
  uint64_t offset = live->first;
  uint64_t size = live->second;
  live_.erase(live);
  used_bytes_ -= size;

  // Coalesce with the free neighbour on each side, so freed space forms the largest blocks
  // it can and fragmentation only reflects live blocks in between.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    size += next->second;
    erase_free_locked(next);
  }
  auto after = free_by_offset_.lower_bound(offset);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    assert(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      erase_free_locked(prev);
    }
  }
  insert_free_locked(offset, size);
}

Result<Block> RangeAllocator::reserve(uint64_t offset_bytes, uint64_t size_bytes) {
  assert(size_bytes > 0);
  const uint64_t rounded_bytes = align_up(size_bytes, granule_bytes_);
  std::lock_guard lock(mutex_);
  if (offset_bytes % granule_bytes_ != 0 || offset_bytes + rounded_bytes > capacity_bytes_ ||
      offset_bytes + rounded_bytes < offset_bytes) {
    return make_error(ErrorKind::invalid_argument,
                      "reserve of " + std::to_string(size_bytes) + " bytes at offset " +
                          std::to_string(offset_bytes) + " is misaligned or past the capacity of " +
                          std::to_string(capacity_bytes_));
  }
  // The free block containing the range's start must also contain its end.
  auto it = free_by_offset_.upper_bound(offset_bytes);
  if (it == free_by_offset_.begin()) {
    return make_error(ErrorKind::invalid_argument,
                      "reserve at offset " + std::to_string(offset_bytes) + " overlaps a live block");
  }
  --it;
  const uint64_t free_offset = it->first;
  const uint64_t free_size = it->second;
  if (offset_bytes + rounded_bytes > free_offset + free_size) {
    return make_error(ErrorKind::invalid_argument,
                      "reserve of " + std::to_string(rounded_bytes) + " bytes at offset " +
                          std::to_string(offset_bytes) + " overlaps a live block");
  }
  erase_free_locked(it);
  if (offset_bytes > free_offset) insert_free_locked(free_offset, offset_bytes - free_offset);
  const uint64_t end = offset_bytes + rounded_bytes;
  if (free_offset + free_size > end) insert_free_locked(end, free_offset + free_size - end);
  live_.emplace(offset_bytes, rounded_bytes);
  used_bytes_ += rounded_bytes;
  if (used_bytes_ > peak_used_bytes_) peak_used_bytes_ = used_bytes_;
  return Block{offset_bytes, rounded_bytes};
}

AllocatorStats RangeAllocator::stats() const {
  std::lock_guard lock(mutex_);
  AllocatorStats stats;
  stats.capacity_bytes = capacity_bytes_;
  stats.used_bytes = used_bytes_;
  stats.free_bytes = capacity_bytes_ - used_bytes_;
  stats.largest_free_bytes = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  stats.free_block_count = free_by_offset_.size();
  stats.live_block_count = live_.size();
  stats.peak_used_bytes = peak_used_bytes_;
  stats.failed_allocations = failed_allocations_;
  stats.fragmentation =
      stats.free_bytes == 0
          ? 0.0
          : 1.0 - static_cast<double>(stats.largest_free_bytes) / static_cast<double>(stats.free_bytes);
  return stats;
}

std::map<uint64_t, uint64_t> RangeAllocator::free_blocks() const {
  std::lock_guard lock(mutex_);
  return free_by_offset_;
}

}  // namespace strata::memory
