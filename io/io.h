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
// Concurrent requests must not write the same alignment block unless they are aligned:
// an unaligned write head/tail is a read-modify-write of its block.
//
// Sizes: a direct file grows in whole alignment blocks — an unaligned write that ends past
// end of file writes (zero-padded) up to the next block boundary. Callers that care about
// the exact size call `truncate` after writing.
//
// Progress: `submit` starts the I/O (one submit syscall) and returns at once; completions
// are reaped whenever the caller calls `submit`, `is_done`, `wait` or `wait_all`. Backend
// authors: see io/backend.h. Fault injection for tests: io/fault_engine.h. The `io:`
// configuration section: io/io_config.h.
//
// Errors: every completion is checked. Short reads and writes are resubmitted for the
// remainder; EINTR/EAGAIN are retried. Anything else comes back from `wait` as an `Error`
// naming op, path, offset, length and errno. Reading past end of file is an error
// ("end of file") — strata never reads a file it has not sized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // Tests only: act as if open(O_DIRECT) failed with EINVAL, for kernels where no mounted
  // filesystem refuses O_DIRECT any more (tmpfs accepts it since Linux 6.6).
  bool simulate_direct_refusal = false;
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
  // Required alignment of buffer addresses, offsets and lengths for direct I/O (1 when
  // buffered): the larger of the device's memory and offset alignment, a power of two.
  uint32_t alignment_bytes() const { return alignment_bytes_; }
  // Unique per open in this process (never reused, kept across moves): engines key their
  // registered-file tables by it, so a reused fd number cannot alias an old file.
  uint64_t id() const { return id_; }

  [[nodiscard]] Result<uint64_t> size_bytes() const;
  // Reserves blocks with fallocate so later writes cannot hit ENOSPC; a full drive is a
  // clean `no_space` error that says how much was asked and how much is free.
  [[nodiscard]] Status preallocate(uint64_t size_bytes);
  [[nodiscard]] Status truncate(uint64_t size_bytes);
  [[nodiscard]] Status sync();  // fdatasync

 private:
  DirectFile(int fd, std::string path, bool direct, uint32_t alignment_bytes);
  int fd_ = -1;
  uint64_t id_ = 0;
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
  // The first piece of that split, without allocating (the engine's per-piece path).
  Piece piece_at(uint64_t offset_bytes, uint64_t length_bytes) const;

 private:
  Volume(std::vector<DirectFile> files, uint64_t stripe_bytes);
  std::vector<DirectFile> files_;
  uint64_t stripe_bytes_ = 0;
};

struct EngineConfig {
  Backend backend = Backend::uring;
  uint32_t queue_depth = 32;          // pieces in flight in the kernel at most (1..1024;
                                      // psync: 1..256, one pool thread per slot)
  uint32_t threads = 1;               // how many engines a tool runs side by side (io-bench,
                                      // tune, the io: section); one engine ignores it
  uint64_t block_size_bytes = 1 << 20;  // large requests are split into pieces of this size
  uint32_t max_requests = 256;        // request slots: submitted and not yet waited for
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
  uint64_t fixed_buffer_ops = 0;    // uring: pieces that went as READ_FIXED / WRITE_FIXED
  uint64_t pieces_submitted = 0;    // backend operations (after splitting and resubmits)
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
  // Like submit, but without entering the kernel: the request starts at the next `flush`
  // (or submit / wait / wait_any / is_done). Lets a caller hand several requests to the
  // device in one system call — which on virtio also means one doorbell.
  [[nodiscard]] virtual Result<RequestId> queue(Op op, Volume& volume, void* buffer,
                                                uint64_t length_bytes, uint64_t offset_bytes) = 0;
  [[nodiscard]] virtual Status flush() = 0;
  // Blocks until that request has fully completed and returns its status; other requests
  // may still be in flight. Each id is waited for once.
  [[nodiscard]] virtual Status wait(RequestId id) = 0;
  // True once `wait(id)` would not block.
  virtual bool is_done(RequestId id) = 0;
  // Blocks until any submitted request not yet waited for has finished (oldest finished
  // first) and consumes it as `wait` would: its id and its status. An error of the Result
  // itself means the engine broke (or nothing was outstanding, a programmer error).
  struct Finished {
    RequestId id = 0;
    Status status;
  };
  [[nodiscard]] virtual Result<Finished> wait_any() = 0;
  // A request that has already finished, if any, without blocking or entering the kernel
  // (what the last wait/wait_any/is_done reaped). Consumes it like wait_any.
  virtual std::optional<Finished> take_finished() = 0;
  // Waits for every outstanding request; returns the first error.
  [[nodiscard]] virtual Status wait_all() = 0;
  virtual EngineStats stats() const = 0;
  // One line for logs and tool output: backend, queue depth, what the kernel granted
  // (SQPOLL, IOPOLL, fixed files), registered buffer regions.
  virtual std::string describe() const = 0;
};

[[nodiscard]] Result<std::unique_ptr<Engine>> make_engine(const EngineConfig& config);

// Convenience for tools and tests: synchronous whole-range read/write through an engine.
[[nodiscard]] Status read_exact(Engine& engine, Volume& volume, void* buffer,
                                uint64_t length_bytes, uint64_t offset_bytes);
[[nodiscard]] Status write_all(Engine& engine, Volume& volume, const void* buffer,
                               uint64_t length_bytes, uint64_t offset_bytes);

}  // namespace strata::io
