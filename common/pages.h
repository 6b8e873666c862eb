// strata/common/pages.h — one anonymous memory mapping for I/O and compute buffers, in huge pages
// where the kernel gives them.
//
// Why huge pages: a direct read of 1–4 MiB into 4 KiB pages is a scatter list of 256–1024
// segments, and virtio-blk takes at most 254 per request, so the block layer splits every
// request; in 2 MiB pages the same read is one or two segments. Measured on this project's
// machine (bench/RESULTS.md, "huge pages for the store's buffers"): io-bench reads 4 MiB blocks
// at 1.5 GB/s into 4 KiB pages and 3.7–4.6 GB/s into huge pages, and the store read at the
// lower rate until its arena was mapped here. Compute on the same buffers takes fewer TLB misses
// as well.
//
// What it does: maps `size_bytes` rounded up to 2 MiB, at a 2 MiB-aligned address (transparent
// huge pages only back aligned 2 MiB ranges), asks for huge pages with MADV_HUGEPAGE (the
// kernel's default mode is often `madvise`), then faults every page in at start-up — by mlock
// when `lock` is asked and allowed, else by MADV_POPULATE_WRITE (or touching a byte per page on
// kernels without it) — so no I/O or kernel pays a page fault later. Whether huge pages were
// granted is the kernel's decision (fragmented memory, THP `never`): the mapping works either
// way, only slower; `huge_page_bytes()` says what was granted.
//
// Ownership: move-only; the destructor unlocks and unmaps. Threads: immutable after creation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace strata {

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

struct PageMappingOptions {
  bool huge_pages = true;  // MADV_HUGEPAGE and 2 MiB alignment
  bool lock = false;       // mlock (pin); a refusal is not an error: see locked() / lock_error()
};

class PageMapping {
 public:
  // `what` names the mapping in the error message ("host arena", "cpu device region").
  [[nodiscard]] static Result<PageMapping> map(uint64_t size_bytes, const PageMappingOptions& options,
                                               const std::string& what);

  PageMapping() = default;
  PageMapping(PageMapping&& other) noexcept;
  PageMapping& operator=(PageMapping&& other) noexcept;
  PageMapping(const PageMapping&) = delete;
  PageMapping& operator=(const PageMapping&) = delete;
  ~PageMapping();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }  // usable bytes from data(): ≥ the asked size
  bool locked() const { return locked_; }
  int lock_errno() const { return lock_errno_; }        // why mlock failed (0: not asked or locked)
  // Bytes of this mapping backed by huge pages now (from /proc/self/smaps; 0 where unknown).
  uint64_t huge_page_bytes() const;

 private:
  void release();

  void* mapping_ = nullptr;     // what mmap returned (for munmap)
  uint64_t mapping_bytes_ = 0;
  std::byte* data_ = nullptr;   // 2 MiB aligned inside the mapping when huge pages were asked
  uint64_t size_bytes_ = 0;
  bool locked_ = false;
  int lock_errno_ = 0;
};

}  // namespace strata
