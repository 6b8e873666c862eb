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

#include "common/status.h"

namespace strata::monitor {

// Tiers and tier pairs in the order the metrics and the charts list them.
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

enum class RunState : uint8_t { starting, running, finished, failed };

class RunMetrics {
 public:
  explicit RunMetrics(std::optional<uint32_t> rank = std::nullopt, size_t history_limit_steps = 1 << 20);

  void begin(const RunInfo& info);
  void record_step(const StepSample& sample);
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

// "HOST:PORT", ":PORT" or "PORT" → host and port; a missing host is 127.0.0.1 (loopback
// unless an address is given). `what` names the flag in the error (empty: the caller names it).
struct ListenAddress {
  std::string host;
  int port = 0;  // 0: the system picks a free port
};
[[nodiscard]] Result<ListenAddress> parse_listen_address(const std::string& text, const std::string& what);

}  // namespace strata::monitor
