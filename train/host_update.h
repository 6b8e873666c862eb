// strata/train/host_update.h — the host-site optimizer's copy engine (run/train_plan.h,
// OptimizerSite::host): a chunk's gradients go device→host, the CPU AdamW updates master, m and v
// where they live in host memory, and the new compute copy goes back host→device — while the
// compute stream runs the next backward.
//
// Contract
// - One chunk is `stage`d, then `post`ed. stage takes the next of two staging slots (waiting
//   until the worker has consumed its previous job, and making the compute stream wait for
//   that job's copy back, so the slot's buffers are free on both sides) and enqueues the
//   chunk's gradients device→host on the compute stream behind the backward that made them.
//   The caller then fills the slot's job — the optimizer's kernel calls over the staged
//   gradients (`Staging::pieces`, optim/state.h) — and `post`s it with where the new compute
//   copy comes from and goes to.
// - post promises the plan step's release to the scheduler (an acquire waits for it) and
//   enqueues, on the compute stream, a host callback that only posts the slot to an owned
//   worker thread (SlotWorker: a long callback would hold back the driver's other callbacks,
//   the scheduler's copy completions among them). The worker runs the pieces on a CPU backend,
//   enqueues the copy back on the optimizer stream and the step's release behind it — the
//   release even when something failed, so nothing waits forever. After `post` returns, the
//   step's release is the worker's: the caller must not release it.
// - finish_step, once per step after its last update was posted: waits for the worker, then
//   makes the compute stream wait for every copy back on the device (so the step's end_step
//   covers them and the next step's compute follows them). first_error is the first failed
//   job's Status.
// - Memory: the two slots (largest chunk's fp32 gradients and compute copy each) come from the
//   run's host arena at open; nothing is allocated per chunk (the pieces vectors keep their
//   capacity).
// - Threads: the owner's thread calls everything; the worker thread runs the jobs. The updater
//   must be destroyed before the scheduler whose steps it releases (the worker joins first,
//   after the jobs already posted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "device/device.h"
#include "kernels/backend.h"
#include "memory/host_arena.h"
#include "scheduler/scheduler.h"
#include "train/slot_worker.h"

namespace strata {

class HostUpdater {
 public:
  // The CPU backend and the optimizer stream on `device`, two slots for chunks of up to
  // `largest_chunk_elements` whose compute copy is `precision`, and the worker (bound to
  // `device`'s thread rules).
  [[nodiscard]] static Result<std::unique_ptr<HostUpdater>> open(device::Device& device, memory::HostArena& arena,
                                                                 uint64_t largest_chunk_elements, DType precision);
  ~HostUpdater() = default;
  HostUpdater(const HostUpdater&) = delete;
  HostUpdater& operator=(const HostUpdater&) = delete;

  // A staged chunk: its gradients in host memory (once the compute stream reaches the copy),
  // the bf16 copy the update writes (null for fp32: the master is the copy), and the job's
  // kernel calls for the caller to fill.
  struct Staging {
    size_t slot = 0;
    float* grads = nullptr;
    uint16_t* copy = nullptr;
    std::vector<kernels::AdamWChunk>* pieces = nullptr;
  };
  [[nodiscard]] Result<Staging> stage(device::Stream& compute, const float* device_grads, uint64_t count);
  // Hands the staged job to the worker: its pieces run, then `size_bytes` of `new_params` (host)
  // go to `device_params` on the optimizer stream and plan step `step_index` is released behind
  // them. `promised` says whether the release became the worker's (false only when the promise
  // itself failed: then the caller still releases the step).
  [[nodiscard]] Status post(const Staging& staged, device::Stream& compute, scheduler::Scheduler& scheduler,
                            size_t step_index, const void* new_params, void* device_params, uint64_t size_bytes,
                            bool& promised);
  [[nodiscard]] Status finish_step(device::Stream& compute);
  Status first_error() const { return worker_->first_error(); }

 private:
  struct Slot {
    memory::HostBuffer grads;   // the chunk's gradients, fp32, device→host
    memory::HostBuffer params;  // its new compute copy (bf16), host→device
    device::Event free;         // recorded on the optimizer stream once the slot is consumed
    bool used = false;
    // The job (written by the owner before the slot is posted, read by the worker after).
    std::vector<kernels::AdamWChunk> pieces;
    scheduler::Scheduler* scheduler = nullptr;
    size_t step_index = 0;
    void* device_params = nullptr;
    const void* new_params = nullptr;
    uint64_t params_size_bytes = 0;
  };
  explicit HostUpdater(device::Device& device) : device_(device) {}
  // The worker's job for one slot (SlotWorker::Job).
  Status run(size_t slot_index, const Status& bound);

  device::Device& device_;
  std::unique_ptr<device::Device> host_device_;
  std::unique_ptr<kernels::ComputeBackend> host_backend_;
  device::Stream optimizer_stream_;
  device::Event updates_done_;
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;
  // Last: joined (after the jobs posted so far) before the slots and streams go.
  std::unique_ptr<SlotWorker> worker_;
};

}  // namespace strata
