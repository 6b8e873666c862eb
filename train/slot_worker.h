// strata/train/slot_worker.h — one owned thread that runs jobs posted from a device stream's
// host callback.
//
// Why: a host callback (cudaLaunchHostFunc) must be short. The CUDA driver runs a process's
// host callbacks one at a time, so a long one — a chunk's CPU AdamW — holds back every other
// callback, the scheduler's copy completions among them. The callback only `post`s a slot
// here (no wait, no allocation); this thread runs the slot's job.
//
// Slots: the owner keeps `slot_count` job descriptions of its own, indexed by slot. It `claim`s
// a slot before arranging its post and claims it again only after `wait_done`: so at most
// `slot_count` posts are ever outstanding, the ring (sized at construction) cannot overflow and
// `post` never waits. Jobs run in the order they were posted.
//
// The job gets the thread's bind result (`bind`, e.g. Device::bind_thread, runs first on the
// worker thread): a job must run even when it is an error, to give back what its slot holds
// (a promised release), and report the error. The first failed job's Status is kept.
//
// Threads: `post` from any thread (a host callback); everything else from the owner's thread.
// The destructor runs the jobs already posted, then joins: a slot claimed but never posted is
// the owner's to settle before (e.g. by draining the stream whose callback posts it).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata {

class SlotWorker {
 public:
  using Job = std::function<Status(size_t slot, const Status& bound)>;
  SlotWorker(size_t slot_count, std::function<Status()> bind, Job job);
  ~SlotWorker();
  SlotWorker(const SlotWorker&) = delete;
  SlotWorker& operator=(const SlotWorker&) = delete;

  // The owner: `slot` will be posted (marks it busy until its job has run).
  void claim(size_t slot);
  // Any thread, a host callback included: the claimed `slot`'s job may run now. Never blocks.
  void post(size_t slot);
  // The owner: waits until `slot` is not busy (its last claim's job has run; at once if none).
  void wait_done(size_t slot);
  // The owner: waits until no slot is busy.
  void wait_idle();
  // The first failed job's Status (ok if none failed).
  Status first_error() const;

 private:
  void run(std::function<Status()> bind);

  Job job_;
  mutable std::mutex mutex_;
  std::condition_variable posted_, done_;
  std::vector<bool> busy_;        // per slot: claimed and its job not yet run
  std::vector<size_t> ring_;      // posted slots, oldest at ring_[taken_ % size]
  size_t posted_count_ = 0, taken_count_ = 0;
  size_t busy_count_ = 0;
  bool stopping_ = false;
  std::optional<Error> first_error_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace strata
