// `strata bench overlap` — proves the scheduler overlaps NVMe reads with compute. A synthetic
// model of N layers lives in an NVMe store (written once); each step acquires one layer through
// the scheduler (NVMe → pinned host, computed in place on the CPU device) and runs a real single-thread kernel over it,
// calibrated to the asked time per layer. Three ways, alternated, in one run: compute only
// (data resident), I/O only (no compute) and both; medians of the repeats. overlap_efficiency =
// max(compute, io) / both. The kernel's first pass checksums the layer, and every checksum is
// checked against the one computed when the layer was written, after the timed window.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/size.h"
#include "engine/cli/commands.h"
#include "io/io.h"
#include "memory/device/device.h"
#include "memory/host_arena.h"
#include "memory/store.h"
#include "scheduler/scheduler.h"

namespace strata::cli {
namespace {

struct OverlapOptions {
  uint32_t layers = 16;
  std::string layer_size = "64MiB";
  double compute_ms = 0;        // 0: match the measured I/O time per layer × compute_ratio
  double compute_ratio = 1.0;
  std::string dir = "strata-data/bench-overlap";
  std::string device_budget = "256MiB";
  std::string host_budget = "256MiB";
  std::string trace;
  uint32_t repeats = 3;
  bool json = false;
};

uint64_t now_ns() { return scheduler::Timeline::now_ns(); }

uint64_t layer_word(uint64_t layer, uint64_t word) { return (layer << 40) ^ (word * 0x9e3779b97f4a7c15ull); }

// One pass: a checksum of the words plus enough arithmetic that the pass is memory- and
// ALU-bound like a real layer. `words` may be a prefix (the fractional last pass).
uint64_t kernel_pass(const uint64_t* data, uint64_t words) {
  uint64_t sum = 0, mix = 1;
  for (uint64_t i = 0; i < words; ++i) {
    sum += data[i];
    mix = mix * 6364136223846793005ull + (data[i] | 1);
  }
  return sum ^ (mix & 0);  // mix keeps the loop honest; the checksum is the plain sum
}

// Runs the kernel for `passes` (fractional) over the layer; returns the first pass's checksum.
uint64_t compute(const void* data, uint64_t size_bytes, double passes) {
  const auto* words = static_cast<const uint64_t*>(data);
  const uint64_t word_count = size_bytes / 8;
  uint64_t checksum = kernel_pass(words, word_count);
  volatile uint64_t sink = 0;
  double left = passes - 1.0;
  while (left > 0) {
    const uint64_t n = left >= 1.0 ? word_count : static_cast<uint64_t>(left * static_cast<double>(word_count));
    sink = sink + kernel_pass(words, n);
    left -= 1.0;
  }
  return checksum;
}

struct RunResult {
  double seconds = 0;
  double stall_seconds = 0;
  uint64_t bytes_read = 0;
  double read_busy_seconds = 0;
  bool checksums_ok = true;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

Status run_overlap(const OverlapOptions& o) {
  STRATA_ASSIGN_OR_RETURN(uint64_t layer_bytes, parse_size(o.layer_size));
  STRATA_ASSIGN_OR_RETURN(uint64_t device_budget, parse_size(o.device_budget));
  STRATA_ASSIGN_OR_RETURN(uint64_t host_budget, parse_size(o.host_budget));
  layer_bytes = align_down(layer_bytes, 4096);
  if (o.layers == 0 || layer_bytes == 0 || o.repeats == 0)
    return make_error(ErrorKind::invalid_argument, "--layers, --layer-size and --repeats must be positive");
  // The CPU device computes in place: its budget beyond the compute-only run's resident layer
  // joins the host budget in one pool that the scheduler stages and computes in.
  const uint64_t pool_bytes = host_budget + device_budget - std::min(device_budget, layer_bytes);

  // --- the model on NVMe, written once ---
  memory::StoreOptions store_options;
  std::vector<io::Backend> backends = io::available_backends();
  store_options.engine.backend = backends.empty() ? io::Backend::psync : backends.front();
  store_options.engine.queue_depth = 32;
  store_options.engine.block_size_bytes = 1 << 20;
  std::filesystem::remove_all(o.dir);
  std::vector<uint64_t> expected_checksums(o.layers);
  memory::HostArenaOptions arena_options;
  arena_options.capacity_bytes = std::max(pool_bytes, layer_bytes) + (1 << 20);
  STRATA_ASSIGN_OR_RETURN(memory::HostArena arena, memory::HostArena::create(arena_options));
  {
    STRATA_ASSIGN_OR_RETURN(memory::Store store,
                            memory::Store::create(o.dir, {}, o.layers * (layer_bytes + (16 << 20)) + (64 << 20),
                                                  store_options));
    STRATA_ASSIGN_OR_RETURN(memory::HostBuffer staging, memory::HostBuffer::allocate(arena, layer_bytes));
    auto* words = reinterpret_cast<uint64_t*>(staging.data());
    for (uint32_t layer = 0; layer < o.layers; ++layer) {
      for (uint64_t w = 0; w < layer_bytes / 8; ++w) words[w] = layer_word(layer, w);
      expected_checksums[layer] = kernel_pass(words, layer_bytes / 8);
      const int64_t shape[] = {static_cast<int64_t>(layer_bytes / 4)};
      STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket,
                              store.write_tensor_async(fmt::format("layer{}.w", layer), DType::f32, shape,
                                                       staging.data(), layer_bytes));
      STRATA_RETURN_IF_ERROR(store.wait(ticket));
    }
    STRATA_RETURN_IF_ERROR(store.commit(0, {}));
  }
  scheduler::AccessPlan plan;
  for (uint32_t layer = 0; layer < o.layers; ++layer) {
    scheduler::TensorId id = plan.add_tensor(fmt::format("layer{}.w", layer), layer_bytes);
    plan.add_step(fmt::format("forward.{}", layer), {id});
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Device> device, device::make_device(device::Kind::cpu, layer_bytes));

