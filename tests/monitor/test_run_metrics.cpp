// tests/monitor/test_run_metrics.cpp — the monitor's pieces without a run or a browser: the
// listen address parser (loopback by default, bad ports refused), the exposition (HELP/TYPE
// per family, counters summed from the per-step deltas, the rank label on every sample), the
// history's `since` filter and its thinning when full, and RUN.json checks for `strata report`.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "apps/monitor/monitor.h"
#include "apps/monitor/report.h"

namespace strata::monitor {
namespace {

StepSample sample(uint64_t step, uint64_t read_bytes) {
  StepSample s;
  s.step = step;
  s.loss = 5.0 - 0.1 * static_cast<double>(step);
  s.seconds = 0.5;
  s.stall_seconds = 0.125;
  s.transfer_bytes[0] = read_bytes;  // nvme → host
  s.transfer_bytes[3] = 7;           // host → nvme
  s.tier_bytes[1] = 1000 + step;
  s.learning_rate = 0.25 * static_cast<double>(step);  // a schedule's warmup
  return s;
}

// The value of one sample line `name{labels} value`, or -1 when absent.
double value_of(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(ListenAddress, DefaultsToLoopbackAndRefusesBadPorts) {
  Result<ListenAddress> a = parse_listen_address("9464", "--serve");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9464);
  a = parse_listen_address(":0", "--serve");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 0);
  a = parse_listen_address("0.0.0.0:80", "--serve");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "0.0.0.0");
  a = parse_listen_address("[::1]:8080", "--serve");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 8080);
  for (const char* bad : {"", "host:", "localhost:http", "1:65536", "1:-1", "1:123456"}) {
    Result<ListenAddress> r = parse_listen_address(bad, "--serve");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument);
    EXPECT_NE(r.error().message.find("--serve"), std::string::npos);
  }
}

TEST(RunMetrics, CountersSumTheStepDeltasAndGaugesShowTheLastStep) {
  RunMetrics metrics;
  RunInfo info;
  info.total_steps = 10;
  info.tokens_per_step = 100;
  info.budget_bytes[1] = 4096;
  metrics.begin(info);
  metrics.record_step(sample(1, 300));
  metrics.record_step(sample(2, 500));
  const std::string text = "\n" + metrics.prometheus_text();
  EXPECT_EQ(value_of(text, "strata_step"), 2);
  EXPECT_EQ(value_of(text, "strata_nvme_read_bytes_total"), 800);
  EXPECT_EQ(value_of(text, "strata_nvme_write_bytes_total"), 14);
  EXPECT_EQ(value_of(text, "strata_transfer_bytes_total{from=\"nvme\",to=\"host\"}"), 800);
  EXPECT_EQ(value_of(text, "strata_tokens_per_second"), 200);
  EXPECT_EQ(value_of(text, "strata_stall_ratio"), 0.25);
  EXPECT_EQ(value_of(text, "strata_tier_bytes{tier=\"host\"}"), 1002);
  EXPECT_EQ(value_of(text, "strata_learning_rate"), 0.5);  // the last step's
  EXPECT_EQ(value_of(text, "strata_tier_budget_bytes{tier=\"host\"}"), 4096);
  EXPECT_EQ(value_of(text, "strata_run_state{state=\"running\"}"), 1);
  EXPECT_NE(text.find("# TYPE strata_nvme_write_bytes_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# HELP strata_loss "), std::string::npos);
  metrics.finish(make_error(ErrorKind::corrupt, "checksum mismatch"));
  const std::string after = "\n" + metrics.prometheus_text();
  EXPECT_EQ(value_of(after, "strata_checksum_failures_total"), 1);
  EXPECT_EQ(value_of(after, "strata_io_errors_total"), 0);
  EXPECT_EQ(value_of(after, "strata_run_state{state=\"failed\"}"), 1);
  EXPECT_EQ(metrics.history_json()["run"]["error"], "checksum mismatch");
}

TEST(RunMetrics, RankLabelsEverySample) {
  RunMetrics metrics(3);
  metrics.begin(RunInfo{});
  metrics.record_step(sample(1, 1));
  const std::string text = metrics.prometheus_text();
  size_t samples = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    ++samples;
    EXPECT_NE(line.find("{rank=\"3\""), std::string::npos) << line;
  }
  EXPECT_GT(samples, 20u);
}

TEST(RunMetrics, HistorySinceAndThinning) {
  RunMetrics metrics(std::nullopt, 8);
  metrics.begin(RunInfo{});
  for (uint64_t step = 1; step <= 20; ++step) metrics.record_step(sample(step, 1));
  nlohmann::ordered_json all = metrics.history_json();
  const auto& steps = all["steps"];
  ASSERT_LE(steps.size(), 8u);
  EXPECT_EQ(steps.back()["step"], 20);  // the newest step is always kept
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_LT(steps[i - 1]["step"], steps[i]["step"]);
  nlohmann::ordered_json later = metrics.history_json(18);
  ASSERT_EQ(later["steps"].size(), 2u);
  EXPECT_EQ(later["steps"][0]["step"], 19);
  // Counters keep every step even when the history thins.
  EXPECT_EQ(value_of("\n" + metrics.prometheus_text(), "strata_steps_total"), 20);
}

// Issue 30: the held-out loss — NaN until the first evaluation, then the latest one, which later
// steps without an evaluation keep; only evaluated steps carry eval_loss in the history.
TEST(RunMetrics, EvalLossIsTheLatestEvaluation) {
  RunMetrics metrics;
  metrics.begin(RunInfo{});
  metrics.record_step(sample(1, 1));
  EXPECT_TRUE(std::isnan(value_of("\n" + metrics.prometheus_text(), "strata_eval_loss")));
  StepSample evaluated = sample(2, 1);
  evaluated.eval_loss = 1.5;
  metrics.record_step(evaluated);
  metrics.record_step(sample(3, 1));
  EXPECT_EQ(value_of("\n" + metrics.prometheus_text(), "strata_eval_loss"), 1.5);
  const nlohmann::ordered_json history = metrics.history_json();
  EXPECT_FALSE(history["steps"][0].contains("eval_loss"));
  EXPECT_EQ(history["steps"][1]["eval_loss"], 1.5);
  EXPECT_FALSE(history["steps"][2].contains("eval_loss"));
}

TEST(Report, RunJsonIsChecked) {
  using json = nlohmann::ordered_json;
  EXPECT_FALSE(history_from_run_json(json::array(), "r.json").ok());
  EXPECT_FALSE(history_from_run_json(json{{"steps", json::array()}}, "r.json").ok());
  Result<json> bad = history_from_run_json(json{{"steps", {{{"step", 1}, {"seconds", 1.0}}}}}, "r.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'loss'"), std::string::npos);
  EXPECT_NE(bad.error().message.find("r.json"), std::string::npos);
  Result<json> good = history_from_run_json(
      json{{"config", "c.yaml"},
           {"tokens_per_step", 64},
           {"steps", {{{"step", 1}, {"loss", 5.5}, {"seconds", 0.5}}}},
           {"summary", {{"last_step", 1}, {"predicted_step_seconds", 0.4}}}},
      "r.json");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ((*good)["run"]["total_steps"], 1);
  EXPECT_EQ((*good)["run"]["predicted_step_seconds"], 0.4);
  EXPECT_EQ((*good)["steps"][0]["loss"], 5.5);
}

}  // namespace
}  // namespace strata::monitor
