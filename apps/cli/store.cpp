// strata/apps/cli/store.cpp — `strata store inspect|verify DIR`, and the hidden
// `strata store bench` that bench/store_stream.sh runs against `strata io-bench`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "apps/cli/commands.h"
#include "run/run_store.h"
#include "io/io.h"
#include "memory/host_arena.h"
#include "memory/store.h"

namespace strata::cli {
namespace {

using memory::Store;
using memory::StoreOptions;
using memory::TensorRecord;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Result<Store> open_for_reading(const std::string& dir) {
  StoreOptions options;
  options.read_only = true;
  // Any backend this machine has; reading a store does not depend on the one that wrote it.
  const std::vector<io::Backend> backends = io::available_backends();
  if (!backends.empty()) options.engine.backend = backends.front();
  Result<Store> opened = Store::open(dir, options);
  // `strata train` keeps its store one level down, in <nvme path>/store: given the NVMe path
  // itself, open the store there (and say so) rather than answer "no store here".
  const std::string nested = (std::filesystem::path(dir) / "store").string();
  std::error_code ignored;
  if (!opened.ok() && opened.error().kind == ErrorKind::not_found &&
      std::filesystem::exists(std::filesystem::path(nested) / memory::kStoreManifestName, ignored)) {
    spdlog::info("{} holds no store itself; using the store in {}", dir, nested);
    return Store::open(nested, options);
  }
  return opened;
}

// ---- inspect -------------------------------------------------------------------------------

int run_inspect(const std::string& dir, bool json) {
  Result<Store> opened = open_for_reading(dir);
  if (!opened.ok()) return report_error(opened.error());
  Store& store = *opened;
  const memory::StoreStats stats = store.stats();
  const std::vector<TensorRecord> tensors = store.list();
  uint64_t tensor_bytes = 0;
  for (const TensorRecord& t : tensors) tensor_bytes += t.size_bytes;

  if (json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : stats.files) files.push_back({{"path", f.path}, {"size_bytes", f.size_bytes}});
    nlohmann::json list = nlohmann::json::array();
    for (const TensorRecord& t : tensors) {
      list.push_back({{"name", t.name},
                      {"tier", "nvme"},
                      {"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"size_bytes", t.size_bytes},
                      {"extents", t.extents.size()}});
    }
    nlohmann::json out = {{"dir", stats.dir},
                          {"format_version", memory::kStoreFormatVersion},
                          {"generation", stats.generation},
                          {"step", stats.committed_step},
                          {"files", files},
                          {"direct_io", stats.direct_io},
                          {"alignment_bytes", stats.alignment_bytes},
                          {"stripe_bytes", stats.stripe_bytes},
                          {"capacity_bytes", stats.capacity_bytes},
                          {"used_bytes", stats.used_bytes},
                          {"free_bytes", stats.free_bytes},
                          {"largest_free_bytes", stats.largest_free_bytes},
                          {"fragmentation", stats.fragmentation},
                          {"metadata", store.committed_metadata()},
                          {"tensor_bytes", tensor_bytes},
                          {"tensors", list}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("store %s — format %d, generation %llu, step %llu\n", stats.dir.c_str(), memory::kStoreFormatVersion,
              static_cast<unsigned long long>(stats.generation), static_cast<unsigned long long>(stats.committed_step));
  for (const auto& f : stats.files) {
    std::printf("  file      %s  %s\n", f.path.c_str(), format_size(f.size_bytes).c_str());
  }
  std::printf("  I/O       %s, extents aligned to %u bytes%s\n", stats.direct_io ? "O_DIRECT" : "buffered",
              stats.alignment_bytes,
              stats.files.size() > 1 ? fmt::format(", striped in {}", format_size(stats.stripe_bytes)).c_str() : "");
  std::printf("  space     capacity %s, used %s, free %s, largest free block %s, fragmentation %.3f\n",
              format_size(stats.capacity_bytes).c_str(), format_size(stats.used_bytes).c_str(),
              format_size(stats.free_bytes).c_str(), format_size(stats.largest_free_bytes).c_str(),
              stats.fragmentation);
  if (!store.committed_metadata().empty()) {
    std::string text;
    for (const auto& [key, value] : store.committed_metadata()) text += (text.empty() ? "" : ", ") + key + "=" + value;
    std::printf("  metadata  %s\n", text.c_str());
  }
  std::printf("  tensors   %zu, %s\n", tensors.size(), format_size(tensor_bytes).c_str());
  if (tensors.empty()) return 0;
  size_t name_width = 4;
  for (const TensorRecord& t : tensors) name_width = std::max(name_width, t.name.size());
  std::printf("    %-*s  tier  dtype  %-18s  %12s  extents\n", static_cast<int>(name_width), "name", "shape", "size");
  for (const TensorRecord& t : tensors) {
    std::printf("    %-*s  nvme  %-5s  %-18s  %12s  %zu\n", static_cast<int>(name_width), t.name.c_str(),
                dtype_name(t.dtype), shape_text(t.shape).c_str(), format_size(t.size_bytes).c_str(),
                t.extents.size());
  }
  return 0;
}

// ---- verify --------------------------------------------------------------------------------

int run_verify(const std::string& dir, bool json) {
  Result<Store> opened = open_for_reading(dir);
  if (!opened.ok()) return report_error(opened.error());
  Store& store = *opened;
  Result<memory::VerifyReport> verified = store.verify();
  if (!verified.ok()) return report_error(verified.error());
  const memory::VerifyReport& report = *verified;
  if (json) {
    nlohmann::json damages = nlohmann::json::array();
    for (const auto& d : report.damages) {
      damages.push_back({{"tensor", d.tensor},
                         {"path", d.path},
                         {"file_offset_bytes", d.file_offset_bytes},
                         {"length_bytes", d.length_bytes},
                         {"what", d.what}});
    }
    std::printf("%s\n", nlohmann::json{{"ok", report.ok()},
                                       {"step", store.committed_step()},
                                       {"tensors", report.tensor_count},
                                       {"extents", report.extent_count},
                                       {"bytes_checked", report.bytes_checked},
                                       {"damages", damages}}
                            .dump()
                            .c_str());
  } else {
    for (const auto& d : report.damages) {
      std::printf("damaged: tensor %s, file %s, offset %llu (%llu bytes): %s\n", d.tensor.c_str(), d.path.c_str(),
                  static_cast<unsigned long long>(d.file_offset_bytes),
                  static_cast<unsigned long long>(d.length_bytes), d.what.c_str());
    }
    if (report.ok()) {
      std::printf("store %s is sound: %llu tensors, %llu extents, %s checked, step %llu\n", store.dir().c_str(),
                  static_cast<unsigned long long>(report.tensor_count),
                  static_cast<unsigned long long>(report.extent_count), format_size(report.bytes_checked).c_str(),
                  static_cast<unsigned long long>(store.committed_step()));
    } else {
      std::printf("store %s is damaged: %zu of %llu extents failed their check\n", store.dir().c_str(),
                  report.damages.size(), static_cast<unsigned long long>(report.extent_count));
    }
  }
  return report.ok() ? 0 : 1;
}

// ---- bench (hidden; bench/store_stream.sh) -----------------------------------------------------
//
// Streams `count` tensors of `tensor_size` NVMe → pinned arena (read) and pinned arena → NVMe
// (write, a new version) through the store, `--lookahead` bytes of tensors in flight (at least
// two tensors) so the engine's queue never drains between tensors. The read time includes checksum verification; the write time
// includes hashing but not the commit, which is timed on its own (io-bench does not fsync).
// After the timed window every tensor is read back and compared with what was written.

struct BenchOptions {
  std::string dir;
  std::string tensor_size = "64MiB";
  std::string total = "1GiB";
  std::string engine = "uring";
  std::string block_size = "1MiB";
  uint32_t queue_depth = 32;
  std::string lookahead = "64MiB";
  std::string extent_size = "16MiB";
  std::string rw = "read";
  bool json = false;
};

uint64_t stamp_word(uint64_t tensor, uint64_t version, uint64_t word) {
  return (tensor << 48) ^ (version << 40) ^ word;
}

void stamp(std::byte* data, uint64_t size_bytes, uint64_t tensor, uint64_t version) {
  auto* words = reinterpret_cast<uint64_t*>(data);
  for (uint64_t w = 0; w < size_bytes / 8; ++w) words[w] = stamp_word(tensor, version, w);
}

bool stamped(const std::byte* data, uint64_t size_bytes, uint64_t tensor, uint64_t version) {
  const auto* words = reinterpret_cast<const uint64_t*>(data);
  for (uint64_t w = 0; w < size_bytes / 8; ++w) {
    if (words[w] != stamp_word(tensor, version, w)) return false;
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_bench(const BenchOptions& cli) {
  Result<uint64_t> tensor_size = parse_size(cli.tensor_size);
  if (!tensor_size.ok()) return report_error(tensor_size.error());
  Result<uint64_t> total = parse_size(cli.total);
  if (!total.ok()) return report_error(total.error());
  Result<uint64_t> block = parse_size(cli.block_size);
  if (!block.ok()) return report_error(block.error());
  Result<io::Backend> backend = io::parse_backend(cli.engine);
  if (!backend.ok()) return report_error(backend.error());
  Result<uint64_t> lookahead = parse_size(cli.lookahead);
  if (!lookahead.ok()) return report_error(lookahead.error());
  if (*tensor_size % 8 != 0) return report_error(make_error(ErrorKind::invalid_argument, "--tensor-size must be a multiple of 8"));
  const uint64_t size = *tensor_size;
  const uint64_t count = std::max<uint64_t>(2, *total / size);
  const std::vector<int64_t> shape{static_cast<int64_t>(size / 4)};

  StoreOptions options;
  options.engine.backend = *backend;
  options.engine.block_size_bytes = *block;
  options.engine.queue_depth = cli.queue_depth;
  Result<uint64_t> extent_size = parse_size(cli.extent_size);
  if (!extent_size.ok()) return report_error(extent_size.error());
  options.max_extent_bytes = *extent_size;
  const std::string store_dir = (std::filesystem::path(cli.dir) / ("store-" + std::to_string(size))).string();

  // The arena: enough tensors in flight to cover the lookahead (in bytes, as the scheduler
  // measures it), at least two; pinned and registered like the trainer's.
  const uint64_t window = std::min<uint64_t>(count, std::max<uint64_t>(2, (*lookahead + size - 1) / size));
  memory::HostArenaOptions arena_options;
  arena_options.capacity_bytes = window * size;
  Result<memory::HostArena> arena = memory::HostArena::create(arena_options);
  if (!arena.ok()) return report_error(arena.error());
  std::vector<memory::HostBlock> blocks;
  std::vector<std::byte*> buffers;
  for (uint64_t slot = 0; slot < window; ++slot) {
    Result<memory::HostBlock> block = arena->allocate(size);
    if (!block.ok()) return report_error(block.error());
    blocks.push_back(*block);
    buffers.push_back(block->data);
  }

  // Set-up, outside the timing: a store holding `count` tensors (version 1), made once and
  // reused by later runs with the same tensor size.
  Result<Store> opened = Store::open(store_dir, options);
  if (!opened.ok() && opened.error().kind == ErrorKind::not_found) {
    Result<Store> made = Store::create(store_dir, {}, 2 * count * size + (64 << 20), options);
    if (!made.ok()) return report_error(made.error());
    Status status = arena->register_with(made->engine());
    for (uint64_t t = 0; t < count && status.ok(); ++t) {
      stamp(buffers[0], size, t, 1);
      Result<memory::StoreTicket> ticket =
          made->write_tensor_async("t" + std::to_string(t), DType::f32, shape, buffers[0], size);
      status = ticket.ok() ? made->wait(*ticket) : ticket.status();
    }
    if (status.ok()) status = made->commit(1, {});
    if (!status.ok()) return report_error(status.error());
    opened = Store::open(store_dir, options);
  }
  if (!opened.ok()) return report_error(opened.error());
  Store& store = *opened;
  const bool registered = arena->register_with(store.engine()).ok();
  const uint64_t version = store.committed_step();

  // Streams every tensor through the window of buffers; a write run writes version+1 of each.
  // Tensor t comes from (or goes to) buffer t % window. Content is stamped with a tag, the
  // version and each word's index, so the check afterwards sees any misplaced byte: reads of
  // the set-up version carry tag t, written versions carry the buffer slot they came from.
  const bool write = cli.rw == "write";
  if (write) {
    for (uint64_t slot = 0; slot < window; ++slot) stamp(buffers[slot], size, slot, version + 1);
  }
  std::vector<memory::StoreTicket> tickets(count);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t t = 0; t < count; ++t) {
    if (t >= window) {
      Status done = store.wait(tickets[t - window]);  // frees buffer t % window
      if (!done.ok()) return report_error(done.error());
    }
    const std::string name = "t" + std::to_string(t);
    Result<memory::StoreTicket> ticket = write ? store.write_tensor_async(name, DType::f32, shape, buffers[t % window], size)
                                               : store.read_tensor_async(name, buffers[t % window], size);
    if (!ticket.ok()) return report_error(ticket.error());
    tickets[t] = *ticket;
  }
  for (uint64_t t = count - window; t < count; ++t) {
    Status done = store.wait(tickets[t]);
    if (!done.ok()) return report_error(done.error());
  }
  const double seconds = seconds_since(start);
  double commit_seconds = 0;
  uint64_t checked_version = version;
  if (write) {
    const auto commit_start = std::chrono::steady_clock::now();
    // The window decides which buffer each tensor came from: recorded for later data checks.
    Status committed = store.commit(version + 1, {{"bench_window", std::to_string(window)}});
    if (!committed.ok()) return report_error(committed.error());
    commit_seconds = seconds_since(commit_start);
    checked_version = version + 1;
  }
  const auto recorded = store.committed_metadata().find("bench_window");
  const uint64_t written_window =
      recorded == store.committed_metadata().end() ? window : std::strtoull(recorded->second.c_str(), nullptr, 10);
  // Data check after the timed window: every tensor read back (checksums verified) and
  // compared word by word with its stamp.
  uint64_t checked = 0;
  for (uint64_t t = 0; t < count; ++t) {
    const std::string name = "t" + std::to_string(t);
    Result<memory::StoreTicket> ticket = store.read_tensor_async(name, buffers[0], size);
    Status status = ticket.ok() ? store.wait(*ticket) : ticket.status();
    if (!status.ok()) return report_error(status.error());
    const uint64_t tag = checked_version == 1 ? t : t % written_window;
    if (!stamped(buffers[0], size, tag, checked_version)) {
      Error error = make_error(ErrorKind::corrupt, "bench data check: tensor content is not what was written");
      error.tensor = name;
      return report_error(error);
    }
    ++checked;
  }
  const double mbps = static_cast<double>(count * size) / seconds / 1e6;
  const memory::StoreStats stats = store.stats();
  const std::string buffers_text = fmt::format("host arena of {} ({}){}", format_size(arena->capacity_bytes()),
                                               memory::pin_kind_name(arena->pin_kind()),
                                               registered ? ", registered with the engine" : "");
  for (const memory::HostBlock& block : blocks) arena->free(block);
  if (cli.json) {
    std::printf("%s\n", nlohmann::json{{"rw", cli.rw},
                                       {"tensor_bytes", size},
                                       {"tensors", count},
                                       {"tensors_in_flight", window},
                                       {"bytes", count * size},
                                       {"seconds", seconds},
                                       {"MBps", mbps},
                                       {"commit_seconds", commit_seconds},
                                       {"direct", stats.direct_io},
                                       {"buffers", buffers_text},
                                       {"engine", store.engine().describe()},
                                       {"fixed_buffer_ops", store.engine().stats().fixed_buffer_ops},
                                       {"pieces_submitted", store.engine().stats().pieces_submitted},
                                       {"bounce_bytes", store.engine().stats().bounce_bytes},
                                       {"verified_tensors", checked}}
                            .dump()
                            .c_str());
  } else {
    std::printf("store bench: %s %llu tensors of %s through %s\n", cli.rw.c_str(),
                static_cast<unsigned long long>(count), format_size(size).c_str(), store_dir.c_str());
    std::printf("  engine:  %s\n  buffers: %s\n", store.engine().describe().c_str(), buffers_text.c_str());
    std::printf("  moved %s in %.3f s = %.1f MB/s%s\n", format_size(count * size).c_str(), seconds, mbps,
                write ? fmt::format(" (then commit: {:.3f} s)", commit_seconds).c_str() : "");
    std::printf("  data check after the run: %llu tensors verified\n", static_cast<unsigned long long>(checked));
  }
  return 0;
}

}  // namespace

void add_store_command(CLI::App& app, CliState& state) {
  CLI::App* store = app.add_subcommand("store", "inspect, verify or export an NVMe store (a directory with manifest.json)");
  store->require_subcommand(1);

  auto inspect_dir = std::make_shared<std::string>();
  auto inspect_json = std::make_shared<bool>(false);
  CLI::App* inspect = store->add_subcommand(
      "inspect", "tensors (tier, dtype, shape, size, extents), committed step, files, free space, fragmentation");
  inspect->add_option("DIR", *inspect_dir, "store directory")->required();
  inspect->add_flag("--json", *inspect_json, "print exactly one JSON object on stdout");
  inspect->callback([inspect_dir, inspect_json, &state] { state.exit_code = run_inspect(*inspect_dir, *inspect_json); });

  auto verify_dir = std::make_shared<std::string>();
  auto verify_json = std::make_shared<bool>(false);
  CLI::App* verify = store->add_subcommand(
      "verify",
      "read every extent and check its xxh3; exit 1 naming each damaged tensor, file and offset,\n"
      "exit 0 with a one-line summary when all is sound");
  verify->add_option("DIR", *verify_dir, "store directory")->required();
  verify->add_flag("--json", *verify_json, "print exactly one JSON object on stdout");
  verify->callback([verify_dir, verify_json, &state] { state.exit_code = run_verify(*verify_dir, *verify_json); });

  auto export_args = std::make_shared<std::vector<std::string>>();
  auto export_shard_size = std::make_shared<std::string>("5000000000");
  auto export_merged = std::make_shared<bool>(false);
  CLI::App* export_command = store->add_subcommand(
      "export", "write the committed fp32 weights of a `strata train` store with Hugging Face names: one "
                ".safetensors file, or a Hugging Face folder (config.json + safetensors, sharded above --shard-size); "
                "an adapter store's LoRA adapters as a PEFT adapter folder, or with --merged its base with them "
                "folded in");
  // DIR… PATH: a ZeRO job's stores (docs/parallel.md) are given together, each chunk read from
  // the store that holds it.
  export_command->add_option("DIR... PATH", *export_args,
                             "store directory (<first NVMe path>/store) — every rank's, for a ZeRO job — then "
                             "FILE.safetensors, or a new folder to write as a Hugging Face model folder")
      ->required()
      ->expected(2, 4097);
  export_command->add_option("--shard-size", *export_shard_size,
                             "a folder's largest shard (bytes or binary units; save_pretrained's 5 GB by default)")
      ->capture_default_str();
  export_command->add_flag("--merged", *export_merged,
                           "an adapter store: write the base with the adapters folded in (W + scale·B·A) instead of "
                           "the PEFT adapter folder");
  export_command->callback([export_args, export_shard_size, export_merged, &state] {
    Result<uint64_t> shard_size = parse_size(*export_shard_size);
    if (!shard_size.ok()) {
      state.exit_code = report_error(make_error(ErrorKind::invalid_argument,
                                                "--shard-size: " + shard_size.error().message));
      return;
    }
    std::vector<std::string> dirs(export_args->begin(), export_args->end() - 1);
    Status status = *export_merged ? export_merged_weights(dirs, export_args->back(), *shard_size)
                                   : export_store_weights(dirs, export_args->back(), *shard_size);
    if (!status.ok()) state.exit_code = report_error(status.error());
  });

  auto bench = std::make_shared<BenchOptions>();
  CLI::App* bench_command = store->add_subcommand(
      "bench", "stream tensors NVMe <-> pinned arena through the store (bench/store_stream.sh)");
  bench_command->group("");  // hidden: a benchmark tool, not a user command
  bench_command->add_option("--dir", bench->dir, "scratch directory (a store per tensor size is kept there)")
      ->required();
  bench_command->add_option("--tensor-size", bench->tensor_size, "bytes per tensor")->capture_default_str();
  bench_command->add_option("--total", bench->total, "bytes streamed per run (tensor count = total / size)")
      ->capture_default_str();
  bench_command->add_option("--rw", bench->rw, "direction")->check(CLI::IsMember({"read", "write"}))->capture_default_str();
  bench_command->add_option("--engine", bench->engine, "I/O engine")
      ->check(CLI::IsMember({"uring", "aio", "psync"}))
      ->capture_default_str();
  bench_command->add_option("--block-size", bench->block_size, "bytes per engine piece")->capture_default_str();
  bench_command->add_option("--queue-depth", bench->queue_depth, "pieces in flight")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  bench_command->add_option("--lookahead", bench->lookahead, "bytes of tensors in flight (at least two tensors)")
      ->capture_default_str();
  bench_command->add_option("--extent-size", bench->extent_size, "largest extent when the store is created")
      ->capture_default_str();
  bench_command->add_flag("--json", bench->json, "print exactly one JSON object on stdout");
  bench_command->callback([bench, &state] { state.exit_code = run_bench(*bench); });
}

}  // namespace strata::cli
