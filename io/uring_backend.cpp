// strata/io/uring_backend.cpp — the io_uring backend (liburing): one ring per engine,
// registered (fixed) files and buffers, one io_uring_enter per tick that both submits and
// waits, completions reaped in batches. SQPOLL and IOPOLL on request, where the kernel
// grants them.
#include "io/backend.h"
#include "strata_build_config.h"

#if STRATA_HAVE_URING
#include <liburing.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#endif

namespace strata::io {

#if STRATA_HAVE_URING
namespace {

// Registered-file slots per ring. Volumes have a handful of files; a table this size lets an
// engine serve several volumes without re-registering on every request.
constexpr uint32_t kFileSlots = 64;
// Registered buffer regions per ring (the pinned arena is one or a few regions).
constexpr uint32_t kBufferRegions = 64;  // 1 GiB windows: 32 GiB of registered memory

uint32_t next_power_of_two(uint32_t value) {
  uint32_t out = 1;
  while (out < value) out <<= 1;
  return out;
}

class UringBackend final : public BackendQueue {
 public:
  static Result<std::unique_ptr<BackendQueue>> create(const EngineConfig& config) {
    std::unique_ptr<UringBackend> backend(new UringBackend(config.queue_depth));
    STRATA_RETURN_IF_ERROR(backend->init(config));
    return std::unique_ptr<BackendQueue>(std::move(backend));
  }

  ~UringBackend() override {
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  Backend kind() const override { return Backend::uring; }
  uint32_t capacity() const override { return capacity_; }

  // The kernel takes at most 1 GiB per registered buffer. A longer region is registered as
  // windows of 1 GiB that start every 512 MiB, overlapping by half, so that any transfer of
  // up to 512 MiB lies wholly inside one window and still goes through the fixed path.
  static constexpr uint64_t kMaxRegisteredBytes = uint64_t{1} << 30;
  static constexpr uint64_t kWindowStrideBytes = kMaxRegisteredBytes / 2;

  Status register_buffer(void* base, uint64_t length_bytes) override {
    std::vector<iovec> windows;
    for (uint64_t offset = 0;; offset += kWindowStrideBytes) {
      const uint64_t window_bytes = std::min(kMaxRegisteredBytes, length_bytes - offset);
      windows.push_back(iovec{static_cast<char*>(base) + offset, static_cast<size_t>(window_bytes)});
      if (offset + window_bytes >= length_bytes) break;
    }
    if (region_count_ + windows.size() > kBufferRegions)
      return make_error(ErrorKind::unsupported,
                        fmt::format("io_uring: at most {} registered buffer windows of 1 GiB", kBufferRegions));
    if (region_count_ > 0) io_uring_unregister_buffers(&ring_);
    std::copy(windows.begin(), windows.end(), regions_.begin() + region_count_);
    const uint32_t total = region_count_ + static_cast<uint32_t>(windows.size());
    int rc = io_uring_register_buffers(&ring_, regions_.data(), total);
    if (rc < 0) {
      // Put the earlier regions back; the new one simply stays unregistered.
      if (region_count_ > 0) (void)io_uring_register_buffers(&ring_, regions_.data(), region_count_);
      Error error = make_errno_error(-rc, "register buffer", "", 0, length_bytes);
      error.kind = ErrorKind::unsupported;
      error.message = "io_uring refused to register the buffer (memlock limit?); I/O into it "
                      "still works, without fixed buffers";
      return error;
    }
    region_count_ = total;
    return Status();
  }

  Status prepare(const BackendPiece& piece) override {
    STRATA_RETURN_IF_ERROR(enable_on_owner_thread());
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      // The SQ is full (resubmits on top of a full batch): submit to make room, never fail.
      int rc = io_uring_submit(&ring_);
      ++submit_calls_;
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
        return make_errno_error(-rc, "io_uring submit", piece.file->path());
      sqe = io_uring_get_sqe(&ring_);
    }
    int fd = piece.file->fd();
    const int file_slot = fixed_file_slot(*piece.file);
    if (file_slot >= 0) fd = file_slot;
    const int buffer_index = fixed_buffer_index(piece.buffer, piece.length_bytes);
    if (piece.op == Op::read) {
      if (buffer_index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, piece.buffer, piece.length_bytes,
                                 piece.file_offset_bytes, buffer_index);
      } else {
        io_uring_prep_read(sqe, fd, piece.buffer, piece.length_bytes, piece.file_offset_bytes);
      }
    } else {
      if (buffer_index >= 0) {
        io_uring_prep_write_fixed(sqe, fd, piece.buffer, piece.length_bytes,
                                  piece.file_offset_bytes, buffer_index);
      } else {
        io_uring_prep_write(sqe, fd, piece.buffer, piece.length_bytes, piece.file_offset_bytes);
      }
    }
    if (buffer_index >= 0) ++fixed_buffer_ops_;
    if (file_slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, piece.tag);
    ++in_flight_;
    return Status();
  }

