// strata/io/file.cpp — DirectFile (O_DIRECT with device-derived alignment, buffered
// fallback), Volume (striping), names of ops and backends, and the synchronous helpers.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "io/io.h"

namespace strata::io {

const char* op_name(Op op) { return op == Op::read ? "read" : "write"; }

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::uring: return "uring";
    case Backend::aio: return "aio";
    case Backend::psync: return "psync";
  }
  return "unknown";
}

Result<Backend> parse_backend(std::string_view name) {
  if (name == "uring") return Backend::uring;
  if (name == "aio") return Backend::aio;
  if (name == "psync") return Backend::psync;
  return make_error(ErrorKind::invalid_argument,
                    fmt::format("unknown I/O engine '{}'; accepted: uring, aio, psync", name));
}

namespace {

// Never reused, so engines can key registered-file tables by it (see DirectFile::id).
std::atomic<uint64_t> next_file_id{1};

int open_retrying(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0600);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The logical block size of the block device behind `dev`, from sysfs (opening the device
// node for BLKSSZGET would need privileges strata should not ask for). 0 when unknown.
uint32_t sysfs_logical_block_size(dev_t dev) {
  if (major(dev) == 0) return 0;  // tmpfs, overlay and other device-less filesystems
  const std::string base = fmt::format("/sys/dev/block/{}:{}", major(dev), minor(dev));
  for (const char* leaf : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream in(base + leaf);
    uint32_t value = 0;
    if (in >> value && is_power_of_two(value)) return value;
  }
  return 0;
}

struct DirectAlignment {
  bool supported = true;
  uint32_t alignment_bytes = 0;
};

// Direct-I/O alignment of an open file: statx STATX_DIOALIGN where the kernel and the
// filesystem report it, else the device's logical block size, else the page size (safe on
// every device strata is likely to meet).
DirectAlignment direct_alignment(int fd) {
  DirectAlignment out;
  struct statx info {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 &&
      (info.stx_mask & STATX_DIOALIGN) != 0) {
    if (info.stx_dio_offset_align == 0) {  // the filesystem says: no direct I/O for this file
      out.supported = false;
      return out;
    }
    out.alignment_bytes = std::max(info.stx_dio_mem_align, info.stx_dio_offset_align);
    if (is_power_of_two(out.alignment_bytes)) return out;
  }
  struct stat st {};
  if (fstat(fd, &st) == 0) out.alignment_bytes = sysfs_logical_block_size(st.st_dev);
  if (out.alignment_bytes == 0) out.alignment_bytes = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  return out;
}

}  // namespace

DirectFile::DirectFile(int fd, std::string path, bool direct, uint32_t alignment_bytes)
    : fd_(fd), id_(next_file_id.fetch_add(1)), path_(std::move(path)), direct_(direct),
      alignment_bytes_(alignment_bytes) {}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), id_(other.id_), path_(std::move(other.path_)),
      direct_(other.direct_), alignment_bytes_(other.alignment_bytes_) {}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    id_ = other.id_;
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    alignment_bytes_ = other.alignment_bytes_;
  }
  return *this;
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<DirectFile> DirectFile::open(const std::string& path, const OpenOptions& options) {
  const int flags =
      (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (options.create ? O_CREAT : 0);
  int fd = options.simulate_direct_refusal ? (errno = EINVAL, -1) : open_retrying(path, flags | O_DIRECT);
  bool direct = true;
  uint32_t alignment_bytes = 1;
  std::string why_buffered;
  if (fd < 0 && errno == EINVAL) {
    why_buffered = "the filesystem refuses O_DIRECT (EINVAL)";
  } else if (fd < 0) {
    return make_errno_error(errno, "open", path);
  } else {
    DirectAlignment alignment = direct_alignment(fd);
    if (!alignment.supported) {
      ::close(fd);
      fd = -1;
      why_buffered = "the filesystem reports no direct-I/O support for it (statx)";
    } else {
      alignment_bytes = alignment.alignment_bytes;
    }
  }
  if (fd < 0) {
    if (!options.allow_buffered_fallback) {
      Error error = make_errno_error(EINVAL, "open", path);
      error.kind = ErrorKind::unsupported;
      error.message = why_buffered;
      return error;
    }
    fd = open_retrying(path, flags);
    if (fd < 0) return make_errno_error(errno, "open", path);
    direct = false;
    spdlog::warn("{}: {}; using buffered I/O for this file (slower, goes through the page cache)",
                 path, why_buffered);
  }
  return DirectFile(fd, path, direct, alignment_bytes);
}

Result<uint64_t> DirectFile::size_bytes() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return make_errno_error(errno, "stat", path_);
  return static_cast<uint64_t>(st.st_size);
}

