// strata/apps/cli/commands.h — the `strata` subcommands.
//
// Each command lives in its own file and registers itself on the root CLI11 app. Its
// callback runs after parsing, on the main thread, and stores the process exit code in
// `CliState` (0 success, 1 operating error, 2 bad usage or configuration). Commands print
// results on stdout (exactly one JSON object with --json) and everything else through
// spdlog on stderr.
#pragma once

#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace strata::cli {

struct CliState {
  int exit_code = 0;
};

// Reports an error as one line on stderr and returns the exit code it maps to.
int report_error(const Error& error);
// `text` with every control character written as an escape (\n, \x01): an error quotes what
// it was given (a key, a path, a tensor name), and a newline in a mutated input must not turn
// the one-line error into two.
std::string one_line(std::string_view text);

// True when `status` is an error: reported, and the exit code set. For callbacks that stop at
// the first failure: `if (failed(status, state)) return;`.
inline bool failed(const Status& status, CliState& state) {
  if (status.ok()) return false;
  state.exit_code = report_error(status.error());
  return true;
}
template <typename T>
bool failed(const Result<T>& result, CliState& state) {
  return failed(result.status(), state);
}

// One per command file in apps/cli/; main.cpp calls each.
void add_io_bench_command(CLI::App& app, CliState& state);     // cli/io_bench.cpp
void add_tune_command(CLI::App& app, CliState& state);         // cli/tune.cpp
void add_store_command(CLI::App& app, CliState& state);        // cli/store.cpp
// `strata bench <name>`: registered on the `bench` subcommand main.cpp creates.
void add_bench_adam_command(CLI::App& bench, CliState& state);     // cli/bench_adam.cpp
void add_bench_overlap_command(CLI::App& bench, CliState& state);  // cli/bench_overlap.cpp
void add_train_command(CLI::App& app, CliState& state);        // cli/train.cpp
void add_generate_command(CLI::App& app, CliState& state);     // cli/generate.cpp
void add_plan_command(CLI::App& app, CliState& state);         // cli/plan.cpp
void add_report_command(CLI::App& app, CliState& state);       // cli/report.cpp
void add_tokenize_command(CLI::App& app, CliState& state);     // cli/tokenize.cpp
void add_devices_command(CLI::App& app, CliState& state);      // cli/devices.cpp
void add_chat_command(CLI::App& app, CliState& state);         // cli/chat.cpp
void add_eval_command(CLI::App& app, CliState& state);         // cli/eval.cpp
}  // namespace strata::cli