  Result<uint32_t> submit_and_reap(BackendCompletion* completions, uint32_t max_completions,
                                   uint32_t min_completions) override {
    STRATA_RETURN_IF_ERROR(enable_on_owner_thread());
    while (true) {
      const bool have_sqes = io_uring_sq_ready(&ring_) > 0;
      const bool must_wait = io_uring_cq_ready(&ring_) < min_completions;
      // With DEFER_TASKRUN the kernel posts completions only when we enter it asking for
      // events; without, they appear in the CQ by themselves and a peek is enough.
      const bool poll_events = deferred_taskrun_ && max_completions > 0 && in_flight_ > 0 &&
                               io_uring_cq_ready(&ring_) == 0;
      int rc = 0;
      if (have_sqes) {
        // One io_uring_enter submits the batch and, when needed, waits in the same call.
        if (must_wait) {
          rc = io_uring_submit_and_wait(&ring_, min_completions);
        } else if (poll_events) {
          rc = io_uring_submit_and_get_events(&ring_);
        } else {
          rc = io_uring_submit(&ring_);
        }
        ++submit_calls_;
      } else if (must_wait) {
        io_uring_cqe* cqe = nullptr;
        rc = io_uring_wait_cqe_nr(&ring_, &cqe, min_completions);
      } else if (poll_events) {
        rc = io_uring_get_events(&ring_);
      }
      if (rc >= 0 || rc == -ETIME) break;
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN || rc == -EBUSY) {
        // The kernel wants completions reaped first; give back what is there, if anything.
        if (io_uring_cq_ready(&ring_) > 0 || max_completions == 0) break;
        continue;
      }
      if (rc == -EEXIST)
        return make_error(ErrorKind::internal,
                          "io_uring: this engine was used from a second thread; an engine belongs "
                          "to the one thread that first submitted to it");
      return make_errno_error(-rc, "io_uring_enter", "");
    }
    uint32_t count = 0;
    while (count < max_completions) {
      std::array<io_uring_cqe*, 64> batch;
      const unsigned want = std::min<unsigned>(batch.size(), max_completions - count);
      const unsigned got = io_uring_peek_batch_cqe(&ring_, batch.data(), want);
      if (got == 0) break;
      for (unsigned i = 0; i < got; ++i)
        completions[count++] = BackendCompletion{io_uring_cqe_get_data64(batch[i]), batch[i]->res};
      io_uring_cq_advance(&ring_, got);
      in_flight_ -= got;
    }
    return count;
  }

  uint64_t submit_calls() const override { return submit_calls_; }
  uint64_t fixed_buffer_ops() const override { return fixed_buffer_ops_; }
  std::string describe() const override {
    return fmt::format("io_uring {} SQ entries{}{}{}{}, {} registered buffer region(s)",
                       ring_entries_, sqpoll_ ? ", SQPOLL" : "", iopoll_ ? ", IOPOLL" : "",
                       deferred_taskrun_ ? ", single issuer + deferred task work" : "",
                       fixed_files_ ? ", fixed files" : "", region_count_);
  }

 private:
  explicit UringBackend(uint32_t queue_depth) : capacity_(queue_depth) {}