Status DirectFile::preallocate(uint64_t size_bytes) {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return make_errno_error(errno, "stat", path_);
  const uint64_t size_before = static_cast<uint64_t>(st.st_size);
  const uint64_t allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  auto no_space = [&](int errno_value) {
    struct statvfs fs {};
    uint64_t free_bytes = 0;
    if (fstatvfs(fd_, &fs) == 0) free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    Error error = make_errno_error(errno_value, "preallocate", path_, 0, size_bytes);
    error.message = fmt::format("asked for {} ({} bytes), {} ({} bytes) free on that filesystem",
                                format_size(size_bytes), size_bytes, format_size(free_bytes),
                                free_bytes);
    return error;
  };
  // Refuse up front when the filesystem plainly lacks the room: a failing fallocate first
  // fills the whole drive, which hurts everything else running on it.
  struct statvfs fs {};
  if (fstatvfs(fd_, &fs) == 0 && size_bytes > allocated_bytes &&
      size_bytes - allocated_bytes > static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize)
    return no_space(ENOSPC);
  int rc;
  do {
    rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size_bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status();
  const int error_number = errno;
  if (error_number == ENOSPC || error_number == EDQUOT) {
    // ext4 keeps what it managed to allocate (and the larger size): give it back.
    if (::ftruncate(fd_, static_cast<off_t>(size_before)) != 0)
      spdlog::warn("{}: could not shrink back to {} bytes after a failed preallocate", path_,
                   size_before);
    return no_space(error_number);
  }
  if (error_number == EOPNOTSUPP) {
    // No fallocate here (some network and FUSE filesystems): size the file instead, so reads
    // work; a full drive then shows up as ENOSPC on a later write, which the engine reports.
    spdlog::warn("{}: fallocate is not supported; sizing the file without reserving blocks",
                 path_);
    if (size_before >= size_bytes) return Status();
    return truncate(size_bytes);
  }
  return make_errno_error(error_number, "preallocate", path_, 0, size_bytes);
}

Status DirectFile::truncate(uint64_t size_bytes) {
  int rc;
  do {
    rc = ::ftruncate(fd_, static_cast<off_t>(size_bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return make_errno_error(errno, "truncate", path_, 0, size_bytes);
  return Status();
}

Status DirectFile::sync() {
  int rc;
  do {
    rc = ::fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return make_errno_error(errno, "fsync", path_);
  return Status();
}

// --- Volume ------------------------------------------------------------------------------

Volume::Volume(std::vector<DirectFile> files, uint64_t stripe_bytes)
    : files_(std::move(files)), stripe_bytes_(stripe_bytes) {}
Volume::Volume(Volume&&) noexcept = default;
Volume& Volume::operator=(Volume&&) noexcept = default;
Volume::~Volume() = default;

Result<Volume> Volume::open(const std::vector<std::string>& paths, uint64_t stripe_bytes,
                            const OpenOptions& options) {
  if (paths.empty()) return make_error(ErrorKind::invalid_argument, "a volume needs at least one path");
  std::set<std::string> seen;
  for (const std::string& path : paths) {
    if (!seen.insert(path).second)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("path {} is given twice for one striped volume", path));
  }
  if (paths.size() > 1 && stripe_bytes == 0)
    return make_error(ErrorKind::invalid_argument,
                      "a volume striped over several paths needs a stripe size above 0");
  std::vector<DirectFile> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) {
    Result<DirectFile> file = DirectFile::open(path, options);
    if (!file.ok()) return file.error();
    if (paths.size() > 1 && stripe_bytes % file->alignment_bytes() != 0)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("stripe size {} is not a multiple of the direct-I/O alignment "
                                    "({} bytes) of {}",
                                    stripe_bytes, file->alignment_bytes(), path));
    files.push_back(std::move(file).value());
  }
  return Volume(std::move(files), paths.size() > 1 ? stripe_bytes : 0);
}

uint32_t Volume::alignment_bytes() const {
  uint32_t alignment = 1;
  for (const DirectFile& file : files_) alignment = std::max(alignment, file.alignment_bytes());
  return alignment;
}

bool Volume::is_direct() const {
  return std::all_of(files_.begin(), files_.end(), [](const DirectFile& f) { return f.is_direct(); });
}

Result<uint64_t> Volume::size_bytes() const {
  if (files_.size() == 1) return files_[0].size_bytes();
  uint64_t smallest = UINT64_MAX;
  for (const DirectFile& file : files_) {
    Result<uint64_t> size = file.size_bytes();
    if (!size.ok()) return size.error();
    smallest = std::min(smallest, *size);
  }
  return align_down(smallest, stripe_bytes_) * files_.size();
}

Status Volume::preallocate(uint64_t size_bytes) {
  if (files_.size() == 1) return files_[0].preallocate(size_bytes);
  const uint64_t row_bytes = stripe_bytes_ * files_.size();
  const uint64_t rows = (size_bytes + row_bytes - 1) / row_bytes;
  for (DirectFile& file : files_) STRATA_RETURN_IF_ERROR(file.preallocate(rows * stripe_bytes_));
  return Status();
}

Status Volume::sync() {
  for (DirectFile& file : files_) STRATA_RETURN_IF_ERROR(file.sync());
  return Status();
}

std::string Volume::describe() const {
  std::string out;
  for (const DirectFile& file : files_) out += (out.empty() ? "" : "+") + file.path();
  if (files_.size() > 1) out += fmt::format(" (stripe {})", format_size(stripe_bytes_));
  return out;
}

Volume::Piece Volume::piece_at(uint64_t offset_bytes, uint64_t length_bytes) const {
  if (files_.size() == 1) return Piece{0, offset_bytes, offset_bytes, length_bytes};
  const uint64_t stripe_index = offset_bytes / stripe_bytes_;
  const uint64_t within_bytes = offset_bytes % stripe_bytes_;
  Piece piece;
  piece.file_index = stripe_index % files_.size();
  piece.file_offset_bytes = (stripe_index / files_.size()) * stripe_bytes_ + within_bytes;
  piece.logical_offset_bytes = offset_bytes;
  piece.length_bytes = std::min(length_bytes, stripe_bytes_ - within_bytes);
  return piece;
}

void Volume::split(uint64_t offset_bytes, uint64_t length_bytes, std::vector<Piece>& out) const {
  while (length_bytes > 0) {
    Piece piece = piece_at(offset_bytes, length_bytes);
    out.push_back(piece);
    offset_bytes += piece.length_bytes;
    length_bytes -= piece.length_bytes;
  }
}

// --- synchronous helpers -------------------------------------------------------------------

Status read_exact(Engine& engine, Volume& volume, void* buffer, uint64_t length_bytes,
                  uint64_t offset_bytes) {
  Result<RequestId> id = engine.submit(Op::read, volume, buffer, length_bytes, offset_bytes);
  if (!id.ok()) return id.error();
  return engine.wait(*id);
}

Status write_all(Engine& engine, Volume& volume, const void* buffer, uint64_t length_bytes,
                 uint64_t offset_bytes) {
  // The engine never writes into a write request's buffer; the cast only meets the shared
  // submit signature.
  Result<RequestId> id =
      engine.submit(Op::write, volume, const_cast<void*>(buffer), length_bytes, offset_bytes);
  if (!id.ok()) return id.error();
  return engine.wait(*id);
}

}  // namespace strata::io
