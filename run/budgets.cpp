// strata/run/budgets.cpp — the one pool rule and a training run's budgets (run/budgets.h).
#include "run/budgets.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/size.h"

namespace strata {

namespace sch = scheduler;

namespace {

MemoryPools split_pools(bool one_pool, uint64_t device_memory_bytes, uint64_t host_memory_bytes,
                        uint64_t scratch_bytes) {
  MemoryPools pools;
  pools.one_pool = one_pool;
  if (!one_pool) {
    pools.budget_bytes = device_memory_bytes;
    pools.device_region_bytes = device_memory_bytes;
    pools.pool_bytes = host_memory_bytes;
    return pools;
  }
  pools.budget_bytes = device_memory_bytes + host_memory_bytes;
  pools.device_region_bytes = scratch_bytes;
  pools.pool_bytes = pools.budget_bytes - std::min(pools.budget_bytes, scratch_bytes);
  return pools;
}

}  // namespace

uint64_t MemoryPools::streaming_bytes() const {
  return one_pool ? pool_bytes : std::min(pool_bytes, device_region_bytes);
}

MemoryPools memory_pools(device::Kind kind, uint64_t device_memory_bytes, uint64_t host_memory_bytes,
                         uint64_t scratch_bytes) {
  return split_pools(device::memory_is_host(kind), device_memory_bytes, host_memory_bytes, scratch_bytes);
}

MemoryPools memory_pools(const TrainConfig& config, uint64_t scratch_bytes) {
  return split_pools(device::memory_is_host(config.device_kind), config.device_memory_bytes,
                     config.host_memory_bytes, scratch_bytes);
}

RunBudgets run_budgets(const TrainConfig& config, const ModelLayout& layout, const TrainPlan* run) {
  RunBudgets budgets;
  budgets.scratch_bytes = device_scratch(config, layout, run).total();
  // A device region is never empty: the CPU device's holds at least one alignment unit.
  const MemoryPools pools =
      memory_pools(config, std::max<uint64_t>(budgets.scratch_bytes, device::kDeviceAlignmentBytes));
  budgets.one_pool = pools.one_pool;
  budgets.device_region_bytes = pools.device_region_bytes;
  budgets.pool_bytes = pools.pool_bytes;
  budgets.budget_bytes = pools.budget_bytes;
  budgets.timing_device_bytes = pools.budget_bytes;
  return budgets;
}

namespace {

// Host-homed state plus the largest step's NVMe-homed tensors, each rounded to a host block.
struct HostNeed {
  uint64_t homed_bytes = 0;
  uint64_t largest_nvme_step_bytes = 0;
  uint64_t total() const { return homed_bytes + largest_nvme_step_bytes; }
};

HostNeed host_need(const TrainPlan& run) {
  HostNeed need;
  for (const sch::PlanTensor& tensor : run.plan.tensors())
    if (tensor.home == sch::Home::host) need.homed_bytes += align_up(tensor.size_bytes, 4096);
  for (size_t step = 0; step < run.plan.step_count(); ++step) {
    uint64_t bytes = 0;
    for (sch::TensorId id : run.plan.step_tensors(step))
      if (run.plan.tensors()[id].home == sch::Home::nvme) bytes += align_up(run.plan.tensors()[id].size_bytes, 4096);
    need.largest_nvme_step_bytes = std::max(need.largest_nvme_step_bytes, bytes);
  }
  return need;
}

}  // namespace

Status check_budgets(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run) {
  const HostNeed host = host_need(run);
  // What the scratch holds beyond the kernels' own: gradients with grads: device — with
  // accumulation every trained unit's, for the whole update (train_plan.h device_grads_offsets).
  const std::string device_grads =
      config.placement.grads != Tier::device ? std::string()
      : config.gradient_accumulation_steps > 1
          ? fmt::format(" and every unit's gradients ({}, held on the device across the {} micro-batches of "
                        "gradient_accumulation_steps: use grads: host or nvme to stream them instead)",
                        format_size(device_scratch(config, layout, &run).block_grads_bytes),
                        config.gradient_accumulation_steps)
          : std::string(" and device-resident gradients");
  const RunBudgets budgets = run_budgets(config, layout, &run);
  if (budgets.one_pool) {
    const uint64_t needed = budgets.device_region_bytes + host.total();
    if (needed > budgets.budget_bytes)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: keys 'device.memory' + 'host.memory': {} + {} (one pool on the CPU device) "
                                    "cannot hold {} of kernel workspace{}, {} of host-homed state (activations, and "
                                    "what placement puts on host) and {} that one step stages from NVMe; give the "
                                    "two at least {} together",
                                    config.source_path, format_size(config.device_memory_bytes),
                                    format_size(config.host_memory_bytes), format_size(budgets.scratch_bytes),
                                    device_grads,
                                    format_size(host.homed_bytes), format_size(host.largest_nvme_step_bytes),
                                    format_size(align_up(needed, kMiB))));
    return Status();
  }
  const DeviceScratchSizes scratch = device_scratch(config, layout, &run);
  uint64_t largest_step_bytes = 0;
  size_t largest_step = 0;
  for (size_t step = 0; step < run.plan.step_count(); ++step) {
    uint64_t bytes = run.plan.step_bytes(step, device::kDeviceAlignmentBytes);
    if (bytes > largest_step_bytes) {
      largest_step_bytes = bytes;
      largest_step = step;
    }
  }
  const uint64_t needed = scratch.total() + largest_step_bytes;
  if (needed > budgets.budget_bytes)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'device.memory': {} cannot hold one step's working set: step '{}' needs {} "
                                  "of tensors plus {} of kernel workspace{}; use at least {}",
                                  config.source_path, format_size(config.device_memory_bytes),
                                  run.plan.steps()[largest_step].name, format_size(largest_step_bytes),
                                  format_size(scratch.total()),
                                  device_grads,
                                  format_size(align_up(needed, kMiB))));
  const uint64_t host_needed = host.total();
  if (host_needed > budgets.pool_bytes)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'host.memory': {} is too small: host-homed state (activations, and what "
                                  "placement puts on host) takes {} and one step stages up to {} from NVMe; use at "
                                  "least {}",
                                  config.source_path, format_size(config.host_memory_bytes),
                                  format_size(host.homed_bytes), format_size(host.largest_nvme_step_bytes),
                                  format_size(align_up(host_needed, kMiB))));
  return Status();
}

}  // namespace strata