  Status init(const EngineConfig& config) {
    ring_entries_ = next_power_of_two(std::max<uint32_t>(config.queue_depth, 2));
    bool sqpoll = config.sqpoll;
    bool iopoll = config.iopoll;
    // Single issuer + deferred task work (Linux 6.1+): completions are processed when the
    // owner thread asks for them instead of interrupting it, which is what lets one thread
    // keep a deep queue of large direct reads busy. Incompatible with SQPOLL. The ring
    // starts disabled so that the thread which first submits — not the one that built the
    // engine — becomes its single issuer.
    bool taskrun = !sqpoll;
    while (true) {
      io_uring_params params{};
      // The CQ holds every outstanding piece even when all of them complete at once.
      params.flags = IORING_SETUP_CQSIZE;
      params.cq_entries = ring_entries_ * 2;
      if (sqpoll) {
        params.flags |= IORING_SETUP_SQPOLL;
        params.sq_thread_idle = 100;  // ms before the kernel thread sleeps
      }
      if (iopoll) params.flags |= IORING_SETUP_IOPOLL;
      if (taskrun)
        params.flags |= IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER |
                        IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;
      int rc = io_uring_queue_init_params(ring_entries_, &ring_, &params);
      if (rc == 0) break;
      if (taskrun) {
        spdlog::debug("io_uring: no single-issuer/deferred task work here ({})", std::strerror(-rc));
        taskrun = false;
        continue;
      }
      if (sqpoll) {
        spdlog::warn("io_uring: the kernel refused SQPOLL ({}); submitting with io_uring_enter",
                     std::strerror(-rc));
        sqpoll = false;
        taskrun = true;
        continue;
      }
      if (iopoll) {
        spdlog::warn("io_uring: the kernel refused IOPOLL ({}); using interrupt completions",
                     std::strerror(-rc));
        iopoll = false;
        continue;
      }
      Error error = make_errno_error(-rc, "io_uring_queue_init", "");
      error.kind = ErrorKind::unsupported;
      return error;
    }
    ring_ready_ = true;
    sqpoll_ = sqpoll;
    iopoll_ = iopoll;
    deferred_taskrun_ = taskrun;
    enabled_ = !taskrun;
    // Fixed files save an fget/fput per I/O; a sparse table is filled as files show up.
    fixed_files_ = io_uring_register_files_sparse(&ring_, kFileSlots) == 0;
    if (!fixed_files_) spdlog::debug("io_uring: no sparse file table; using plain fds");
    return Status();
  }

  Status enable_on_owner_thread() {
    if (enabled_) return Status();
    // liburing 2.3 declares io_uring_enable_rings but Debian's library does not export it:
    // the register opcode it wraps, directly.
    const long rc = ::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS,
                              nullptr, 0);
    if (rc < 0) return make_errno_error(errno, "io_uring enable", "");
    enabled_ = true;
    return Status();
  }

  int fixed_file_slot(const DirectFile& file) {
    if (!fixed_files_) return -1;
    for (uint32_t i = 0; i < kFileSlots; ++i)
      if (file_ids_[i] == file.id()) return static_cast<int>(i);
    // A new file: take an empty slot, else the next one round-robin. The kernel keeps the
    // old file alive for pieces still in flight on the replaced slot.
    uint32_t slot = kFileSlots;
    for (uint32_t i = 0; i < kFileSlots && slot == kFileSlots; ++i)
      if (file_ids_[i] == 0) slot = i;
    if (slot == kFileSlots) slot = next_replace_++ % kFileSlots;
    int fd = file.fd();
    if (io_uring_register_files_update(&ring_, slot, &fd, 1) != 1) return -1;
    file_ids_[slot] = file.id();
    return static_cast<int>(slot);
  }

  int fixed_buffer_index(const void* buffer, uint32_t length_bytes) const {
    const auto* begin = static_cast<const char*>(buffer);
    for (uint32_t i = 0; i < region_count_; ++i) {
      const auto* base = static_cast<const char*>(regions_[i].iov_base);
      if (begin >= base && begin + length_bytes <= base + regions_[i].iov_len)
        return static_cast<int>(i);
    }
    return -1;
  }

  const uint32_t capacity_;
  uint32_t ring_entries_ = 0;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool sqpoll_ = false;
  bool iopoll_ = false;
  bool fixed_files_ = false;
  bool deferred_taskrun_ = false;
  bool enabled_ = false;
  uint32_t in_flight_ = 0;  // prepared and not yet reaped
  std::array<uint64_t, kFileSlots> file_ids_{};  // 0: empty
  uint32_t next_replace_ = 0;
  std::array<iovec, kBufferRegions> regions_{};
  uint32_t region_count_ = 0;
  uint64_t submit_calls_ = 0;
  uint64_t fixed_buffer_ops_ = 0;
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_uring_backend(const EngineConfig& config) {
  return UringBackend::create(config);
}

#else

Result<std::unique_ptr<BackendQueue>> make_uring_backend(const EngineConfig&) {
  return make_error(ErrorKind::unsupported, "this build has no io_uring (liburing-dev was not found)");
}

#endif

}  // namespace strata::io
