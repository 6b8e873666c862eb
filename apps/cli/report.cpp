// `strata report`: a finished run's charts (the live dashboard's) as one offline HTML file.
#include <spdlog/spdlog.h>

#include "apps/cli/commands.h"
#include "apps/monitor/report.h"

namespace strata::cli {

void add_report_command(CLI::App& app, CliState& state) {
  struct Options {
    std::string run_path;
    std::string out_path = "report.html";
  };
  auto options = std::make_shared<Options>();
  CLI::App* report = app.add_subcommand(
      "report",
      "Write the charts of a finished run (loss, tokens/s, step time against the prediction, stall share, tier "
      "occupancy, bandwidth per tier pair, NVMe bytes written) as one self-contained HTML file, readable offline.");
  report->add_option("run", options->run_path, "the --metrics JSON of `strata train`")->required();
  report->add_option("--out", options->out_path, "the HTML file to write")->capture_default_str();
  report->callback([options, &state] {
    if (failed(monitor::write_report(options->run_path, options->out_path), state)) return;
    spdlog::info("wrote {}", options->out_path);
  });
}

}  // namespace strata::cli
