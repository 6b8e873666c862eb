// strata/train/zero/param_gather.h — ZeRO stage 3's gather of whole compute copies (train/zero/
// zero.h "Stages"): the units a plan step computes on whole are all-gathered from every rank's
// share into one of two buffers allocated at start-up, and the next gathering step's gather is
// started into the other before this step computes, so communication overlaps compute as the
// scheduler's lookahead overlaps NVMe.
//
// Which steps gather: a forward (the unit), the head (ln_f, then the embeddings at
// gather_second_offset_bytes — run/train_plan.h) and each backward recompute (the unit); the
// optimizer steps do not. With K micro-batches that is every pass's. The last gathering step of
// an iteration starts none: the next iteration's first reads a share its owner rewrites after it
// (opt.embed).
//
// Plans: the training plan's, and for an evaluation the forward-only plan's (build_eval_plan,
// the same shares): use_plan switches between them between iterations, when no gather is in
// flight, so one pair of buffers serves both.
//
// Buffers: two of gather_buffer_bytes on the device, owned here, allocated by create() and
// freed with this object (before the device it came from: the Run declares it after its device).
// A slot handed out by params() stays valid until the next for_step().
//
// Threads: the Run's thread only (as ZeroStep). The caller's compute backend is synchronized
// before a slot is written, so no queued op still reads it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"
#include "device/device.h"
#include "kernels/backend.h"
#include "models/model_layout.h"
#include "run/train_config.h"
#include "run/train_plan.h"
#include "scheduler/scheduler.h"
#include "train/zero/zero.h"

namespace strata {

class ParamGather {
 public:
  // The two slots on `device` and the gathering steps of `run` (which must gather its params:
  // TrainPlan::params_gathered). Every reference must outlive the object.
  [[nodiscard]] static Result<ParamGather> create(const TrainConfig& config, const ModelLayout& layout,
                                                  const TrainPlan& run, ZeroStep& zero, device::Device& device,
                                                  kernels::ComputeBackend& backend);
  ParamGather(ParamGather&&) = default;
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  // From now on the steps are `run`'s (a plan over the same shares: training's or evaluation's,
  // which must outlive its use). Between iterations only: no gather may be in flight.
  void use_plan(const TrainPlan& run);
  // Whether plan step `step_index` computes on gathered units.
  bool gathers(size_t step_index) const { return !step_units_[step_index].empty(); }
  // Before a gathering step's compute: its gather (started during the previous one's compute,
  // or now for the iteration's first) is waited for, and the next gathering step's is started
  // into the other slot — its shares are in this step's `buffers` (build_train_plan).
  [[nodiscard]] Status for_step(size_t step_index, const scheduler::StepBuffers& buffers);
  // The current step's whole compute copy of its unit at `position` (0: first, 1: the head's
  // embeddings).
  const void* params(size_t position) const;

 private:
  struct Slot {
    device::DeviceBuffer buffer;           // gather_buffer_bytes: [first unit | second unit]
    std::vector<comm::Request> requests;   // in flight until waited
    size_t for_step = SIZE_MAX;            // the plan step it is being gathered for
  };
  ParamGather(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run, ZeroStep& zero,
              device::Device& device, kernels::ComputeBackend& backend);
  Status start(size_t step_index, Slot& slot, const scheduler::StepBuffers& buffers);

  const TrainConfig* config_;
  const ModelLayout* layout_;
  const TrainPlan* run_;
  ZeroStep* zero_;
  device::Device* device_;
  kernels::ComputeBackend* backend_;
  uint64_t second_offset_bytes_ = 0;            // gather_second_offset_bytes
  std::array<Slot, 2> slots_;
  const std::byte* gathered_ = nullptr;         // the slot the current step computes on
  std::vector<std::vector<size_t>> step_units_; // per plan step: the units it gathers
  std::vector<size_t> next_gather_step_;        // per plan step: the next gathering step (SIZE_MAX: none)
};

}  // namespace strata
