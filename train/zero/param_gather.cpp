// strata/train/zero/param_gather.cpp — ZeRO stage 3's double-buffered gather (param_gather.h).
#include "train/zero/param_gather.h"

#include <cassert>
#include <cstring>

namespace strata {
namespace {

// The units a step computes on whole, in their places in the gather buffer.
std::vector<size_t> gathered_units(const ModelLayout& layout, const StepInfo& info) {
  switch (info.kind) {
    case StepKind::fwd_embed:
    case StepKind::fwd_block:
    case StepKind::bwd_block: return {info.unit};
    case StepKind::head: return {layout.ln_f_unit(), layout.embed_unit()};
    default: return {};
  }
}

}  // namespace

ParamGather::ParamGather(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run, ZeroStep& zero,
                         device::Device& device, kernels::ComputeBackend& backend)
    : config_(&config), layout_(&layout), run_(&run), zero_(&zero), device_(&device), backend_(&backend),
      second_offset_bytes_(gather_second_offset_bytes(config, layout)) {}

Result<ParamGather> ParamGather::create(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                        ZeroStep& zero, device::Device& device, kernels::ComputeBackend& backend) {
  ParamGather gather(config, layout, run, zero, device, backend);
  for (Slot& slot : gather.slots_) {
    STRATA_ASSIGN_OR_RETURN(slot.buffer, device.allocate(gather_buffer_bytes(config, layout)));
  }
  gather.use_plan(run);
  return gather;
}

void ParamGather::use_plan(const TrainPlan& run) {
  for (const Slot& slot : slots_) assert(slot.requests.empty() && "use_plan with a gather in flight");
  run_ = &run;
  step_units_.clear();
  for (const StepInfo& info : run.steps) step_units_.push_back(gathered_units(*layout_, info));
  next_gather_step_.assign(run.steps.size(), SIZE_MAX);
  size_t later = SIZE_MAX;
  for (size_t index = run.steps.size(); index-- > 0;) {
    next_gather_step_[index] = later;
    if (!step_units_[index].empty()) later = index;
  }
  // The last gathering step of an iteration starts none: the next iteration's first reads a
  // share its owner rewrites after it (opt.embed).
  for (Slot& slot : slots_) slot.for_step = SIZE_MAX;
}

// The step's units into `slot`: this rank's share of each is copied to its place in the
// unit's layout (so the transport never reads a scheduler block, which may move once the step
// is released), then the in-place allgatherv is left in flight. The caller has synchronized the
// stream: no queued op still reads the slot or writes a share. CPU device: host memory, a
// memcpy, MPI. CUDA ranks: the share is copied on the compute stream and that stream is
// synchronized before NCCL's own stream may read the slot.
Status ParamGather::start(size_t step_index, Slot& slot, const scheduler::StepBuffers& buffers) {
  const uint32_t param_bytes = dtype_size_bytes(config_->precision);
  const bool on_cpu = device_->memory_is_host();
  const std::vector<size_t>& units = step_units_[step_index];
  for (size_t position = 0; position < units.size(); ++position) {
    auto* unit_params = static_cast<std::byte*>(slot.buffer.data()) + (position == 0 ? 0 : second_offset_bytes_);
    const UnitIds& ids = run_->units[units[position]];
    if (ids.params != kNoTensor) {
      std::byte* share = unit_params + ids.params_range.begin_elements * param_bytes;
      const uint64_t share_bytes = ids.params_range.element_count * param_bytes;
      if (on_cpu) {
        std::memcpy(share, buffers.device_data(ids.params), share_bytes);
      } else {
        device::Stream& compute = backend_->compute_stream();
        STRATA_RETURN_IF_ERROR(device_->copy_on_device(compute, share, buffers.device_data(ids.params), share_bytes));
        STRATA_RETURN_IF_ERROR(device_->synchronize(compute));
      }
    }
    STRATA_ASSIGN_OR_RETURN(comm::Request request, zero_->gather_params_async(units[position], unit_params));
    slot.requests.push_back(request);
  }
  slot.for_step = step_index;
  return Status();
}

Status ParamGather::for_step(size_t step_index, const scheduler::StepBuffers& buffers) {
  Slot* slot = nullptr;
  for (Slot& candidate : slots_)
    if (candidate.for_step == step_index) slot = &candidate;
  if (slot == nullptr) {
    slot = gathered_ == slots_[0].buffer.data() ? &slots_[1] : &slots_[0];
    STRATA_RETURN_IF_ERROR(backend_->synchronize());
    STRATA_RETURN_IF_ERROR(start(step_index, *slot, buffers));
  }
  for (comm::Request request : slot->requests) STRATA_RETURN_IF_ERROR(zero_->wait(request));
  slot->requests.clear();
  slot->for_step = SIZE_MAX;  // step indices repeat every iteration
  gathered_ = static_cast<const std::byte*>(slot->buffer.data());
  const size_t next = next_gather_step_[step_index];
  if (next == SIZE_MAX) return Status();
  Slot& other = slot == &slots_[0] ? slots_[1] : slots_[0];
  STRATA_RETURN_IF_ERROR(backend_->synchronize());  // the previous step's ops may still read `other`
  return start(next, other, buffers);
}

const void* ParamGather::params(size_t position) const {
  return gathered_ + (position == 0 ? 0 : second_offset_bytes_);
}

}  // namespace strata
