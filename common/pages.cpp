// strata/common/pages.cpp — anonymous mappings in huge pages, faulted in at start-up.
#include "common/pages.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/size.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and we touch the pages
#endif

namespace strata {

Result<PageMapping> PageMapping::map(uint64_t size_bytes, const PageMappingOptions& options,
                                     const std::string& what) {
  const uint64_t page_bytes = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t unit = options.huge_pages ? kHugePageBytes : page_bytes;
  const uint64_t usable = align_up(std::max<uint64_t>(size_bytes, 1), unit);
  // One extra huge page of address space (not of memory: the slack is unmapped below) so an
  // aligned start always fits.
  const uint64_t reserve = options.huge_pages ? usable + kHugePageBytes : usable;
  void* mapping = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) {
    Error error = make_errno_error(errno, "mmap", what, 0, usable);
    error.kind = ErrorKind::no_space;
    error.message = fmt::format("cannot map the {} of {}: {}", what, format_size(usable), std::strerror(errno));
    return error;
  }
  auto* start = static_cast<std::byte*>(mapping);
  auto* aligned = reinterpret_cast<std::byte*>(align_up(reinterpret_cast<uintptr_t>(start), unit));
  if (options.huge_pages) {
    // Give back the address space before and after the aligned range.
    const uint64_t head = static_cast<uint64_t>(aligned - start);
    if (head > 0) munmap(start, head);
    const uint64_t tail = reserve - head - usable;
    if (tail > 0) munmap(aligned + usable, tail);
    (void)madvise(aligned, usable, MADV_HUGEPAGE);  // advice: refused advice only costs speed
  }

  PageMapping result;
  result.mapping_ = aligned;
  result.mapping_bytes_ = usable;
  result.data_ = aligned;
  result.size_bytes_ = usable;
  if (options.lock) {
    if (mlock(aligned, usable) == 0) {
      result.locked_ = true;  // mlock faulted every page in
      return result;
    }
    result.lock_errno_ = errno;
  }
  if (madvise(aligned, usable, MADV_POPULATE_WRITE) != 0) {
    for (uint64_t offset = 0; offset < usable; offset += page_bytes) aligned[offset] = std::byte{0};
  }
  return result;
}

PageMapping::PageMapping(PageMapping&& other) noexcept { *this = std::move(other); }

PageMapping& PageMapping::operator=(PageMapping&& other) noexcept {
  if (this != &other) {
    release();
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    locked_ = std::exchange(other.locked_, false);
    lock_errno_ = std::exchange(other.lock_errno_, 0);
  }
  return *this;
}

PageMapping::~PageMapping() { release(); }

void PageMapping::release() {
  if (mapping_ == nullptr) return;
  if (locked_) munlock(mapping_, mapping_bytes_);
  munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
}

uint64_t PageMapping::huge_page_bytes() const {
  if (data_ == nullptr) return 0;
  std::ifstream smaps("/proc/self/smaps");
  const auto begin = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t end = begin + size_bytes_;
  uint64_t total_kib = 0;
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    uintptr_t low = 0, high = 0;
    // A mapping's header line: "lo-hi perms ...". Any other line is a field of the current one.
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &low, &high) == 2 && line.find(' ') > line.find('-')) {
      inside = low < end && high > begin;
      continue;
    }
    uint64_t kib = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %" SCNu64 " kB", &kib) == 1) total_kib += kib;
  }
  return total_kib * 1024;
}

}  // namespace strata