  // One measured iteration through a fresh scheduler (after one warm-up iteration, so the
  // pipeline is in its steady state across the iteration boundary).
  auto scheduled_run = [&](double passes, bool trace) -> Result<RunResult> {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(o.dir, store_options));
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::NvmeBacking> backing, scheduler::make_store_backing(store, plan));
    scheduler::SchedulerOptions options;
    options.host_budget_bytes = pool_bytes;
    options.compute_in_place = true;
    options.io_queue_tensors = 2;
    options.trace_capacity_events = trace ? 4096 : 0;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::Scheduler> s,
                            scheduler::Scheduler::create(plan, *device, arena, backing.get(), options));
    RunResult result;
    scheduler::SchedulerStats before;
    uint64_t start_ns = 0;
    for (int iteration = 0; iteration < 2; ++iteration) {
      if (iteration == 1) {
        before = s->stats();
        start_ns = now_ns();
      }
      for (uint32_t layer = 0; layer < o.layers; ++layer) {
        STRATA_ASSIGN_OR_RETURN(scheduler::StepBuffers buffers, s->acquire(layer));
        if (passes > 0) {
          const uint64_t compute_start_ns = now_ns();
          const uint64_t checksum = compute(buffers.device_data(layer), layer_bytes, passes);
          if (checksum != expected_checksums[layer]) result.checksums_ok = false;
          if (s->timeline())
            s->timeline()->record(scheduler::TraceTrack::compute, fmt::format("layer{}", layer), compute_start_ns, now_ns());
        }
        STRATA_RETURN_IF_ERROR(s->release(layer));
      }
    }
    result.seconds = static_cast<double>(now_ns() - start_ns) / 1e9;
    const scheduler::SchedulerStats after = s->stats();
    result.stall_seconds = static_cast<double>(after.stall_ns - before.stall_ns) / 1e9;
    const auto& reads_after = after.transfers[static_cast<size_t>(scheduler::TierPair::nvme_to_host)];
    const auto& reads_before = before.transfers[static_cast<size_t>(scheduler::TierPair::nvme_to_host)];
    result.bytes_read = reads_after.bytes - reads_before.bytes;
    result.read_busy_seconds = static_cast<double>(reads_after.busy_ns - reads_before.busy_ns) / 1e9;
    if (trace && !o.trace.empty()) STRATA_RETURN_IF_ERROR(s->timeline()->write_json(o.trace));
    return result;
  };
  // Compute only: the same kernel over one resident device buffer per layer.
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer resident, device->allocate(layer_bytes));
  {
    auto* words = static_cast<uint64_t*>(resident.data());
    for (uint64_t w = 0; w < layer_bytes / 8; ++w) words[w] = layer_word(0, w);
  }
  auto compute_run = [&](double passes) {
    const uint64_t start_ns = now_ns();
    bool ok = true;
    for (uint32_t layer = 0; layer < o.layers; ++layer)
      ok &= compute(resident.data(), layer_bytes, passes) == expected_checksums[0];
    return std::pair<double, bool>(static_cast<double>(now_ns() - start_ns) / 1e9, ok);
  };

  // Calibration: seconds per kernel pass, and the I/O time per layer when compute is "auto".
  const double pass_seconds = compute_run(1.0).first / o.layers;
  double compute_ms = o.compute_ms;
  if (compute_ms <= 0) {
    STRATA_ASSIGN_OR_RETURN(RunResult probe, scheduled_run(0, false));
    compute_ms = o.compute_ratio * probe.seconds * 1e3 / o.layers;
  }
  const double passes = std::max(1.0, compute_ms / 1e3 / pass_seconds);
  spdlog::info("overlap: {} layers of {}, compute {:.1f} ms/layer ({:.2f} kernel passes), device {} host {}",
               o.layers, format_size(layer_bytes), compute_ms, passes, format_size(device_budget), format_size(host_budget));

  std::vector<double> compute_s, io_s, both_s, stall_s, io_gbps;
  bool data_ok = true;
  for (uint32_t r = 0; r < o.repeats; ++r) {
    auto [c, ok] = compute_run(passes);
    compute_s.push_back(c);
    data_ok &= ok;
    STRATA_ASSIGN_OR_RETURN(RunResult io_only, scheduled_run(0, false));
    io_s.push_back(io_only.seconds);
    io_gbps.push_back(static_cast<double>(io_only.bytes_read) / io_only.seconds / 1e9);
    STRATA_ASSIGN_OR_RETURN(RunResult both, scheduled_run(passes, r + 1 == o.repeats));
    both_s.push_back(both.seconds);
    stall_s.push_back(both.stall_seconds);
    data_ok &= both.checksums_ok;
    if (both.bytes_read < layer_bytes * o.layers)
      spdlog::warn("overlap: only {} read from NVMe in the measured iteration (budgets hold part of the model)",
                   format_size(both.bytes_read));
  }
  if (!data_ok) return make_error(ErrorKind::corrupt, "overlap: a layer's checksum did not match what was written");
  const double compute_seconds = median(compute_s), io_seconds = median(io_s), step_seconds = median(both_s);
  const double stall_seconds = median(stall_s);
  const double efficiency = std::max(compute_seconds, io_seconds) / step_seconds;
  const double model_bytes = static_cast<double>(layer_bytes) * o.layers;
  if (o.json) {
    nlohmann::json out = {{"layers", o.layers},
                          {"layer_bytes", layer_bytes},
                          {"compute_ms_per_layer", compute_ms},
                          {"device_budget_bytes", device_budget},
                          {"host_budget_bytes", host_budget},
                          {"repeats", o.repeats},
                          {"compute_seconds", compute_seconds},
                          {"io_seconds", io_seconds},
                          {"step_seconds", step_seconds},
                          {"overlap_efficiency", efficiency},
                          {"stall_seconds", stall_seconds},
                          {"stall_fraction", stall_seconds / step_seconds},
                          {"io_gb_per_s", median(io_gbps)},
                          {"step_gb_per_s", model_bytes / step_seconds / 1e9},
                          {"data_verified", data_ok}};
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("overlap: {} layers × {} from {}, compute {:.1f} ms/layer, medians of {}\n", o.layers,
               format_size(layer_bytes), o.dir, compute_ms, o.repeats);
    fmt::print("  compute only  {:8.3f} s\n", compute_seconds);
    fmt::print("  I/O only      {:8.3f} s   {:.2f} GB/s from NVMe\n", io_seconds, median(io_gbps));
    fmt::print("  both          {:8.3f} s   {:.2f} GB/s, stall {:.3f} s ({:.1f}% of the step)\n", step_seconds,
               model_bytes / step_seconds / 1e9, stall_seconds, 100 * stall_seconds / step_seconds);
    fmt::print("  overlap_efficiency = max(compute, io) / both = {:.3f}\n", efficiency);
  }
  std::filesystem::remove_all(o.dir);
  return Status();
}

}  // namespace

