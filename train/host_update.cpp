// train/host_update.cpp — the host-site optimizer's copy engine (host_update.h).
#include "train/host_update.h"

#include "common/size.h"

namespace strata {

Result<std::unique_ptr<HostUpdater>> HostUpdater::open(device::Device& device, memory::HostArena& arena,
                                                       uint64_t largest_chunk_elements, DType precision) {
  std::unique_ptr<HostUpdater> updater(new HostUpdater(device));
  STRATA_ASSIGN_OR_RETURN(updater->host_device_, device::make_device(device::Kind::cpu, kMiB));
  STRATA_ASSIGN_OR_RETURN(updater->host_backend_,
                          kernels::make_backend(*updater->host_device_, kernels::BatchShape{1, 1}));
  STRATA_ASSIGN_OR_RETURN(updater->optimizer_stream_, device.create_stream("optimizer"));
  STRATA_ASSIGN_OR_RETURN(updater->updates_done_, device.create_event());
  for (int i = 0; i < 2; ++i) {
    Slot slot;
    STRATA_ASSIGN_OR_RETURN(slot.grads, memory::HostBuffer::allocate(arena, largest_chunk_elements * 4));
    STRATA_ASSIGN_OR_RETURN(slot.params,
                            memory::HostBuffer::allocate(arena, largest_chunk_elements * dtype_size_bytes(precision)));
    STRATA_ASSIGN_OR_RETURN(slot.free, device.create_event());
    updater->slots_.push_back(std::move(slot));
  }
  HostUpdater* self = updater.get();
  updater->worker_ = std::make_unique<SlotWorker>(
      updater->slots_.size(), [self] { return self->device_.bind_thread(); },
      [self](size_t slot_index, const Status& bound) { return self->run(slot_index, bound); });
  return updater;
}

Result<HostUpdater::Staging> HostUpdater::stage(device::Stream& compute, const float* device_grads, uint64_t count) {
  const size_t slot_index = next_slot_;
  Slot& slot = slots_[slot_index];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  if (slot.used) {
    // The worker has enqueued the slot's last copy and recorded `free` behind it (so the wait
    // below is on that record, not an older one); the device then waits for the copy itself.
    worker_->wait_done(slot_index);
    STRATA_RETURN_IF_ERROR(device_.stream_wait(compute, slot.free));
  }
  slot.used = true;
  auto* host_grads = reinterpret_cast<float*>(slot.grads.data());
  STRATA_RETURN_IF_ERROR(device_.copy_to_host(compute, host_grads, device_grads, count * 4));
  return Staging{slot_index, host_grads, reinterpret_cast<uint16_t*>(slot.params.data()), &slot.pieces};
}

Status HostUpdater::post(const Staging& staged, device::Stream& compute, scheduler::Scheduler& scheduler, size_t step_index,
                         const void* new_params, void* device_params, uint64_t size_bytes, bool& promised) {
  Slot& slot = slots_[staged.slot];
  slot.scheduler = &scheduler;
  slot.step_index = step_index;
  slot.new_params = new_params;
  slot.device_params = device_params;
  slot.params_size_bytes = size_bytes;
  // From here the step's release is the worker's: promised now, so an acquire waits for it.
  STRATA_RETURN_IF_ERROR(scheduler.promise_release(step_index));
  promised = true;
  worker_->claim(staged.slot);
  // Only a post: the callback must be short (see the header).
  Status launched = device_.launch(compute, [worker = worker_.get(), index = staged.slot] { worker->post(index); });
  // A claimed slot is always posted: its job keeps the release promise even on a failed device.
  if (!launched.ok()) worker_->post(staged.slot);
  return launched;
}

Status HostUpdater::finish_step(device::Stream& compute) {
  // Waiting for the worker first costs nothing: the step's end_step waits on the host anyway.
  worker_->wait_idle();
  STRATA_RETURN_IF_ERROR(device_.record(updates_done_, optimizer_stream_));
  return device_.stream_wait(compute, updates_done_);
}

Status HostUpdater::run(size_t slot_index, const Status& bound) {
  Slot& slot = slots_[slot_index];
  Status status = bound;
  for (const kernels::AdamWChunk& piece : slot.pieces) {
    if (!status.ok()) break;
    status = host_backend_->adamw(piece);
  }
  if (status.ok())
    status = device_.copy_to_device(optimizer_stream_, slot.device_params, slot.new_params, slot.params_size_bytes);
  if (status.ok()) status = device_.record(slot.free, optimizer_stream_);
  // Kept whatever happened above: a step left held would stall the next acquire forever.
  Status released = slot.scheduler->release_promised_after(slot.step_index, optimizer_stream_);
  return status.ok() ? released : status;
}

}  // namespace strata
