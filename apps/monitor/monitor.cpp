#include "apps/monitor/monitor.h"

#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace strata::monitor {

namespace {

const char* state_name(RunState state) {
  switch (state) {
    case RunState::starting: return "starting";
    case RunState::running: return "running";
    case RunState::finished: return "finished";
    case RunState::failed: return "failed";
  }
  return "?";
}

// Prometheus' text format spells non-finite numbers its own way.
std::string number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// Writes one metric family: HELP and TYPE once, then its samples.
class Exposition {
 public:
  explicit Exposition(std::optional<uint32_t> rank) : rank_(rank) {}

  void family(const char* name, const char* type, const char* help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  // `labels`: already formatted pairs (`tier="host"`), or empty.
  void sample(const char* name, const std::string& labels, double value) {
    std::string all = labels;
    if (rank_) all = fmt::format("rank=\"{}\"{}{}", *rank_, labels.empty() ? "" : ",", labels);
    if (all.empty())
      fmt::format_to(std::back_inserter(out_), "{} {}\n", name, number(value));
    else
      fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, all, number(value));
  }
  void single(const char* name, const char* type, const char* help, double value) {
    family(name, type, help);
    sample(name, "", value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::optional<uint32_t> rank_;
  std::string out_;
};

}  // namespace

RunMetrics::RunMetrics(std::optional<uint32_t> rank, size_t history_limit_steps)
    : rank_(rank), history_limit_steps_(std::max<size_t>(history_limit_steps, 2)) {
  start_unix_seconds_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void RunMetrics::begin(const RunInfo& info) {
  std::lock_guard lock(mutex_);
  info_ = info;
  committed_step_ = info.first_step;
  state_ = RunState::running;
}

void RunMetrics::record_step(const StepSample& sample) {
  std::lock_guard lock(mutex_);
  ++steps_total_;
  stall_seconds_total_ += sample.stall_seconds;
  compute_seconds_total_ += sample.compute_seconds;
  for (int pair = 0; pair < kPairCount; ++pair) transfer_bytes_total_[pair] += sample.transfer_bytes[pair];
  if (sample.committed) committed_step_ = sample.step;
  if (sample.eval_loss) last_eval_loss_ = sample.eval_loss;
  if (history_.size() >= history_limit_steps_) {
    // Thin the older half to every other step: the curve keeps its whole span.
    const size_t half = history_.size() / 2;
    std::deque<StepSample> thinned;
    for (size_t i = 0; i < half; i += 2) thinned.push_back(history_[i]);
    for (size_t i = half; i < history_.size(); ++i) thinned.push_back(history_[i]);
    history_ = std::move(thinned);
  }
  history_.push_back(sample);
}

void RunMetrics::finish(const Status& status) {
  std::lock_guard lock(mutex_);
  if (status.ok()) {
    state_ = RunState::finished;
    return;
  }
  state_ = RunState::failed;
  error_text_ = status.error().to_string();
  if (status.error().kind == ErrorKind::corrupt) ++checksum_failures_total_;
  if (status.error().kind == ErrorKind::io || status.error().kind == ErrorKind::no_space) ++io_errors_total_;
}

std::string RunMetrics::prometheus_text() const {
  std::lock_guard lock(mutex_);
  Exposition e(rank_);
  const StepSample last = history_.empty() ? StepSample{} : history_.back();
  const double step_seconds = last.seconds;
  e.single("strata_step", "gauge", "Training steps completed in total, counting the steps of resumed runs.",
           static_cast<double>(history_.empty() ? info_.first_step : last.step));
  e.single("strata_target_step", "gauge", "The step this run trains up to.", static_cast<double>(info_.total_steps));
  e.single("strata_committed_step", "gauge", "The last step committed to the store (the checkpoint a resume continues from).",
           static_cast<double>(committed_step_));
  e.single("strata_steps_total", "counter", "Steps this process has completed.", static_cast<double>(steps_total_));
  e.single("strata_loss", "gauge", "Training loss (cross-entropy, nats) of the last step.",
           history_.empty() ? std::numeric_limits<double>::quiet_NaN() : last.loss);
  e.single("strata_learning_rate", "gauge", "Learning rate of the last step's update (the schedule's, docs/train.md).",
           history_.empty() ? std::numeric_limits<double>::quiet_NaN() : last.learning_rate);
  e.single("strata_eval_loss", "gauge",
           "Held-out loss (cross-entropy, nats, over every trained token) of the latest evaluation (eval:); NaN before "
           "the first.",
           last_eval_loss_.value_or(std::numeric_limits<double>::quiet_NaN()));
  e.single("strata_step_seconds", "gauge", "Wall time of the last step, commit included.", step_seconds);
  e.single("strata_predicted_step_seconds", "gauge",
           "Step time `strata plan` predicts for this config (0: no prediction).", info_.predicted_step_seconds);
  e.single("strata_tokens_per_second", "gauge", "Tokens trained per second over the last step.",
           step_seconds > 0 ? static_cast<double>(info_.tokens_per_step) / step_seconds : 0.0);
  e.single("strata_tokens_total", "counter", "Tokens this process has trained on.",
           static_cast<double>(steps_total_ * info_.tokens_per_step));
  e.single("strata_stall_ratio", "gauge", "Share of the last step's wall time compute waited for data (0..1).",
           step_seconds > 0 ? last.stall_seconds / step_seconds : 0.0);
  e.single("strata_stall_seconds_total", "counter", "Time compute waited for data to arrive.", stall_seconds_total_);
  e.single("strata_compute_seconds_total", "counter", "Time spent in the compute kernels.", compute_seconds_total_);

  e.family("strata_tier_bytes", "gauge", "Bytes in use in each tier at the end of the last step.");
  for (int t = 0; t < kTierCount; ++t)
    e.sample("strata_tier_bytes", fmt::format("tier=\"{}\"", kTierNames[t]), static_cast<double>(last.tier_bytes[t]));
  e.family("strata_tier_budget_bytes", "gauge", "Each tier's budget (nvme: the store's capacity).");
  for (int t = 0; t < kTierCount; ++t)
    e.sample("strata_tier_budget_bytes", fmt::format("tier=\"{}\"", kTierNames[t]),
             static_cast<double>(info_.budget_bytes[t]));
  e.family("strata_transfer_bytes_total", "counter", "Bytes the scheduler moved from one tier to another.");
  for (int p = 0; p < kPairCount; ++p)
    e.sample("strata_transfer_bytes_total", fmt::format("from=\"{}\",to=\"{}\"", kPairFrom[p], kPairTo[p]),
             static_cast<double>(transfer_bytes_total_[p]));
  e.single("strata_nvme_read_bytes_total", "counter", "Bytes read from the NVMe store.",
           static_cast<double>(transfer_bytes_total_[0]));
  e.single("strata_nvme_write_bytes_total", "counter", "Bytes written to the NVMe store (what wears an SSD).",
           static_cast<double>(transfer_bytes_total_[3]));
  e.single("strata_io_errors_total", "counter",
           "I/O errors that reached the run (EIO, ENOSPC; retried EINTR/EAGAIN and short transfers are not errors).",
           static_cast<double>(io_errors_total_));
  e.single("strata_checksum_failures_total", "counter", "Store extents whose checksum did not match on read.",
           static_cast<double>(checksum_failures_total_));
  e.family("strata_run_state", "gauge", "1 for the state the run is in.");
  for (RunState s : {RunState::starting, RunState::running, RunState::finished, RunState::failed})
    e.sample("strata_run_state", fmt::format("state=\"{}\"", state_name(s)), s == state_ ? 1.0 : 0.0);
  e.single("strata_start_time_seconds", "gauge", "When the process started, in seconds since the Unix epoch.",
           start_unix_seconds_);
  return e.take();
}

nlohmann::ordered_json step_json(const StepSample& s) {
  nlohmann::ordered_json json = {{"step", s.step},
          {"loss", s.loss},
          {"learning_rate", s.learning_rate},
          {"seconds", s.seconds},
          {"compute_seconds", s.compute_seconds},
          {"stall_seconds", s.stall_seconds},
          {"nvme_read_bytes", s.transfer_bytes[0]},
          {"nvme_write_bytes", s.transfer_bytes[3]},
          {"host_to_device_bytes", s.transfer_bytes[1]},
          {"device_to_host_bytes", s.transfer_bytes[2]},
          {"device_bytes", s.tier_bytes[0]},
          {"host_bytes", s.tier_bytes[1]},
          {"nvme_bytes", s.tier_bytes[2]},
          {"committed", s.committed}};
  if (s.eval_loss) json["eval_loss"] = *s.eval_loss;
  return json;
}

nlohmann::ordered_json RunMetrics::history_json(uint64_t since_step) const {
  std::lock_guard lock(mutex_);
  nlohmann::ordered_json run;
  run["config"] = info_.config_path;
  run["state"] = state_name(state_);
  if (!error_text_.empty()) run["error"] = error_text_;
  if (rank_) run["rank"] = *rank_;
  run["first_step"] = info_.first_step;
  run["total_steps"] = info_.total_steps;
  run["committed_step"] = committed_step_;
  run["tokens_per_step"] = info_.tokens_per_step;
  run["predicted_step_seconds"] = info_.predicted_step_seconds;
  nlohmann::ordered_json budgets;
  for (int t = 0; t < kTierCount; ++t) budgets[kTierNames[t]] = info_.budget_bytes[t];
  run["budgets"] = std::move(budgets);
  run["nvme_write_bytes_total"] = transfer_bytes_total_[3];
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const StepSample& s : history_)
    if (s.step > since_step) steps.push_back(step_json(s));
  return {{"run", std::move(run)}, {"steps", std::move(steps)}};
}

}  // namespace strata::monitor