void add_bench_overlap_command(CLI::App& bench, CliState& state) {
  auto options = std::make_shared<OverlapOptions>();
  CLI::App* command = bench.add_subcommand(
      "overlap", "stream N layers from NVMe through the scheduler while a CPU kernel computes: compute only, I/O only, both");
  command->add_option("--layers", options->layers, "layers in the synthetic model")->capture_default_str();
  command->add_option("--layer-size", options->layer_size, "bytes per layer")->capture_default_str();
  command->add_option("--compute-ms", options->compute_ms,
                      "compute time per layer; 0 = the measured I/O time per layer × --compute-ratio")
      ->capture_default_str();
  command->add_option("--compute-ratio", options->compute_ratio, "compute / I/O time when --compute-ms is 0")
      ->capture_default_str();
  command->add_option("--dir", options->dir, "scratch store directory (removed after)")->capture_default_str();
  command->add_option("--device-budget", options->device_budget, "CPU device arena")->capture_default_str();
  command->add_option("--host-budget", options->host_budget, "pinned host budget (below the model: data streams)")
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "alternated repetitions (medians reported)")->capture_default_str();
  command->add_option("--trace", options->trace, "write the last 'both' run's Perfetto/Chrome trace here");
  command->add_flag("--json", options->json, "print one JSON object on stdout");
  command->callback([options, &state] {
    Status status = run_overlap(*options);
    if (!status.ok()) state.exit_code = report_error(status.error());
  });
}

}  // namespace strata::cli
