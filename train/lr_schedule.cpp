// The schedules of lr_schedule.h. Each line follows transformers' lr lambdas term for term, in
// double, so the multipliers are Python's floats bit for bit (tests/engine/test_train_loss.py).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata {

double lr_multiplier(const ScheduleConfig& schedule, uint64_t update_step, uint64_t total_steps) {
  const auto s = static_cast<double>(update_step);
  const auto warmup = static_cast<double>(schedule.warmup_steps);
  if (update_step < schedule.warmup_steps) return s / std::max(1.0, warmup);
  // T − W and T − s as HF's Python ints: signed, so a run with W ≥ T still divides by 1.
  const int64_t decay_steps = static_cast<int64_t>(total_steps) - static_cast<int64_t>(schedule.warmup_steps);
  const auto decay_denominator = static_cast<double>(std::max<int64_t>(1, decay_steps));
  double factor = 1.0;
  switch (schedule.decay) {
    case LrDecay::constant:
      return 1.0;
    case LrDecay::linear:
      factor = std::max(0.0, static_cast<double>(static_cast<int64_t>(total_steps) - static_cast<int64_t>(update_step)) /
                                 decay_denominator);
      break;
    case LrDecay::cosine: {
      const double progress =
          static_cast<double>(static_cast<int64_t>(update_step) - static_cast<int64_t>(schedule.warmup_steps)) /
          decay_denominator;
      // num_cycles 0.5, the product in HF's order: math.pi * float(num_cycles) * 2.0 * progress.
      factor = std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress)));
      break;
    }
  }
  return std::max(0.0, factor * (1.0 - schedule.min_lr_ratio) + schedule.min_lr_ratio);
}

double learning_rate_at(const TrainConfig& config, uint64_t update_step) {
  if (!config.schedule.enabled) return config.optimizer.lr;
  return config.optimizer.lr * lr_multiplier(config.schedule, update_step, config.steps);
}

}  // namespace strata
