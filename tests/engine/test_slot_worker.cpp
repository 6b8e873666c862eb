// tests/engine/test_slot_worker.cpp — proves SlotWorker (train/slot_worker.h), which runs the
// host AdamW off the device's callback thread: jobs posted from another thread (standing for a
// host callback) run in post order on the worker's own thread, after its bind; wait_done and
// wait_idle return only once the jobs have run; the bind's error reaches every job (which still
// runs, to keep its slot's promises) and the first failure is kept; the destructor runs what was
// posted before it joins.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "train/slot_worker.h"

namespace strata {
namespace {

TEST(SlotWorker, RunsPostedJobsInOrderOnItsBoundThread) {
  constexpr size_t kSlots = 2;
  std::thread::id bound_on;
  std::vector<size_t> ran;  // touched by the worker only, read after wait_idle
  std::vector<std::thread::id> ran_on;
  SlotWorker worker(
      kSlots,
      [&] {
        bound_on = std::this_thread::get_id();
        return Status();
      },
      [&](size_t slot, const Status& bound) {
        EXPECT_TRUE(bound.ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow update: waits must wait
        ran.push_back(slot);
        ran_on.push_back(std::this_thread::get_id());
        return Status();
      });
  // Twenty chunks through two slots, each posted from a fresh thread as a callback would be.
  for (size_t chunk = 0; chunk < 20; ++chunk) {
    const size_t slot = chunk % kSlots;
    worker.wait_done(slot);
    worker.claim(slot);
    std::thread callback([&worker, slot] { worker.post(slot); });
    callback.join();
  }
  worker.wait_idle();
  ASSERT_EQ(ran.size(), 20u);
  for (size_t chunk = 0; chunk < ran.size(); ++chunk) {
    EXPECT_EQ(ran[chunk], chunk % kSlots);
    EXPECT_EQ(ran_on[chunk], bound_on);
  }
  EXPECT_NE(bound_on, std::this_thread::get_id());
  EXPECT_TRUE(worker.first_error().ok());
}

TEST(SlotWorker, WaitDoneWaitsForAClaimNotYetPosted) {
  std::atomic<bool> ran{false};
  SlotWorker worker(1, nullptr, [&](size_t, const Status&) {
    ran = true;
    return Status();
  });
  worker.claim(0);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    worker.post(0);
  });
  worker.wait_done(0);  // claimed, not yet posted: must not return before the job ran
  EXPECT_TRUE(ran);
  late.join();
}

TEST(SlotWorker, ABindFailureReachesEveryJobAndIsKept) {
  std::atomic<int> runs{0};
  SlotWorker worker(
      2, [] { return Status(make_error(ErrorKind::internal, "cannot bind")); },
      [&](size_t, const Status& bound) {
        ++runs;  // runs anyway: a job keeps its slot's promises even when it cannot compute
        return bound;
      });
  for (size_t slot = 0; slot < 2; ++slot) {
    worker.claim(slot);
    worker.post(slot);
  }
  worker.wait_idle();
  EXPECT_EQ(runs, 2);
  ASSERT_FALSE(worker.first_error().ok());
  EXPECT_EQ(worker.first_error().error().message, "cannot bind");
}

TEST(SlotWorker, TheDestructorRunsWhatWasPosted) {
  std::atomic<int> runs{0};
  {
    SlotWorker worker(3, nullptr, [&](size_t, const Status&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++runs;
      return Status();
    });
    for (size_t slot = 0; slot < 3; ++slot) {
      worker.claim(slot);
      worker.post(slot);
    }
  }
  EXPECT_EQ(runs, 3);
}

}  // namespace
}  // namespace strata
