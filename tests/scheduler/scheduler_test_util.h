// tests/scheduler/scheduler_test_util.h — stamped data and an in-process NVMe backing for the
// scheduler suites. A stamp makes every 8-byte word a hash of (tensor, version, word index),
// so a byte from the wrong tensor, an old version or the wrong offset is caught.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "scheduler/scheduler.h"
#include "tests/support/stamp.h"

namespace strata::scheduler::testing {

using strata::testing::has_stamp;
using strata::testing::stamp;

// The NVMe home kept in process memory: a test double for suites about decisions (eviction
// order, budgets) where the disk would only add time. Each transfer really copies, at `wait`,
// after an optional delay so transfers overlap the caller as disk I/O would. A write also
// snapshots its source at submit and counts, at wait, sources that changed in between (a
// block modified under its NVMe write: a torn checkpoint on a real drive).
class MemoryBacking final : public NvmeBacking {
 public:
  MemoryBacking(const AccessPlan& plan, std::chrono::microseconds delay) : delay_(delay) {
    for (size_t id = 0; id < plan.tensors().size(); ++id) {
      data_.emplace_back(plan.tensors()[id].size_bytes);
      stamp(data_.back().data(), data_.back().size(), id, 0);
    }
  }
  Result<uint64_t> submit_read(TensorId tensor, const PlanTensor&, void* host_dst) override {
    return add(Pending{tensor, host_dst, nullptr, {}});
  }
  Result<uint64_t> submit_write(TensorId tensor, const PlanTensor&, const void* host_src) override {
    Pending pending{tensor, nullptr, host_src, {}};
    pending.snapshot.assign(static_cast<const unsigned char*>(host_src),
                            static_cast<const unsigned char*>(host_src) + data_[tensor].size());
    return add(std::move(pending));
  }
  Status wait(uint64_t ticket) override {
    Pending pending;
    {
      std::lock_guard lock(mutex_);
      pending = std::move(pending_.at(ticket));
      pending_.erase(ticket);
    }
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    std::vector<unsigned char>& home = data_[pending.tensor];
    const bool changed = pending.read_into == nullptr &&
                         std::memcmp(pending.snapshot.data(), pending.write_from, home.size()) != 0;
    if (pending.read_into != nullptr)
      std::memcpy(pending.read_into, home.data(), home.size());
    else
      std::memcpy(home.data(), pending.write_from, home.size());
    std::lock_guard lock(mutex_);
    if (changed) ++unstable_writes_;
    (pending.read_into != nullptr ? reads_ : writes_) += 1;
    return Status();
  }
  Status register_host(memory::HostArena&) override { return Status(); }

  const std::vector<unsigned char>& home(TensorId tensor) const { return data_[tensor]; }
  uint64_t reads() const {
    std::lock_guard lock(mutex_);
    return reads_;
  }
  // Writes whose source changed between submit and wait.
  uint64_t unstable_writes() const {
    std::lock_guard lock(mutex_);
    return unstable_writes_;
  }
  uint64_t writes() const {
    std::lock_guard lock(mutex_);
    return writes_;
  }

 private:
  struct Pending {
    TensorId tensor = 0;
    void* read_into = nullptr;
    const void* write_from = nullptr;
    std::vector<unsigned char> snapshot;  // writes: the source as it was at submit
  };
  uint64_t add(Pending pending) {
    std::lock_guard lock(mutex_);
    pending_[++next_ticket_] = std::move(pending);
    return next_ticket_;
  }
  std::chrono::microseconds delay_;
  std::vector<std::vector<unsigned char>> data_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Pending> pending_;
  uint64_t next_ticket_ = 0;
  uint64_t reads_ = 0, writes_ = 0, unstable_writes_ = 0;
};

}  // namespace strata::scheduler::testing
