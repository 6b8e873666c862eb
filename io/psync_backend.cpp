// strata/io/psync_backend.cpp — the portable backend: a bounded pool of threads, each
// doing one blocking pread/pwrite at a time, so queue depth N means N pool threads.
// Works everywhere (no io_uring, no libaio) and is the reference the other two must match.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "io/backend.h"

namespace strata::io {
namespace {

// A fixed-capacity FIFO (allocated once; push/pop never allocate).
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(uint32_t capacity) : items_(capacity) {}
  bool empty() const { return count_ == 0; }
  uint32_t size() const { return count_; }
  void push(const T& item) {
    items_[(head_ + count_) % items_.size()] = item;
    ++count_;
  }
  T pop() {
    T item = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --count_;
    return item;
  }

 private:
  std::vector<T> items_;
  uint32_t head_ = 0;
  uint32_t count_ = 0;
};

class PsyncBackend final : public BackendQueue {
 public:
  explicit PsyncBackend(uint32_t queue_depth)
      : capacity_(queue_depth), staged_(queue_depth), work_(queue_depth), done_(queue_depth) {
    workers_.reserve(queue_depth);
    for (uint32_t i = 0; i < queue_depth; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  ~PsyncBackend() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    // std::jthread joins each worker; they finish the piece in hand first.
  }

  Backend kind() const override { return Backend::psync; }
  uint32_t capacity() const override { return capacity_; }
  Status register_buffer(void*, uint64_t) override {
    return make_error(ErrorKind::unsupported, "psync has no registered buffers");
  }

  Status prepare(const BackendPiece& piece) override {
    staged_.push(piece);  // handed to the pool at the next submit_and_reap, in one lock
    return Status();
  }

  Result<uint32_t> submit_and_reap(BackendCompletion* completions, uint32_t max_completions,
                                   uint32_t min_completions) override {
    std::unique_lock lock(mutex_);
    if (!staged_.empty()) {
      const uint32_t handed = staged_.size();
      while (!staged_.empty()) work_.push(staged_.pop());
      ++submit_calls_;
      if (handed == 1) {
        work_ready_.notify_one();
      } else {
        work_ready_.notify_all();
      }
    }
    if (done_.size() < min_completions)
      completed_.wait(lock, [&] { return done_.size() >= min_completions; });
    uint32_t count = 0;
    while (count < max_completions && !done_.empty()) completions[count++] = done_.pop();
    return count;
  }

  uint64_t submit_calls() const override { return submit_calls_; }
  std::string describe() const override {
    return fmt::format("{} pread/pwrite threads", capacity_);
  }

 private:
  void worker_loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      work_ready_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;  // stopping, nothing left
      const BackendPiece piece = work_.pop();
      lock.unlock();
      // One syscall per piece: a short count or EINTR goes back to the core, which owns
      // resubmitting and retrying for every backend alike.
      const ssize_t moved =
          piece.op == Op::read
              ? ::pread(piece.file->fd(), piece.buffer, piece.length_bytes,
                        static_cast<off_t>(piece.file_offset_bytes))
              : ::pwrite(piece.file->fd(), piece.buffer, piece.length_bytes,
                         static_cast<off_t>(piece.file_offset_bytes));
      const int64_t result = moved < 0 ? -static_cast<int64_t>(errno) : moved;
      lock.lock();
      done_.push(BackendCompletion{piece.tag, result});
      completed_.notify_one();
    }
  }

  const uint32_t capacity_;
  BoundedQueue<BackendPiece> staged_;  // owner thread only
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable completed_;
  BoundedQueue<BackendPiece> work_;          // guarded by mutex_
  BoundedQueue<BackendCompletion> done_;     // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  uint64_t submit_calls_ = 0;
  std::vector<std::jthread> workers_;        // last: joined before the queues go away
};

}  // namespace

Result<std::unique_ptr<BackendQueue>> make_psync_backend(const EngineConfig& config) {
  return std::unique_ptr<BackendQueue>(new PsyncBackend(config.queue_depth));
}

}  // namespace strata::io
