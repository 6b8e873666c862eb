// strata/apps/bench/tune.cpp — `strata tune`: measures the drive behind a folder with
// strata's own I/O path, sweeping engine × block size × queue depth × threads for reads and
// for writes, and writes the `io:` section (io/io_config.h) that later commands load as is,
// plus an SVG chart of the sweep.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "apps/cli/commands.h"
#include "io/io_config.h"
#include "apps/bench/sequential_bench.h"

namespace strata::cli {
namespace {

struct TuneOptions {
  std::string dir;
  std::string size = "1GiB";
  std::string out;
  std::string plot;
  double point_seconds = 0.6;
  std::vector<std::string> engines;  // empty: every engine this build and kernel have
  std::vector<std::string> block_sizes = {"256KiB", "1MiB", "4MiB"};
  std::vector<uint32_t> queue_depths = {1, 8, 32};
  std::vector<uint32_t> threads = {1, 2};
  bool keep_file = false;
};

struct Point {
  io::Op op;
  io::Backend engine;
  uint64_t block_size_bytes;
  uint32_t queue_depth;
  uint32_t threads;
  double MBps = 0;
};

std::string short_size(uint64_t bytes) {
  if (bytes % kMiB == 0) return fmt::format("{}MiB", bytes / kMiB);
  if (bytes % kKiB == 0) return fmt::format("{}KiB", bytes / kKiB);
  return std::to_string(bytes);
}

// Within 2% of the fastest counts as a tie on a drive this noisy; among ties the simplest
// setting wins (fewer threads, then shallower queue, then smaller blocks), since it costs
// less pinned memory and fewer threads for the same bandwidth.
const Point& pick_best(const std::vector<Point>& points, io::Op op) {
  double fastest = 0;
  for (const Point& p : points)
    if (p.op == op) fastest = std::max(fastest, p.MBps);
  const Point* best = nullptr;
  for (const Point& p : points) {
    if (p.op != op || p.MBps < fastest * 0.98) continue;
    auto key = [](const Point& x) { return std::tuple(x.threads, x.queue_depth, x.block_size_bytes); };
    if (best == nullptr || key(p) < key(*best)) best = &p;
  }
  return *best;
}

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// One panel per direction: groups of bars per (block size, queue depth), one bar per
// (engine, threads) series; the chosen point is outlined.
std::string draw_svg(const std::vector<Point>& points, const Point& best_read, const Point& best_write,
                     const std::string& title) {
  std::vector<std::pair<io::Backend, uint32_t>> series;
  std::vector<std::pair<uint64_t, uint32_t>> groups;
  for (const Point& p : points) {
    if (std::find(series.begin(), series.end(), std::pair{p.engine, p.threads}) == series.end())
      series.emplace_back(p.engine, p.threads);
    if (std::find(groups.begin(), groups.end(), std::pair{p.block_size_bytes, p.queue_depth}) == groups.end())
      groups.emplace_back(p.block_size_bytes, p.queue_depth);
  }
  const char* colors[] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d",
                          "#e15759", "#ff9d9a", "#b07aa1", "#d4a6c8"};
  const double bar_w = 10, group_gap = 14, left = 70, panel_h = 260, top = 60;
  const double group_w = series.size() * bar_w + group_gap;
  const double plot_w = std::max(400.0, groups.size() * group_w);
  const double width = left + plot_w + 200;
  const double height = top + 2 * (panel_h + 90) + 20;
  double max_MBps = 1;
  for (const Point& p : points) max_MBps = std::max(max_MBps, p.MBps);
  double tick = 1;
  while (max_MBps / tick > 8) tick *= (std::to_string(static_cast<long>(tick))[0] == '2') ? 2.5 : 2;
  const double y_max = std::ceil(max_MBps / tick) * tick;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"24\" font-size=\"15\">{}</text>\n",
      width, height, left, svg_escape(title));
  for (int panel = 0; panel < 2; ++panel) {
    const io::Op op = panel == 0 ? io::Op::read : io::Op::write;
    const Point& best = panel == 0 ? best_read : best_write;
    const double y0 = top + panel * (panel_h + 90);  // top of the panel
    const double base = y0 + panel_h;                // the zero line
    svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"13\" font-weight=\"bold\">{} (MB/s, 1e6 bytes/s)</text>\n",
                       left, y0 - 8, panel == 0 ? "sequential reads" : "sequential writes");
    for (double v = 0; v <= y_max + 1e-9; v += tick) {
      const double y = base - v / y_max * panel_h;
      svg += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                         "<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
                         left, y, left + plot_w, y, left - 6, y + 4, v);
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const double gx = left + g * group_w + group_gap / 2;
      for (size_t s = 0; s < series.size(); ++s) {
        for (const Point& p : points) {
          if (p.op != op || p.engine != series[s].first || p.threads != series[s].second ||
              p.block_size_bytes != groups[g].first || p.queue_depth != groups[g].second)
            continue;
          const double h = p.MBps / y_max * panel_h;
          const bool chosen = &p == &best;
          svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.1f}\" fill=\"{}\"{}>"
                             "<title>{} {} bs {} qd {} threads {}: {:.1f} MB/s</title></rect>\n",
                             gx + s * bar_w, base - h, bar_w - 1, h, colors[s % 10],
                             chosen ? " stroke=\"black\" stroke-width=\"2\"" : "",
                             op == io::Op::read ? "read" : "write", io::backend_name(p.engine),
                             short_size(p.block_size_bytes), p.queue_depth, p.threads, p.MBps);
        }
      }
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>"
                         "<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">qd {}</text>\n",
                         gx + series.size() * bar_w / 2, base + 14, short_size(groups[g].first),
                         gx + series.size() * bar_w / 2, base + 27, groups[g].second);
    }
    svg += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n",
                       left, base, left + plot_w, base);
    svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">chosen (outlined): {} bs {} qd {} threads {} = {:.1f} MB/s</text>\n",
                       left, base + 48, io::backend_name(best.engine), short_size(best.block_size_bytes),
                       best.queue_depth, best.threads, best.MBps);
  }
  for (size_t s = 0; s < series.size(); ++s) {
    const double y = top + s * 18;
    svg += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.0f}\">{}, {} thread{}</text>\n",
                       left + plot_w + 20, y, colors[s % 10], left + plot_w + 38, y + 10,
                       io::backend_name(series[s].first), series[s].second, series[s].second > 1 ? "s" : "");
  }
  svg += "</svg>\n";
  return svg;
}

