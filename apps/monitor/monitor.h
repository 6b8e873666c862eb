// strata/apps/monitor/monitor.h — what a run shows while it goes on: the live metrics the
// trainer publishes and the HTTP server (`strata train --serve`) reads.
//
// Contract.
// - `RunMetrics` owns one run's snapshot: the run's fixed facts (budgets, prediction, target
//   step), the per-step history, and counters summed from the per-step deltas. The trainer
//   writes it (`begin`, `record_step`, `finish`) from its own thread, once per step — never
//   per I/O, so a scrape costs the run one uncontended lock per step at most. Any number of
//   server threads read it (`prometheus_text`, `history_json`) at the same time; every call
//   is thread-safe and copies out under the lock.
// - Counters (`*_total`) only grow for the life of the process (Prometheus' reset rule
//   covers a restart); gauges describe the last completed step.
// - The history keeps every step (about 120 bytes each: a million steps is ~120 MB, so
//   `history_limit_steps` caps it; the oldest half is thinned to every other step when full,
//   keeping the whole run's shape at a coarser grain).
// - `rank` (issue 15): when set, every series carries a `rank="N"` label, so several ranks'
//   scrapes merge in one Prometheus without clashing.
//
// `MonitorServer` (server.h) serves this over HTTP; `write_report` (report.h) draws the same
// charts from a finished run's `--metrics` file. The chart code is shared (assets/charts.js).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/listen_address.h"
#include "common/status.h"
#include "train/progress.h"

namespace strata::monitor {

// The run's facts and step samples, and the tier order, are the trainer's (train/progress.h).
using progress::kPairCount;
using progress::kPairFrom;
using progress::kPairTo;
using progress::kTierCount;
using progress::kTierNames;
using progress::RunInfo;
using progress::StepSample;

enum class RunState : uint8_t { starting, running, finished, failed };

class RunMetrics final : public progress::StepObserver {
 public:
  explicit RunMetrics(std::optional<uint32_t> rank = std::nullopt, size_t history_limit_steps = 1 << 20);

  void begin(const RunInfo& info) override;
  void record_step(const StepSample& sample) override;
  // The run ended; `error` (when it failed) is shown on the dashboard, and an I/O or checksum
  // failure counts in strata_io_errors_total / strata_checksum_failures_total.
  void finish(const Status& status);

  // Prometheus text exposition format 0.0.4.
  std::string prometheus_text() const;
  // {"run": {...}, "steps": [...]} with the steps after `since_step` — the shape the charts
  // draw, shared with the report (charts.js documents each field).
  nlohmann::ordered_json history_json(uint64_t since_step = 0) const;

 private:
  const std::optional<uint32_t> rank_;
  const size_t history_limit_steps_;
  mutable std::mutex mutex_;
  RunInfo info_;
  RunState state_ = RunState::starting;
  std::string error_text_;
  std::deque<StepSample> history_;
  uint64_t steps_total_ = 0;
  uint64_t committed_step_ = 0;
  std::optional<double> last_eval_loss_;  // the latest evaluation's (strata_eval_loss)
  double stall_seconds_total_ = 0.0;
  double compute_seconds_total_ = 0.0;
  uint64_t transfer_bytes_total_[kPairCount] = {};
  uint64_t io_errors_total_ = 0;
  uint64_t checksum_failures_total_ = 0;
  double start_unix_seconds_ = 0.0;
};

// The step samples of a history in the JSON shape of RUN.json's `steps` entries.
nlohmann::ordered_json step_json(const StepSample& sample);

// The --serve address: common/listen_address.h.
using strata::ListenAddress;
using strata::parse_listen_address;

}  // namespace strata::monitor
