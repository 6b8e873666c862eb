// strata — the command-line entry point: parses the subcommand, sets up logging, runs it.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <exception>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "apps/cli/commands.h"
#include "kernels/compute_threads.h"
#include "strata_build_config.h"

int main(int argc, char** argv) {
  // OpenBLAS chose its kernels before main ran; where it chose pre-AVX2 ones on a CPU that has
  // AVX2 or AVX-512 (kernels/compute_threads.h), run again with the right ones — once: the new
  // image finds OPENBLAS_CORETYPE set. The same PID, arguments and open descriptors.
  if (const strata::kernels::BlasCoreAdvice blas = strata::kernels::blas_core_advice(); blas.better != nullptr) {
    if (setenv("OPENBLAS_CORETYPE", blas.better, 1) == 0) execv("/proc/self/exe", argv);
    std::fprintf(stderr, "[W] OpenBLAS runs its %s kernels where this CPU takes its %s ones (could not re-execute: %s); "
                 "set OPENBLAS_CORETYPE=%s for GEMMs about twice as fast\n",
                 blas.picked.c_str(), blas.better, std::strerror(errno), blas.better);
  }

  CLI::App app{
      "strata — keeps a model's training state across VRAM, pinned host RAM and NVMe, and\n"
      "streams each shard to where it is needed just before it is needed."};
  app.set_version_flag("--version", STRATA_VERSION);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, std::string("log verbosity: ") + strata::kLogLevels)
      ->capture_default_str();

  // STRATA_THREADS caps the kernels' threads for the whole process (kernels/compute_threads.h).
  strata::Result<std::unique_ptr<strata::kernels::ComputeThreadLimit>> thread_limit =
      strata::kernels::limit_compute_threads_from_env();
  if (!thread_limit.ok()) {
    (void)strata::set_log_level("info");  // strata's one-line format for this one error
    return strata::cli::report_error(thread_limit.error());
  }

  strata::cli::CliState state;
  app.parse_complete_callback([&] {
    strata::Status status = strata::set_log_level(log_level);
    if (!status.ok()) throw CLI::ValidationError("--log-level", status.error().message);
  });



  CLI::App* bench = app.add_subcommand(
      "bench", "synthetic benchmarks of strata's parts (each compares against a reference in the same run)");
  bench->require_subcommand(1);
  // commands (one line each, in the order `strata --help` lists them)
  strata::cli::add_train_command(app, state);
  strata::cli::add_eval_command(app, state);
  strata::cli::add_generate_command(app, state);
  strata::cli::add_plan_command(app, state);
  strata::cli::add_report_command(app, state);
  strata::cli::add_tokenize_command(app, state);
  strata::cli::add_chat_command(app, state);
  strata::cli::add_tune_command(app, state);
  strata::cli::add_io_bench_command(app, state);
  strata::cli::add_store_command(app, state);
  strata::cli::add_devices_command(app, state);
  strata::cli::add_bench_overlap_command(*bench, state);
  strata::cli::add_bench_adam_command(*bench, state);
  // The last resort: every error is meant to come back as a Status, but an exception that
  // escapes anyway (a library's, a bad_alloc) still ends as one line and exit 1, never as
  // std::terminate's abort and core dump.
  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const std::exception& e) {
    spdlog::error("internal error (please report it): {}", strata::cli::one_line(e.what()));
    return 1;
  } catch (...) {
    spdlog::error("internal error (please report it): an unknown exception");
    return 1;
  }
  return state.exit_code;
}
