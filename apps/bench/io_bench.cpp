// strata/apps/bench/io_bench.cpp — `strata io-bench`: sequential direct I/O through
// strata's own engine, so its figures are the ones training will see (apps/bench/sequential_bench.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "apps/cli/commands.h"
#include "apps/bench/sequential_bench.h"

namespace strata::cli {
namespace {

struct IoBenchOptions {
  std::vector<std::string> files;
  std::string size = "1GiB";
  std::string rw = "read";
  std::string engine = "uring";
  std::string block_size = "1MiB";
  uint32_t queue_depth = 32;
  uint32_t threads = 1;
  double seconds = 0;
  bool json = false;
  std::string stripe_size = "1MiB";
  bool sqpoll = false;
  bool iopoll = false;
  bool no_register = false;
  bool no_huge_pages = false;
};

Result<io::SequentialBenchOptions> to_bench_options(const IoBenchOptions& cli) {
  io::SequentialBenchOptions options;
  options.paths = cli.files;
  Result<uint64_t> size = parse_size(cli.size);
  if (!size.ok()) return size.error();
  options.size_bytes = *size;
  Result<uint64_t> block = parse_size(cli.block_size);
  if (!block.ok()) return block.error();
  Result<uint64_t> stripe = parse_size(cli.stripe_size);
  if (!stripe.ok()) return stripe.error();
  options.stripe_bytes = *stripe;
  Result<io::Backend> backend = io::parse_backend(cli.engine);
  if (!backend.ok()) return backend.error();
  options.op = cli.rw == "read" ? io::Op::read : io::Op::write;
  options.engine.backend = *backend;
  options.engine.block_size_bytes = *block;
  options.engine.queue_depth = cli.queue_depth;
  options.engine.sqpoll = cli.sqpoll;
  options.engine.iopoll = cli.iopoll;
  options.threads = cli.threads;
  options.seconds = cli.seconds;
  options.register_buffers = !cli.no_register;
  options.huge_pages = !cli.no_huge_pages;
  return options;
}

int run_io_bench(const IoBenchOptions& cli) {
  Result<io::SequentialBenchOptions> options = to_bench_options(cli);
  if (!options.ok()) return report_error(options.error());
  Result<io::SequentialBenchResult> result = io::run_sequential_bench(*options);
  if (!result.ok()) return report_error(result.error());
  const io::SequentialBenchResult& r = *result;
  const std::string buffers =
      fmt::format("{}page-aligned region of {} allocated once{}{}", r.buffers_locked ? "mlocked, " : "",
                  format_size(r.buffer_region_bytes),
                  r.huge_page_bytes > 0 ? fmt::format(" ({} in transparent huge pages)", format_size(r.huge_page_bytes))
                                        : " (4 KiB pages)",
                  r.buffers_registered ? ", registered with io_uring (fixed buffers)" : "");
  if (cli.json) {
    nlohmann::json out = {
        {"engine", cli.engine},
        {"rw", cli.rw},
        {"block_size", options->engine.block_size_bytes},
        {"queue_depth", options->engine.queue_depth},
        {"threads", options->threads},
        {"bytes", r.bytes},
        {"seconds", r.seconds},
        {"MBps", r.MBps},
        {"direct", r.direct},
        {"buffers", buffers},
        {"fixed_buffer_ops", r.fixed_buffer_ops},
        {"verified_blocks", r.verified_blocks},
    };
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("io-bench: sequential %s of %s, %s\n", cli.rw.c_str(), r.volume_description.c_str(),
              r.direct ? fmt::format("O_DIRECT (alignment {} bytes)", r.alignment_bytes).c_str()
                       : "buffered (the filesystem refused O_DIRECT)");
  std::printf("  engine:  %u x %s\n", options->threads, r.engine_description.c_str());
  std::printf("  buffers: %s\n", buffers.c_str());
  std::printf("  moved %s in %.3f s = %.1f MB/s (%.1f MiB/s)\n", format_size(r.bytes).c_str(),
              r.seconds, r.MBps, r.MBps * 1e6 / kMiB);
  std::printf("  data check after the run: %llu block(s) verified%s\n",
              static_cast<unsigned long long>(r.verified_blocks),
              r.fixed_buffer_ops > 0 ? fmt::format(", {} fixed-buffer ops", r.fixed_buffer_ops).c_str() : "");
  return 0;
}

}  // namespace

void add_io_bench_command(CLI::App& app, CliState& state) {
  auto options = std::make_shared<IoBenchOptions>();
  CLI::App* command = app.add_subcommand(
      "io-bench",
      "Sequential direct I/O through strata's own engine (the path training uses); MB/s = 1e6 bytes/s.\n"
      "For reads the file is created or extended and stamped first (once); the data are checked\n"
      "after the timed window.");
  command->add_option("--file", options->files, "file to use; give it several times to stripe")
      ->required();
  command->add_option("--size", options->size, std::string("bytes the run covers: ") + kSizeFormsHelp)
      ->capture_default_str();
  command->add_option("--rw", options->rw, "direction")
      ->check(CLI::IsMember({"read", "write"}))
      ->capture_default_str();
  command->add_option("--engine", options->engine, "I/O engine")
      ->check(CLI::IsMember({"uring", "aio", "psync"}))
      ->capture_default_str();
  command->add_option("--block-size", options->block_size, "bytes per request (a multiple of 4KiB)")
      ->capture_default_str();
  command->add_option("--queue-depth", options->queue_depth, "requests in flight per engine")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_option("--threads", options->threads, "engines, each on its own thread over its own slice")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  command->add_option("--seconds", options->seconds, "run this long, wrapping around (0: one pass over --size)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  command->add_option("--stripe-size", options->stripe_size, "stripe size with several --file")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print exactly one JSON object on stdout");
  command->add_flag("--sqpoll", options->sqpoll, "uring: ask for a kernel submission thread");
  command->add_flag("--iopoll", options->iopoll, "uring: ask for polled completions");
  command->add_flag("--no-register", options->no_register, "uring: do not register the buffers");
  command->add_flag("--no-huge-pages", options->no_huge_pages,
                    "do not ask for transparent huge pages for the buffers (4 KiB pages, like fio's iomem=mmap)");
  command->callback([options, &state] { state.exit_code = run_io_bench(*options); });
}

}  // namespace strata::cli
