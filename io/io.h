// strata/io/io.h — asynchronous block I/O between host buffers and NVMe files.
//
// What it owns: `DirectFile` owns one fd opened with O_DIRECT (or, where the filesystem
// refuses O_DIRECT with EINVAL, a buffered fd — with one warning, never silently).
// `Volume` owns the files of one logical byte space striped over one or more paths.
// `Engine` owns its ring / context / thread pool, its request slots and its bounce
// buffers, all allocated when it is created: nothing is allocated per I/O.
//
// Alignment: each file's direct-I/O alignment comes from the device (statx
// STATX_DIOALIGN, else the logical block size of the backing device), never a constant.
// Callers may pass any buffer, offset and length: the aligned middle of a request goes
// straight to the caller's buffer, only an unaligned head and tail go through a bounce
// buffer. Buffers from the pinned arena (`memory/`) are aligned and registered, and take
// the fast path.
//
// Buffer lifetimes: `submit` copies the request description; the buffer itself must stay
// valid and untouched until `wait` (or `wait_all`) has returned for that request.
//
// Threads: an `Engine` belongs to the one thread that submits to it (each submitting
// thread owns its ring); a `Volume` may be shared by several engines on several threads.
//
// Errors: every completion is checked. Short reads and writes are resubmitted for the
// remainder; EINTR/EAGAIN are retried. Anything else comes back from `wait` as an `Error`
// naming op, path, offset, length and errno. Reading past end of file is an error
// ("end of file") — strata never reads a file it has not sized.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::io {

enum class Op : uint8_t { read, write };
const char* op_name(Op op);

enum class Backend : uint8_t { uring, aio, psync };
const char* backend_name(Backend backend);
[[nodiscard]] Result<Backend> parse_backend(std::string_view name);
// Which backends this build and this kernel support, in order of preference.
std::vector<Backend> available_backends();

struct OpenOptions {
  bool create = false;      // create (mode 0600) when missing
  bool read_only = false;
  bool allow_buffered_fallback = true;  // O_DIRECT refused → buffered, with a warning
};

class DirectFile {
 public:
  [[nodiscard]] static Result<DirectFile> open(const std::string& path, const OpenOptions& options);
  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool is_direct() const { return direct_; }
  // Required alignment of buffer addresses, offsets and lengths for direct I/O (1 when buffered).
  uint32_t alignment_bytes() const { return alignment_bytes_; }

  [[nodiscard]] Result<uint64_t> size_bytes() const;
  // Reserves blocks with fallocate so later writes cannot hit ENOSPC; a full drive is a
  // clean `no_space` error that says how much was asked and how much is free.
  [[nodiscard]] Status preallocate(uint64_t size_bytes);
  [[nodiscard]] Status truncate(uint64_t size_bytes);
  [[nodiscard]] Status sync();  // fdatasync

 private:
  DirectFile(int fd, std::string path, bool direct, uint32_t alignment_bytes);
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
  uint32_t alignment_bytes_ = 1;
};

// One logical byte space over one or more files. Logical offset `o` lives in file
// `(o / stripe_bytes) % file_count` at `(o / (stripe_bytes * file_count)) * stripe_bytes +
// o % stripe_bytes`. With one file it is the file itself.
class Volume {
 public:
  [[nodiscard]] static Result<Volume> open(const std::vector<std::string>& paths,
                                           uint64_t stripe_bytes, const OpenOptions& options);
  Volume(Volume&&) noexcept;
  Volume& operator=(Volume&&) noexcept;
  ~Volume();

  size_t file_count() const { return files_.size(); }
  const DirectFile& file(size_t index) const { return files_[index]; }
  uint64_t stripe_bytes() const { return stripe_bytes_; }
  // The strictest alignment of its files: what a caller should align extents to.
  uint32_t alignment_bytes() const;
  bool is_direct() const;  // all files direct

  // Logical size = smallest file size × file count (rounded to whole stripes).
  [[nodiscard]] Result<uint64_t> size_bytes() const;
  // Preallocates every file so the logical space holds `size_bytes`.
  [[nodiscard]] Status preallocate(uint64_t size_bytes);
  [[nodiscard]] Status sync();
  std::string describe() const;  // "a.strata" or "a.strata+b.strata (stripe 1 MiB)"

  struct Piece {
    size_t file_index;
    uint64_t file_offset_bytes;
    uint64_t logical_offset_bytes;
    uint64_t length_bytes;
  };
  // Splits [offset, offset+length) at stripe boundaries, in logical order.
  void split(uint64_t offset_bytes, uint64_t length_bytes, std::vector<Piece>& out) const;

 private:
  Volume(std::vector<DirectFile> files, uint64_t stripe_bytes);
  std::vector<DirectFile> files_;
  uint64_t stripe_bytes_ = 0;
};

struct EngineConfig {
  Backend backend = Backend::uring;
  uint32_t queue_depth = 32;          // requests in flight in the kernel at most
  uint32_t threads = 1;               // psync: pool size; others: ignored by one engine
  uint64_t block_size_bytes = 1 << 20;  // large requests are split into pieces of this size
  bool sqpoll = false;                // uring: kernel submission thread, when permitted
  bool iopoll = false;                // uring: polled completions, when the device supports it
};

using RequestId = uint64_t;

struct EngineStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_completed = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t short_transfers_resubmitted = 0;
  uint64_t retries = 0;
  uint64_t bounce_bytes = 0;        // bytes that went through the head/tail bounce path
  uint64_t submit_calls = 0;        // syscalls (io_uring_enter / io_submit) made to submit
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual Backend backend() const = 0;
  virtual const EngineConfig& config() const = 0;

  // Registers a long-lived buffer region (the pinned arena) so I/O inside it uses fixed
  // buffers (uring). Optional; the region must outlive the engine.
  [[nodiscard]] virtual Status register_buffer(void* base, uint64_t length_bytes) = 0;

  // Queues a read or write of `length_bytes` at logical `offset_bytes` of `volume`. Blocks
  // (reaping completions) while the queue is full; never fails because the ring is full.
  // The volume and the buffer must stay valid until the request is waited for.
  [[nodiscard]] virtual Result<RequestId> submit(Op op, Volume& volume, void* buffer,
                                                 uint64_t length_bytes, uint64_t offset_bytes) = 0;
  // Blocks until that request has fully completed and returns its status; other requests
  // may still be in flight. Each id is waited for once.
  [[nodiscard]] virtual Status wait(RequestId id) = 0;
  // True once `wait(id)` would not block.
  virtual bool is_done(RequestId id) = 0;
  // Waits for every outstanding request; returns the first error.
  [[nodiscard]] virtual Status wait_all() = 0;
  virtual EngineStats stats() const = 0;
};

[[nodiscard]] Result<std::unique_ptr<Engine>> make_engine(const EngineConfig& config);

// Convenience for tools and tests: synchronous whole-range read/write through an engine.
[[nodiscard]] Status read_exact(Engine& engine, Volume& volume, void* buffer,
                                uint64_t length_bytes, uint64_t offset_bytes);
[[nodiscard]] Status write_all(Engine& engine, Volume& volume, const void* buffer,
                               uint64_t length_bytes, uint64_t offset_bytes);

}  // namespace strata::io
