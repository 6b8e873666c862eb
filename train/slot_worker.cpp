// strata/train/slot_worker.cpp — see slot_worker.h.
#include "train/slot_worker.h"

#include <cassert>

namespace strata {

SlotWorker::SlotWorker(size_t slot_count, std::function<Status()> bind, Job job)
    : job_(std::move(job)), busy_(slot_count, false), ring_(slot_count) {
  assert(slot_count > 0);
  thread_ = std::thread([this, bind = std::move(bind)] { run(bind); });
}

SlotWorker::~SlotWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_.notify_all();
  thread_.join();
}

void SlotWorker::claim(size_t slot) {
  std::lock_guard lock(mutex_);
  assert(slot < busy_.size() && !busy_[slot]);  // wait_done before claiming a slot again
  busy_[slot] = true;
  ++busy_count_;
}

void SlotWorker::post(size_t slot) {
  {
    std::lock_guard lock(mutex_);
    assert(slot < busy_.size() && busy_[slot]);
    assert(posted_count_ - taken_count_ < ring_.size());  // one post per claim: never full
    ring_[posted_count_ % ring_.size()] = slot;
    ++posted_count_;
  }
  posted_.notify_one();
}

void SlotWorker::wait_done(size_t slot) {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return !busy_[slot]; });
}

void SlotWorker::wait_idle() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return busy_count_ == 0; });
}

Status SlotWorker::first_error() const {
  std::lock_guard lock(mutex_);
  if (first_error_) return *first_error_;
  return Status();
}

void SlotWorker::run(std::function<Status()> bind) {
  const Status bound = bind ? bind() : Status();
  std::unique_lock lock(mutex_);
  for (;;) {
    // Drains before it honours stop: a posted job holds a promise (a release) that must be kept.
    posted_.wait(lock, [&] { return stopping_ || taken_count_ < posted_count_; });
    if (taken_count_ == posted_count_) return;
    const size_t slot = ring_[taken_count_ % ring_.size()];
    ++taken_count_;
    lock.unlock();
    Status status = job_(slot, bound);
    lock.lock();
    if (!status.ok() && !first_error_) first_error_ = status.error();
    busy_[slot] = false;
    --busy_count_;
    done_.notify_all();
  }
}

}  // namespace strata
