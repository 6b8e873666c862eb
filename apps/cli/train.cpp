// `strata train`: the main job (`strata generate` is in cli/generate.cpp).
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "common/size.h"
#include "apps/cli/commands.h"
#include "apps/monitor/monitor.h"
#include "apps/monitor/server.h"
#include "run/train_config.h"
#include "generate/generate.h"
#include "run/run_store.h"
#include "train/trainer.h"

namespace strata::cli {

namespace {

void print_sample(const TrainConfig& config, CliState& state) {
  Result<std::string> sample = generate(config, config.sample_prompt, config.sample_tokens, 0.8, config.model.seed);
  if (!sample.ok()) {
    state.exit_code = report_error(sample.error());
    return;
  }
  fmt::print(stderr, "\nsample from the trained model (temperature 0.8):\n{}{}\n", config.sample_prompt, *sample);
}

}  // namespace

void add_train_command(CLI::App& app, CliState& state) {
  struct Options {
    std::string config_path;
    std::string serve;  // overrides the config's monitor.serve
    std::string export_merged;  // an adapter run's base with its adapters folded in
    TrainOptions train;
  };
  auto options = std::make_shared<Options>();
  CLI::App* train = app.add_subcommand(
      "train",
      "Train or fine-tune a model (GPT-2, the Llama family: Llama, Mistral, Qwen 2, Phi-3, or Gemma) on text or on "
      "completion/chat examples, its parameters, gradients and optimizer state living across the device, "
      "pinned host memory and the NVMe store, as the config's budgets and placement say. Commits the store every "
      "checkpoint_every steps; --resume continues from the last commit.");
  train->add_option("config", options->config_path, "the YAML config (see configs/demo.yaml)")->required();
  train->add_option("--steps", options->train.steps, "train up to this step in total (default: the config's steps)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--resume", options->train.resume, "continue from the last step committed in the store");
  train->add_option("--trace", options->train.trace_path, "write a Chrome/Perfetto timeline of I/O, copies and compute");
  train->add_option("--metrics", options->train.metrics_path, "write per-step figures and the summary as JSON");
  train->add_option("--export", options->train.export_path,
                    "write the final fp32 weights: FILE.safetensors, or any other path a Hugging Face folder");
  train->add_option("--export-merged", options->export_merged,
                    "an adapter run (adapter:): write the base with the adapters folded in (W + scale·B·A), as "
                    "--export writes weights: FILE.safetensors, or any other path a Hugging Face folder");
  auto shard_size = std::make_shared<std::string>("5000000000");
  train->add_option("--shard-size", *shard_size, "an exported folder's largest shard (bytes or binary units)")
      ->capture_default_str();
  train->add_flag("--json", options->train.json, "print the summary as one JSON object on stdout");
  train->add_option("--serve", options->serve,
                    "serve Prometheus /metrics and a live dashboard at HOST:PORT (:PORT or PORT: 127.0.0.1; port 0 "
                    "picks a free one); overrides the config's monitor.serve");
  train->callback([options, shard_size, &state] {
    Result<uint64_t> shard_bytes = parse_size(*shard_size);
    if (!shard_bytes.ok()) {
      state.exit_code = report_error(make_error(ErrorKind::invalid_argument, "--shard-size: " + shard_bytes.error().message));
      return;
    }
    options->train.export_shard_size_bytes = *shard_bytes;
    Result<TrainConfig> config = load_train_config(options->config_path);
    // Every rank of a ZeRO job reads the same file and meets the same error: rank 0 says it.
    const bool mpi_rank = comm::launched_by_mpirun();
    if (!config.ok() && mpi_rank && comm::launched_rank() != 0) {
      state.exit_code = config.error().kind == ErrorKind::invalid_argument ? 2 : 1;
      return;
    }
    if (failed(config, state)) return;
    if (!options->export_merged.empty() && !config->model.adapter.enabled) {
      // Said before any work: a merged export needs adapters to merge.
      state.exit_code = report_error(make_error(
          ErrorKind::invalid_argument, fmt::format("--export-merged: {} has no adapter: section, so there are no "
                                                   "adapters to merge; --export writes its weights",
                                                   options->config_path)));
      return;
    }
    // The server binds before any training work, so a port in use stops the run at once. In a
    // ZeRO job rank 0 publishes (labelled rank="0"); the others run without one.
    const std::string serve = options->serve.empty() ? config->monitor_serve : options->serve;
    monitor::RunMetrics metrics(mpi_rank ? std::optional<uint32_t>(comm::launched_rank()) : std::nullopt);
    std::unique_ptr<monitor::MonitorServer> server;
    if (!serve.empty() && (!mpi_rank || comm::launched_rank() == 0)) {
      Result<monitor::ListenAddress> address = monitor::parse_listen_address(serve, "--serve");
      if (failed(address, state)) return;
      Result<std::unique_ptr<monitor::MonitorServer>> started = monitor::MonitorServer::start(*address, metrics);
      if (failed(started, state)) return;
      server = std::move(*started);
      spdlog::info("serving metrics at {}metrics and the dashboard at {}", server->url(), server->url());
      options->train.monitor = &metrics;
    }
    options->train.use_mpi = comm::launched_by_mpirun();  // a rank of `mpirun -np N` (docs/parallel.md)
    Result<TrainSummary> summary = strata::train(*config, options->train);
    metrics.finish(summary.status());
    if (failed(summary, state)) return;
    const TrainSummary& s = *summary;
    if (s.rank != 0) return;  // rank 0 speaks for a ZeRO job
    if (!options->export_merged.empty()) {
      // After the run's last commit (and its --export), from every rank's store.
      std::vector<std::string> dirs;
      for (int r = 0; r < std::max(s.ranks, 1); ++r) dirs.push_back(store_dir_for(*config, r));
      Status merged = export_merged_weights(dirs, options->export_merged, options->train.export_shard_size_bytes);
      if (!merged.ok()) {
        state.exit_code = report_error(merged.error());
        return;
      }
    }
    if (options->train.json) {
      nlohmann::ordered_json json = summary_json(s);
      fmt::print("{}\n", json.dump());
    } else if (s.last_step > s.first_step) {
      fmt::print(stderr,
                 "trained steps {}..{} in {:.1f} s: loss {:.4f} → {:.4f}, {:.0f} tokens/s, stall {:.1f}% | NVMe read "
                 "{} written {} | device peak {} host peak {}\n",
                 s.first_step + 1, s.last_step, s.seconds, s.first_loss, s.last_loss, s.tokens_per_s,
                 100.0 * s.stall_seconds / s.seconds, format_size(s.bytes_read_nvme), format_size(s.bytes_written_nvme),
                 format_size(s.device_high_water_bytes), format_size(s.host_high_water_bytes));
      if (s.predicted_step_seconds > 0)
        fmt::print(stderr, "step time: predicted {:.2f} s, measured {:.2f} s (median of {}; measured/predicted {:.2f})\n",
                   s.predicted_step_seconds, s.median_step_seconds, s.last_step - s.first_step,
                   s.median_step_seconds / s.predicted_step_seconds);
      if (!s.evaluations.empty())
        fmt::print(stderr, "eval loss {:.4f} (perplexity {:.3f}) at step {}{}\n", s.evaluations.back().loss,
                   s.evaluations.back().perplexity, s.evaluations.back().step,
                   s.best_eval_loss ? fmt::format("; best {:.4f}, its weights in {}/best", *s.best_eval_loss,
                                                  store_dir_for(*config))
                                    : std::string());
      if (s.ranks > 1) {
        const auto steps = static_cast<double>(s.last_step - s.first_step);
        fmt::print(stderr, "ZeRO over {} ranks (rank 0): sent {} received {} per step (ZeRO's formula {}), {:.3f} s "
                           "per step in collectives\n",
                   s.ranks, format_size(static_cast<uint64_t>(static_cast<double>(s.comm_sent_bytes) / steps)),
                   format_size(static_cast<uint64_t>(static_cast<double>(s.comm_received_bytes) / steps)),
                   format_size(s.comm_formula_bytes_per_step), s.comm_seconds / steps);
      }
    }
    if (config->sample_tokens > 0 && !options->train.json) print_sample(*config, state);
  });
}

}  // namespace strata::cli
