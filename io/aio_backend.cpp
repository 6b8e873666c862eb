// strata/io/aio_backend.cpp — the Linux native AIO backend (libaio): io_submit a batch,
// io_getevents in batches. Native AIO is only asynchronous for O_DIRECT files; on a
// buffered fallback file io_submit does the I/O inline, which is still correct.
#include "io/backend.h"
#include "strata_build_config.h"

#if STRATA_HAVE_AIO
#include <libaio.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#endif

namespace strata::io {

#if STRATA_HAVE_AIO
namespace {

class AioBackend final : public BackendQueue {
 public:
  static Result<std::unique_ptr<BackendQueue>> create(const EngineConfig& config) {
    std::unique_ptr<AioBackend> backend(new AioBackend(config.queue_depth));
    int rc = io_setup(static_cast<int>(config.queue_depth), &backend->context_);
    if (rc < 0) {
      Error error = make_errno_error(-rc, "io_setup", "");
      error.kind = ErrorKind::unsupported;
      error.message = "libaio context refused (fs.aio-max-nr reached?)";
      return error;
    }
    backend->context_ready_ = true;
    return std::unique_ptr<BackendQueue>(std::move(backend));
  }

  ~AioBackend() override {
    if (context_ready_) io_destroy(context_);
  }

  Backend kind() const override { return Backend::aio; }
  uint32_t capacity() const override { return capacity_; }
  Status register_buffer(void*, uint64_t) override {
    return make_error(ErrorKind::unsupported, "libaio has no registered buffers");
  }

  Status prepare(const BackendPiece& piece) override {
    const uint32_t slot = free_slots_[--free_count_];
    iocb& cb = iocbs_[slot];
    if (piece.op == Op::read) {
      io_prep_pread(&cb, piece.file->fd(), piece.buffer, piece.length_bytes,
                    static_cast<long long>(piece.file_offset_bytes));
    } else {
      io_prep_pwrite(&cb, piece.file->fd(), piece.buffer, piece.length_bytes,
                     static_cast<long long>(piece.file_offset_bytes));
    }
    cb.data = reinterpret_cast<void*>(static_cast<uintptr_t>(slot));
    tags_[slot] = piece.tag;
    staged_[staged_count_++] = &cb;
    return Status();
  }

  Result<uint32_t> submit_and_reap(BackendCompletion* completions, uint32_t max_completions,
                                   uint32_t min_completions) override {
    uint32_t next = 0;
    while (next < staged_count_) {
      const int rc = io_submit(context_, static_cast<long>(staged_count_ - next), staged_.data() + next);
      ++submit_calls_;
      if (rc > 0) {
        next += static_cast<uint32_t>(rc);
        in_kernel_ += static_cast<uint32_t>(rc);
      } else if (rc == -EINTR) {
        continue;
      } else if (rc == -EAGAIN || rc == 0) {
        // The kernel is short of resources: let a completion free some, then go on.
        if (in_kernel_ > 0) STRATA_RETURN_IF_ERROR(collect(1));
      } else {
        // io_submit refused the first iocb of the rest (EINVAL, EBADF...): that piece
        // completes with the error; the others still go.
        const uint32_t slot = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(staged_[next]->data));
        push_ready(BackendCompletion{tags_[slot], rc});
        free_slots_[free_count_++] = slot;
        ++next;
      }
    }
    staged_count_ = 0;
    if (max_completions == 0) return 0u;
    // Whatever already finished, and as much waiting as the caller asked for.
    if (in_kernel_ > 0) {
      const uint32_t wanted = min_completions > ready_count_ ? min_completions - ready_count_ : 0;
      STRATA_RETURN_IF_ERROR(collect(std::min(wanted, in_kernel_)));
    }
    uint32_t count = 0;
    while (count < max_completions && ready_count_ > 0) {
      completions[count++] = ready_[ready_head_];
      ready_head_ = (ready_head_ + 1) % capacity_;
      --ready_count_;
    }
    return count;
  }

  uint64_t submit_calls() const override { return submit_calls_; }
  std::string describe() const override { return fmt::format("libaio context of {}", capacity_); }

 private:
  explicit AioBackend(uint32_t queue_depth)
      : capacity_(queue_depth),
        iocbs_(queue_depth),
        tags_(queue_depth),
        free_slots_(queue_depth),
        staged_(queue_depth),
        events_(queue_depth),
        ready_(queue_depth) {
    for (uint32_t i = 0; i < queue_depth; ++i) free_slots_[i] = queue_depth - 1 - i;
    free_count_ = queue_depth;
  }

  void push_ready(const BackendCompletion& completion) {
    ready_[(ready_head_ + ready_count_) % capacity_] = completion;
    ++ready_count_;
  }

  // io_getevents until at least `min_new` more pieces finished (0: only what is there).
  Status collect(uint32_t min_new) {
    uint32_t got = 0;
    do {
      const int rc = io_getevents(context_, static_cast<long>(min_new - got),
                                  static_cast<long>(in_kernel_), events_.data(), nullptr);
      if (rc == -EINTR) continue;
      if (rc < 0) return make_errno_error(-rc, "io_getevents", "");
      for (int i = 0; i < rc; ++i) {
        const uint32_t slot =
            static_cast<uint32_t>(reinterpret_cast<uintptr_t>(events_[i].obj->data));
        // res is the byte count or -errno (as an unsigned long); res2 is unused for files.
        push_ready(BackendCompletion{tags_[slot], static_cast<int64_t>(static_cast<long>(events_[i].res))});
        free_slots_[free_count_++] = slot;
      }
      got += static_cast<uint32_t>(rc);
      in_kernel_ -= static_cast<uint32_t>(rc);
    } while (got < min_new);
    return Status();
  }

  const uint32_t capacity_;
  io_context_t context_ = nullptr;
  bool context_ready_ = false;
  std::vector<iocb> iocbs_;
  std::vector<uint64_t> tags_;
  std::vector<uint32_t> free_slots_;
  uint32_t free_count_ = 0;
  std::vector<iocb*> staged_;
  uint32_t staged_count_ = 0;
  uint32_t in_kernel_ = 0;
  std::vector<io_event> events_;
  std::vector<BackendCompletion> ready_;  // reaped or refused, not yet handed to the core
  uint32_t ready_head_ = 0;
  uint32_t ready_count_ = 0;
  uint64_t submit_calls_ = 0;
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_aio_backend(const EngineConfig& config) {
  return AioBackend::create(config);
}

#else

Result<std::unique_ptr<BackendQueue>> make_aio_backend(const EngineConfig&) {
  return make_error(ErrorKind::unsupported, "this build has no libaio (libaio-dev was not found)");
}

#endif

}  // namespace strata::io
