// `strata plan CONFIG`: where a training run's state will live, what each step moves between
// the tiers, and how long a step should take — before anything is written (run/step_model.h).
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include "apps/cli/commands.h"
#include "run/budgets.h"
#include "run/step_model.h"
#include "run/train_config.h"
#include "run/train_plan.h"
#include "train/zero/zero.h"

namespace strata::cli {

void add_plan_command(CLI::App& app, CliState& state) {
  struct Options {
    std::string config_path;
    bool json = false;
    int ranks = 1;  // ZeRO (docs/parallel.md)
  };
  auto options = std::make_shared<Options>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Show where every kind of training state will live, the bytes each tier holds, the bytes each step moves "
      "between tiers, and the step time predicted from the tuned NVMe bandwidths and a compute rate measured "
      "here (each kernel timed alone at the config's shape). Writes nothing.");
  plan->add_option("config", options->config_path, "the YAML config `strata train` would run")->required();
  plan->add_flag("--json", options->json, "print the plan as one JSON object on stdout");
  plan->add_option("--ranks", options->ranks,
                   "ZeRO over N ranks (mpirun -np N): each rank's optimizer share and the bytes it sends and "
                   "receives per step by ZeRO's formula")
      ->check(CLI::Range(1, 4096));
  plan->callback([options, &state] {
    Result<TrainConfig> config = load_train_config(options->config_path);
    if (failed(config, state)) return;
    if (config->batch_size % static_cast<uint32_t>(options->ranks) != 0) {
      state.exit_code = report_error(make_error(
          ErrorKind::invalid_argument, fmt::format("{}: key 'batch_size': {} is the global batch and must be divisible "
                                                   "by --ranks {}", config->source_path, config->batch_size, options->ranks)));
      return;
    }
    ModelLayout layout(config->model);
    TrainPlan run = build_train_plan(*config, layout);
    if (failed(check_budgets(*config, layout, run), state)) return;
    // The kernels are timed on a device of the run's budget, as the run would have it.
    // On the config's device kind where this machine has one (cpu and emulated always; cuda with
    // a GPU); otherwise on the CPU, and the plan says its compute figures are assumed from there.
    Result<device::Kind> config_kind = device::parse_kind(config->device_kind);
    if (failed(config_kind, state)) return;
    const device::Kind kind = *config_kind == device::Kind::cuda && device::cuda_device_count() == 0
                                  ? device::Kind::cpu
                                  : *config_kind;
    // Timing in place of a GPU this box lacks: the CPU device would lock the GPU's whole budget in
    // host memory (an 80 GB budget on a 24 GiB box is an OOM kill). The timing itself needs a
    // unit or two; half of this machine's memory is the most it may take.
    uint64_t timing_bytes = run_budgets(*config, layout).timing_device_bytes;
    if (kind != *config_kind) {
      const auto physical_bytes =
          static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
      timing_bytes = std::min(timing_bytes, physical_bytes / 2);
    }
    Result<std::unique_ptr<device::Device>> device = device::make_device(kind, timing_bytes);
    if (failed(device, state)) return;
    Result<std::unique_ptr<kernels::ComputeBackend>> backend =
        kernels::make_backend(**device, kernels::BatchShape{config->batch_size, config->model.seq_len});
    if (failed(backend, state)) return;
    spdlog::info("timing each kernel alone at {} × {} tokens on the {} backend", config->batch_size,
                 config->model.seq_len, (*backend)->name());
    Result<ComputeRates> rates = measure_compute(*config, layout, **device, **backend);
    if (failed(rates, state)) return;
    const StepPrediction prediction = predict_step(*config, layout, run, *rates);
    if (options->json) {
      auto json = plan_json(*config, layout, run, *rates, prediction);
      if (options->ranks > 1) json["zero"] = zero_plan_json(*config, layout, options->ranks);
      fmt::print("{}\n", json.dump());
    } else {
      fmt::print("{}", format_plan(*config, layout, run, *rates, prediction));
      if (options->ranks > 1) fmt::print("{}", format_zero_plan(*config, layout, options->ranks));
    }
  });
}

}  // namespace strata::cli
