// strata/train/lr_schedule.h — the learning rate of each update: Hugging Face's warmup
// schedules (transformers.optimization), step for step, as torch's LambdaLR applies them.
//
// Contract
// - Step numbering: `update_step` counts optimizer updates from 0 — the update that produces
//   step s+1's weights is update s, the lr LambdaLR hands optimizer.step() after s calls of
//   scheduler.step(). It is absolute across resumes (a resumed run continues at the committed
//   step), so the lrs of a resumed run are the uninterrupted run's, bit for bit.
// - The multiplier λ(s), with W = warmup_steps, T = the run's total updates (`steps`):
//     s < W:             s / max(1, W)                                   (every decay)
//     constant:          1
//     linear:            f = max(0, (T − s) / max(1, T − W))
//     cosine:            p = (s − W) / max(1, T − W);  f = max(0, ½·(1 + cos(π·½·2·p)))
//   then linear and cosine take min_lr_ratio r: max(0, f·(1 − r) + r) — transformers'
//   get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate) for cosine, the same blend for
//   linear (r = 0 leaves f as it is: get_linear_schedule_with_warmup). lr = optimizer.lr · λ(s),
//   in double, in that order (LambdaLR's base_lr * lmbda(epoch)).
// - Without a schedule block the lr is optimizer.lr itself (no multiplication), so such runs
//   are bit-identical to runs from before schedules existed.
// - Pure functions of the config; any thread.
#pragma once

#include <cstdint>

#include "run/train_config.h"

namespace strata {

// λ(update_step) of the contract for `total_steps` updates.
double lr_multiplier(const ScheduleConfig& schedule, uint64_t update_step, uint64_t total_steps);
// The lr of update `update_step`: optimizer.lr, or optimizer.lr · λ with a schedule.
double learning_rate_at(const TrainConfig& config, uint64_t update_step);

}  // namespace strata