int run_tune(const TuneOptions& options) {
  namespace fs = std::filesystem;
  Result<uint64_t> size = parse_size(options.size);
  if (!size.ok()) return report_error(size.error());
  std::vector<uint64_t> block_sizes;
  for (const std::string& text : options.block_sizes) {
    Result<uint64_t> block = parse_size(text);
    if (!block.ok()) return report_error(block.error());
    block_sizes.push_back(*block);
  }
  std::vector<io::Backend> engines;
  if (options.engines.empty()) {
    engines = io::available_backends();
  } else {
    for (const std::string& name : options.engines) {
      Result<io::Backend> backend = io::parse_backend(name);
      if (!backend.ok()) return report_error(backend.error());
      engines.push_back(*backend);
    }
  }
  const uint32_t max_threads = *std::max_element(options.threads.begin(), options.threads.end());
  const uint64_t max_block = *std::max_element(block_sizes.begin(), block_sizes.end());
  if (*size < max_block * max_threads)
    return report_error(make_error(ErrorKind::invalid_argument,
                                   fmt::format("--size {} is smaller than the largest block size × "
                                               "threads ({}); accepted: at least that",
                                               format_size(*size), format_size(max_block * max_threads))));

  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return report_error(make_errno_error(ec.value(), "create folder", options.dir));
  const std::string data_path = (fs::path(options.dir) / "strata-tune.data").string();
  const std::string out_path = options.out.empty() ? (fs::path(options.dir) / "strata-io.yaml").string() : options.out;

  // Refuse before any work when the folder cannot hold the test file.
  struct statvfs vfs {};
  if (::statvfs(options.dir.c_str(), &vfs) != 0) return report_error(make_errno_error(errno, "statvfs", options.dir));
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t existing = fs::exists(data_path, ec) ? fs::file_size(data_path, ec) : 0;
  const uint64_t needed = *size > existing ? *size - existing : 0;
  const uint64_t margin = 64 * kMiB;
  if (needed + margin > free_bytes) {
    Error error = make_error(ErrorKind::no_space,
                             fmt::format("{} has {} free; tune needs {} for its test file plus {} "
                                         "to spare ({} bytes in all). Free some space or pass a smaller --size",
                                         options.dir, format_size(free_bytes), format_size(needed),
                                         format_size(margin), needed + margin));
    return report_error(error);
  }

  io::SequentialBenchOptions base;
  base.paths = {data_path};
  base.size_bytes = *size;
  base.seconds = options.point_seconds;
  bool wrote_stamp = false;
  spdlog::info("tune: preparing {} of test data in {}", format_size(*size), data_path);
  if (Status prepared = io::prepare_bench_volume(base, true, &wrote_stamp); !prepared.ok())
    return report_error(prepared.error());

  std::vector<Point> points;
  for (io::Op op : {io::Op::read, io::Op::write})
    for (io::Backend engine : engines)
      for (uint64_t block : block_sizes)
        for (uint32_t depth : options.queue_depths)
          for (uint32_t threads : options.threads) points.push_back(Point{op, engine, block, depth, threads});
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto started = std::chrono::steady_clock::now();
  spdlog::info("tune: {} points of {:.2f} s each (reads first, then writes)", points.size(), options.point_seconds);
  for (size_t i = 0; i < points.size(); ++i) {
    Point& p = points[i];
    io::SequentialBenchOptions run = base;
    run.op = p.op;
    run.engine.backend = p.engine;
    run.engine.block_size_bytes = p.block_size_bytes;
    run.engine.queue_depth = p.queue_depth;
    run.threads = p.threads;
    Result<io::SequentialBenchResult> result = io::run_sequential_bench(run);
    if (!result.ok()) {
      if (tty) std::fputs("\n", stderr);
      return report_error(result.error());
    }
    p.MBps = result->MBps;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "%s[%3zu/%zu] %-5s %-5s bs %-6s qd %-3u threads %u: %8.1f MB/s  (%.0f s)%s",
                 tty ? "\r" : "", i + 1, points.size(), io::op_name(p.op), io::backend_name(p.engine),
                 short_size(p.block_size_bytes).c_str(), p.queue_depth, p.threads, p.MBps, elapsed,
                 tty ? "   " : "\n");
    std::fflush(stderr);
  }
  if (tty) std::fputs("\n", stderr);
  if (!options.keep_file) fs::remove(data_path, ec);

  const Point& best_read = pick_best(points, io::Op::read);
  const Point& best_write = pick_best(points, io::Op::write);
  std::printf("%-5s  %-5s  %-7s  %5s  %7s  %10s\n", "rw", "engine", "block", "qd", "threads", "MB/s");
  for (const Point& p : points) {
    const bool chosen = &p == &best_read || &p == &best_write;
    std::printf("%-5s  %-6s %-7s  %5u  %7u  %10.1f%s\n", io::op_name(p.op), io::backend_name(p.engine),
                short_size(p.block_size_bytes).c_str(), p.queue_depth, p.threads, p.MBps,
                chosen ? "  <- chosen" : "");
  }

  io::IoSettings settings;
  for (const auto& [direction, best] : {std::pair{&settings.read, &best_read}, std::pair{&settings.write, &best_write}}) {
    direction->engine = best->engine;
    direction->block_size_bytes = best->block_size_bytes;
    direction->queue_depth = best->queue_depth;
    direction->threads = best->threads;
    direction->measured_MBps = best->MBps;
  }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string comment = fmt::format(
      "written by `strata tune --dir {}` on {}: {} points of {:.2f} s over {};\n"
      "the fastest setting per direction (within 2%, the simplest). Load it as strata's io: section.",
      options.dir, date, points.size(), options.point_seconds, format_size(*size));
  const std::string yaml = io::format_io_settings_yaml(settings, comment);
  std::ofstream(out_path) << yaml;
  Result<io::IoSettings> reloaded = io::load_io_settings_file(out_path);
  if (!reloaded.ok()) return report_error(reloaded.error());  // would be a bug in the writer
  std::printf("\nread:  %s, block %s, queue depth %u, %u thread(s): %.1f MB/s\n", io::backend_name(best_read.engine),
              short_size(best_read.block_size_bytes).c_str(), best_read.queue_depth, best_read.threads, best_read.MBps);
  std::printf("write: %s, block %s, queue depth %u, %u thread(s): %.1f MB/s\n", io::backend_name(best_write.engine),
              short_size(best_write.block_size_bytes).c_str(), best_write.queue_depth, best_write.threads,
              best_write.MBps);
  std::printf("wrote %s\n", out_path.c_str());
  if (!options.plot.empty()) {
    std::ofstream(options.plot) << draw_svg(points, best_read, best_write,
                                            fmt::format("strata tune: {} ({}), {}", options.dir, format_size(*size), date));
    std::printf("wrote %s\n", options.plot.c_str());
  }
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app, CliState& state) {
  auto options = std::make_shared<TuneOptions>();
  CLI::App* command = app.add_subcommand(
      "tune",
      "Measure the drive behind --dir with strata's own I/O path: sweep engine x block size x queue\n"
      "depth x threads for reads and for writes, print the table, and write the io: section\n"
      "(default DIR/strata-io.yaml) with the best setting per direction. Defaults take about 2 minutes.");
  command->add_option("--dir", options->dir, "folder on the drive to measure (a test file is made there)")
      ->required();
  command->add_option("--size", options->size, std::string("test file size: ") + kSizeFormsHelp)
      ->capture_default_str();
  command->add_option("--out", options->out, "where to write the io: YAML (default DIR/strata-io.yaml)");
  command->add_option("--plot", options->plot, "also draw the sweep as an SVG chart here");
  command->add_option("--point-seconds", options->point_seconds, "duration of each measured point")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  command->add_option("--engines", options->engines, "engines to sweep (default: all available)")
      ->delimiter(',')
      ->check(CLI::IsMember({"uring", "aio", "psync"}));
  command->add_option("--block-sizes", options->block_sizes, "block sizes to sweep")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--queue-depths", options->queue_depths, "queue depths to sweep")
      ->delimiter(',')
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  command->add_option("--threads", options->threads, "thread counts to sweep")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  command->add_flag("--keep-file", options->keep_file, "keep the test file for the next run");
  command->callback([options, &state] { state.exit_code = run_tune(*options); });
}

}  // namespace strata::cli
