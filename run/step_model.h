// strata/run/step_model.h — predicts one training step before it runs: what each tier
// holds, the bytes each step moves between tiers, how long its compute takes on this
// machine, how long its NVMe traffic takes at the bandwidths `strata tune` measured, and so
// the step time. `strata plan` prints it; `strata train` prints it next to what it measured.
//
// Traffic and time: the access plan (run/train_plan.h) driven through the scheduler's own
// residency model (scheduler/residency.h) on a simulated clock (scheduler/replay.h): the
// same options and arenas the trainer gives the real scheduler, NVMe at the tuned (or assumed)
// bandwidths, each step held for its timed kernels. So the bytes are those of the real policy —
// write-back reserve, in-place pool and its fragmentation fallback, read-ahead limits — not of
// a second description of it. One iteration warms the tiers, the second is counted.
//
// Compute: each kind of kernel (block forward, block backward with recompute, head, the
// embeddings, AdamW, the bf16 widening) is timed at the config's batch shape, alone (the
// blocks twice, the faster kept), on buffers allocated from the device the run will use, one
// phase at a time so the timing never needs more than one step's working set. Sums give the
// compute-only step time.
//
// The step time: the replay's iteration (compute plus the waits for data the simulated
// scheduler could not hide), never below the I/O floor or the compute side. On the CPU device
// the host↔device copies and the store's checksums run on the same cores as the kernels; their
// CPU time (copy bytes at the measured memory copy rate, hashed bytes at the measured hash
// rate, spread over the cores) lengthens every step's compute in the replay.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "models/model_layout.h"
#include "run/train_config.h"
#include "run/train_plan.h"
#include "kernels/backend.h"
#include "device/device.h"
#include "scheduler/replay.h"

namespace strata {

struct StepTraffic {
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
};


struct ComputeRates {
  double fwd_embed_s = 0, bwd_embed_s = 0;
  double fwd_block_s = 0, bwd_block_s = 0;  // one block at the config's shape
  double head_s = 0;
  double adamw_ns_per_element = 0;
  double widen_ns_per_element = 0;          // bf16 → fp32 of a compute copy (0 with fp32)
  double dequant_ns_per_element = 0;        // a quantised base block → fp32 (LoRA, int8 / nf4)
  double copy_ns_per_byte = 0;              // memcpy between two large buffers
  double hash_ns_per_byte = 0;              // the store's XXH3 checksum
  double measure_seconds = 0;               // how long measuring took
  std::string backend = "cpu";              // the backend the kernels ran on (backend.h name())
};

// Times the kernels on `device` (its free arena must hold one phase — a block's fp32 weights,
// gradients and workspace, or the head's). All kernels run through `backend` (kernels/backend.h), the one of `device`'s kind.
[[nodiscard]] Result<ComputeRates> measure_compute(const TrainConfig& config, const ModelLayout& layout,
                                                   device::Device& device, kernels::ComputeBackend& backend);

struct StepPrediction {
  StepTraffic traffic;
  double compute_s = 0;        // the kernels alone
  double copy_cpu_s = 0;       // host↔device copies on the CPU device's cores
  double hash_cpu_s = 0;       // checksums of the NVMe traffic
  double read_MBps = 0;        // the bandwidths used (tuned, or the defaults below)
  double write_MBps = 0;
  bool tuned = false;          // both came from `strata tune`
  double io_s = 0;             // nvme reads / read bandwidth + writes / write bandwidth
  double replay_step_s = 0;    // the replay's step: compute and the waits for data
  double stall_s = 0;          // of which waiting for data
  std::string replay_error;    // non-empty: the replay could not run the plan (the figures are 0)
  double step_s = 0;           // max(replay_step_s, io_s, compute side)
  const char* bound = "";      // "compute" or "NVMe"
};

// Bandwidths used when the config carries no tuned figure, in decimal MB/s: a middling
// datacenter NVMe drive; `strata plan` says when it falls back to them.
inline constexpr double kUntunedReadMBps = 2000.0;
inline constexpr double kUntunedWriteMBps = 1500.0;

// The plan replayed on a simulated clock through the scheduler's own residency model
// (scheduler/replay.h) with the scheduler the trainer would create for `config`: one warm
// iteration, one counted. Each step's compute is its kernels' time × `cpu_share`.
[[nodiscard]] Result<scheduler::ReplayResult> replay_step(const TrainConfig& config, const ModelLayout& layout,
                                                          const TrainPlan& run, const ComputeRates& rates,
                                                          double cpu_share = 1.0);

[[nodiscard]] StepPrediction predict_step(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                          const ComputeRates& rates);

// The whole report `strata plan` prints: placement, bytes per tier, traffic per step,
// compute and I/O, the predicted step time.
std::string format_plan(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                        const ComputeRates& rates, const StepPrediction& prediction);
nlohmann::ordered_json plan_json(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                 const ComputeRates& rates, const StepPrediction& prediction);

}  // namespace strata
