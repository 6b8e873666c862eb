// strata/run/budgets.h — the ONE rule that turns a config's `device.memory` and `host.memory`
// into the memory a run works in, and the training run's budgets and checks built on it.
//
// The rule (memory_pools). A device says whether its memory IS host memory (device/device.h
// memory_is_host), and that alone decides:
//   - the CPU device computes in place on pinned host blocks, so the two keys are ONE pool of
//     device.memory + host.memory: the caller's scratch (its kernels' fixed device bytes) is
//     the device's own region, and the rest is the pool the scheduler stages and computes in.
//     So 2 GiB + 6 GiB and 3 GiB + 5 GiB are the same run on the CPU device.
//   - a discrete device (cuda, emulated) has its own arena of device.memory, which the
//     caller's scratch and the steps' working set share; host.memory is the pinned pool that
//     state is staged through from NVMe. The caller's scratch does not come out of the pool.
// Every caller that sizes a device, a pool or anything that streams through them asks this rule;
// none derives the split itself. What each caller passes as its scratch:
//   - training (run_budgets below): the kernels' device scratch (train_plan.h device_scratch),
//     at least one device alignment unit, since a device region is never empty;
//   - generation (generate/generate.cpp): the KV cache, activations, bf16 scratch, workspace and
//     logits — and, when the embedding is read by rows, those rows; the rows' host buffers then
//     come off the pool it returns;
//   - the overlap bench (apps/bench/bench_overlap.cpp): one layer, at most device.memory — the
//     compute-only reference's device buffer, kept so its figures stay those of earlier rounds;
//   - the optimizer chunk size (run/train_config.h chunk_elements_for_budgets): nothing (the
//     layout is not known yet); a chunk streams through the pool and, on a discrete device, is
//     updated in the arena, so it asks for the smaller of the two (streaming_bytes).
//
// Pure functions of their arguments; any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "device/device.h"
#include "models/model_layout.h"
#include "run/train_config.h"
#include "run/train_plan.h"

namespace strata {

struct MemoryPools {
  bool one_pool = false;            // the CPU device: device memory is host memory
  // What the device side may hold at most: both keys on the CPU device, device.memory on a
  // discrete device. The caller's scratch and its largest step must fit in it.
  uint64_t budget_bytes = 0;
  uint64_t device_region_bytes = 0; // what the device is created with (the scratch on the CPU device)
  uint64_t pool_bytes = 0;          // the scheduler's host budget: budget less scratch, or host.memory
  // What memory a piece of state streaming through both tiers may take: the pool on the CPU
  // device, the smaller of pool and arena on a discrete one.
  uint64_t streaming_bytes() const;
};

// The rule (see the contract). `scratch_bytes` larger than both keys leaves an empty pool
// (never a wrapped one): the caller's check reports what does not fit.
MemoryPools memory_pools(device::Kind kind, uint64_t device_memory_bytes, uint64_t host_memory_bytes,
                         uint64_t scratch_bytes);
// The same for a config's device.kind, device.memory and host.memory (a kind name the config
// reader accepted).
MemoryPools memory_pools(const TrainConfig& config, uint64_t scratch_bytes);

// The budgets a training run stages within: the rule with the kernels' scratch.
struct RunBudgets {
  uint64_t scratch_bytes = 0;       // DeviceScratchSizes::total()
  uint64_t device_region_bytes = 0; // what the device is created with
  uint64_t pool_bytes = 0;          // the scheduler's host budget
  uint64_t budget_bytes = 0;        // MemoryPools::budget_bytes: the scratch and the largest step fit in it
  // The device the kernels are timed on before the run (measure_compute, freed before the run
  // allocates): the config's device.memory on CUDA; on the CPU device the whole of both keys,
  // since the timing holds a unit's weights and gradients at once where the run streams them.
  uint64_t timing_device_bytes = 0;
  bool one_pool = false;            // the CPU device
};
// `run`: the plan whose stage-3 gather buffers count in the scratch (device_scratch).
RunBudgets run_budgets(const TrainConfig& config, const ModelLayout& layout, const TrainPlan* run = nullptr);

// CUDA: one step's working set plus the scratch must fit `device.memory`; host-homed state plus
// one step's NVMe staging must fit `host.memory`. CPU device: the scratch, host-homed state and
// one step's NVMe staging must fit the one pool (both keys). The error names the key(s) and the
// size needed.
[[nodiscard]] Status check_budgets(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run);

}  // namespace strata
