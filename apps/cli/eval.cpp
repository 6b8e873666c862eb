// `strata eval`: the held-out loss of a run's committed weights (train/trainer.h "Evaluation").
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/cli/commands.h"
#include "run/train_config.h"
#include "train/trainer.h"

namespace strata::cli {

void add_eval_command(CLI::App& app, CliState& state) {
  struct Options {
    std::string config_path;
    std::string data_path;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* eval = app.add_subcommand(
      "eval",
      "The held-out loss and perplexity of the weights a run last committed: over the config's eval data "
      "(eval.path or eval.split), or --data FILE in the config's data.format — the same masks as training, every "
      "held-out row once, the weights streamed within the config's budgets. Reads the store, writes nothing.");
  eval->add_option("config", options->config_path, "the run's YAML config")->required();
  eval->add_option("--data", options->data_path, "held-out data in the config's data.format (instead of its eval:)");
  eval->add_flag("--json", options->json, "print the figures as one JSON object on stdout");
  eval->callback([options, &state] {
    Result<TrainConfig> config = load_train_config(options->config_path);
    if (failed(config, state)) return;
    Result<EvalFigures> figures = evaluate(*config, options->data_path);
    if (failed(figures, state)) return;
    if (options->json) {
      fmt::print("{}\n", eval_json(*figures).dump());
      return;
    }
    fmt::print("step {}: eval loss {:.4f}, perplexity {:.3f} over {} trained tokens ({} batches, {:.1f} s)\n",
               figures->step, figures->loss, figures->perplexity, figures->tokens, figures->batches, figures->seconds);
  });
}

}  // namespace strata::cli
