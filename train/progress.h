// strata/train/progress.h — what a training run tells whoever watches it: its fixed facts once,
// then one sample per completed step. The trainer publishes to a `StepObserver` it is given
// (TrainOptions::monitor) and knows nothing of who listens; the live metrics and the HTTP
// dashboard (apps/monitor) are one observer. Tiers and tier pairs are listed in the order the
// metrics and the charts use.
//
// Threads: the trainer calls an observer from its own thread, once before the first step and
// once per step — never per I/O; an observer shared with other threads locks for itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata::progress {

inline constexpr int kTierCount = 3;  // device, host, nvme
inline constexpr const char* kTierNames[kTierCount] = {"device", "host", "nvme"};
inline constexpr int kPairCount = 4;
// from → to of each transfer direction the scheduler counts (scheduler::TierPair order).
inline constexpr const char* kPairFrom[kPairCount] = {"nvme", "host", "device", "host"};
inline constexpr const char* kPairTo[kPairCount] = {"host", "device", "host", "nvme"};

// What is fixed for a run, published once before its first step.
struct RunInfo {
  std::string config_path;
  uint64_t first_step = 0;        // the step the run starts after (a resumed run's commit)
  uint64_t total_steps = 0;       // the step it trains up to
  uint64_t tokens_per_step = 0;
  double predicted_step_seconds = 0.0;  // 0: no prediction
  uint64_t budget_bytes[kTierCount] = {};  // device, host budgets; the store's capacity
};

// One completed step: its figures, and where the tiers stood when it ended.
struct StepSample {
  uint64_t step = 0;
  double loss = 0.0;
  double seconds = 0.0;
  double compute_seconds = 0.0;
  double stall_seconds = 0.0;
  uint64_t transfer_bytes[kPairCount] = {};  // moved during this step, per pair
  uint64_t tier_bytes[kTierCount] = {};      // in use at the step's end
  bool committed = false;                    // the step ended with a store commit
  double learning_rate = 0.0;                // the lr of the step's update (train/lr_schedule.h)
  std::optional<double> eval_loss;           // the held-out loss measured after this step's commit (eval:)
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void begin(const RunInfo& info) = 0;
  virtual void record_step(const StepSample& sample) = 0;
};

}  // namespace strata::progress
