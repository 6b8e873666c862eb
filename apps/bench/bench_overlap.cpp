// `strata bench overlap` — proves the scheduler overlaps NVMe reads with compute. A synthetic
// model of N layers of fp32 values lives in an NVMe store (written once); each step acquires one
// layer through the scheduler (NVMe → pinned host, computed in place on the CPU device; on to the
// device on CUDA) and runs real backend ops on it:
// k passes of the compute backend's sum of squares (kernels/backend.h) on the backend's compute
// stream, the layer given back with `release_after` as the trainer does, k calibrated to the
// asked time per layer. The sums come back to the host once per pass over the model (`end_step`,
// one sync). Three ways, alternated, in one run: compute only (every layer resident on the
// device, a buffer each), I/O only (no compute) and both; medians of the repeats.
// overlap_efficiency = max(compute, io) / both. After each timed window every pass's sum is
// checked against the one a CPU backend computed when the layers were written: bit-exact on the
// CPU backend (the same kernel, the same order of additions), within 1e-6 relative on CUDA (its
// reduction order differs).
#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/size.h"
#include "apps/cli/commands.h"
#include "io/io.h"
#include "kernels/backend.h"
#include "device/device.h"
#include "memory/host_arena.h"
#include "memory/store.h"
#include "run/budgets.h"
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
  std::string device = "cpu";
  uint32_t repeats = 3;
  std::string verify_reads = "always";  // the store's memory::VerifyReads
  bool compute_only = false;  // only the compute-only runs: a known load to measure I/O beside
  bool json = false;
};

uint64_t now_ns() { return scheduler::Timeline::now_ns(); }

// Word `index` of layer `layer`: finite fp32 values in [-1, 1) that differ between layers, so a
// layer served in another's place changes the sums.
float layer_value(uint64_t layer, uint64_t index) {
  const uint64_t mixed = (layer + 1) * 0x9e3779b97f4a7c15ull ^ (index * 0xbf58476d1ce4e5b9ull);
  return static_cast<float>(static_cast<int64_t>((mixed >> 40) & 0xffff) - 0x8000) / 32768.0f;
}

// How `passes` (fractional) sums of squares over a layer split: whole passes,
// then one over the first `eighths`/8 of it (eighths, so that the sums to check against can be
// taken once, when the layers are written).
constexpr uint32_t kFractions = 8;
struct Passes {
  uint64_t whole = 0;
  uint32_t eighths = 0;
  double count() const { return static_cast<double>(whole) + eighths / double(kFractions); }
};
Passes split_passes(double passes) {
  Passes p;
  p.whole = static_cast<uint64_t>(passes);
  p.eighths = static_cast<uint32_t>(std::lround((passes - static_cast<double>(p.whole)) * kFractions));
  if (p.eighths == kFractions) p = {p.whole + 1, 0};
  return p;
}
uint64_t prefix_count(uint64_t count, uint32_t eighths) { return count / kFractions * eighths; }

// One layer's compute: the passes, enqueued on the backend's stream (nothing waits here).
Status enqueue_layer(kernels::ComputeBackend& backend, const void* data, uint64_t count, const Passes& passes) {
  const auto* values = static_cast<const float*>(data);
  for (uint64_t pass = 0; pass < passes.whole; ++pass) STRATA_RETURN_IF_ERROR(backend.sum_squares(values, count));
  if (passes.eighths > 0) STRATA_RETURN_IF_ERROR(backend.sum_squares(values, prefix_count(count, passes.eighths)));
  return Status();
}

// What a pass over `layers` (in order) must sum to, from each layer's sums taken when it was
// written; the additions are the backend's own (one double accumulator, in call order).
// `sums[layer][j]` is the sum over the first j/8 of the layer (j = 8: all of it).
using LayerSums = std::vector<std::array<double, kFractions + 1>>;
double expected_pass_sum(const LayerSums& sums, const std::vector<uint32_t>& layers, const Passes& passes) {
  double total = 0;
  for (uint32_t layer : layers) {
    for (uint64_t pass = 0; pass < passes.whole; ++pass) total += sums[layer][kFractions];
    if (passes.eighths > 0) total += sums[layer][passes.eighths];
  }
  return total;
}

// Whether a pass's sum is the expected one: bit-exact where the backend is the CPU kernel that
// took the reference sums, within fp32-reduction-order rounding elsewhere.
bool sum_matches(const kernels::ComputeBackend& backend, double got, double expected) {
  if (std::string_view(backend.name()) == "cpu") return got == expected;
  return std::abs(got - expected) <= 1e-6 * std::abs(expected);
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

// The scratch store's folder, created by the run and removed after it. One that is there already
// is removed only when it holds nothing but a store's own files (a run that was killed left it);
// anything else is refused, never deleted. Missing is fine: Store::create makes it (or says why not).
Status claim_scratch_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::symlink_status(dir, error);
  if (status.type() == fs::file_type::not_found) return Status();
  if (error) return make_error(ErrorKind::invalid_argument, fmt::format("--dir {}: {}", dir, error.message()));
  if (status.type() != fs::file_type::directory)
    return make_error(ErrorKind::invalid_argument, fmt::format("--dir {}: exists and is not a folder", dir));
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const bool store_file = name == memory::kStoreManifestName || name == memory::kStoreManifestTempName ||
                            name == memory::kStoreDefaultDataName;
    if (!store_file || !it->is_regular_file())
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("--dir {}: holds '{}', which is not a scratch store's; give a new or empty folder",
                                    dir, name));
  }
  if (!error) fs::remove_all(dir, error);
  if (error) return make_error(ErrorKind::invalid_argument, fmt::format("--dir {}: {}", dir, error.message()));
  return Status();
}

Status run_overlap(const OverlapOptions& o) {
  STRATA_ASSIGN_OR_RETURN(uint64_t layer_bytes, parse_size(o.layer_size));
  STRATA_ASSIGN_OR_RETURN(uint64_t device_budget, parse_size(o.device_budget));
  STRATA_ASSIGN_OR_RETURN(uint64_t host_budget, parse_size(o.host_budget));
  STRATA_ASSIGN_OR_RETURN(device::Kind device_kind, device::parse_kind(o.device));
  layer_bytes = align_down(layer_bytes, 4096);
  if (o.layers == 0 || layer_bytes == 0 || o.repeats == 0)
    return make_error(ErrorKind::invalid_argument, "--layers, --layer-size and --repeats must be positive");
  if (o.compute_only && o.compute_ms <= 0)
    return make_error(ErrorKind::invalid_argument, "--compute-only needs --compute-ms (nothing to calibrate against)");
  const uint64_t layer_values = layer_bytes / sizeof(float);
  // The pools by the one rule (run/budgets.h): the CPU device computes in place, its budget
  // joins the host budget in one pool that the scheduler stages and computes in. The scratch
  // it is given is one layer, at most the device budget — the device's own buffer when the
  // compute-only reference ran over one layer; kept so the pool, and the figures, stay those
  // of earlier rounds (7 layers of 64 MiB with the defaults).
  const MemoryPools pools = memory_pools(device_kind, device_budget, host_budget, std::min(device_budget, layer_bytes));
  const bool in_place = pools.one_pool;
  const uint64_t pool_bytes = pools.pool_bytes;

  // The device and its backend first: `--device cuda` without a GPU stops here, before any
  // NVMe work. The backend runs no model op, so the smallest batch sizes its fixed buffers. In
  // place the device holds nothing (steps compute in the pool; the compute-only layers have a
  // device of their own below), so its region is the reference device's token 1 MiB.
  const kernels::BatchShape no_batch{1, 1};
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Device> device,
                          device::make_device(device_kind, in_place ? uint64_t{1} << 20 : pools.device_region_bytes));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::ComputeBackend> backend, kernels::make_backend(*device, no_batch));
  // The reference sums come from a CPU backend over the host copy of each layer as it is written.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Device> reference_device,
                          device::make_device(device::Kind::cpu, 1 << 20));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::ComputeBackend> reference,
                          kernels::make_backend(*reference_device, no_batch));

  // Compute only runs over the model resident on the device: one buffer per layer, as a model
  // that fits would be, filled below as the layers are written. (Over one buffer holding layer 0
  // for every layer, a 64 MiB layer stayed in a 260 MiB L3 the whole pass: that reference ran
  // ~1.35× faster than a pass over 16 distinct resident layers, with no I/O at all.)
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<device::Device> resident_device,
                          device::make_device(device_kind, o.layers * layer_bytes + (1 << 20)));
  std::vector<device::DeviceBuffer> resident(o.layers);
  for (uint32_t layer = 0; layer < o.layers; ++layer) {
    STRATA_ASSIGN_OR_RETURN(resident[layer], resident_device->allocate(layer_bytes));
  }
  STRATA_ASSIGN_OR_RETURN(device::Stream resident_copies, resident_device->create_stream("resident copies"));

  // --- the model on NVMe, written once ---
  memory::StoreOptions store_options;
  std::vector<io::Backend> backends = io::available_backends();
  store_options.engine.backend = backends.empty() ? io::Backend::psync : backends.front();
  store_options.engine.queue_depth = 32;
  store_options.engine.block_size_bytes = 1 << 20;
  // Each scheduled run opens the store afresh: under `once` its warm-up iteration verifies every
  // layer and the measured one re-reads them trusted — a long generation's steady state.
  store_options.verify_reads = *memory::parse_verify_reads(o.verify_reads);  // IsMember took only its names
  if (!o.compute_only) STRATA_RETURN_IF_ERROR(claim_scratch_dir(o.dir));
  LayerSums layer_sums(o.layers);
  memory::HostArenaOptions arena_options;
  arena_options.try_cuda = device_kind == device::Kind::cuda;  // pinned by CUDA only for a CUDA run
  arena_options.capacity_bytes = std::max(pool_bytes, layer_bytes) + (1 << 20);
  STRATA_ASSIGN_OR_RETURN(memory::HostArena arena, memory::HostArena::create(arena_options));
  {
    // --compute-only reads nothing: the layers go to their resident buffers, not to a store.
    std::optional<memory::Store> store;
    if (!o.compute_only) {
      STRATA_ASSIGN_OR_RETURN(store, memory::Store::create(o.dir, {}, o.layers * (layer_bytes + (16 << 20)) + (64 << 20),
                                                           store_options));
    }
    STRATA_ASSIGN_OR_RETURN(memory::HostBuffer staging, memory::HostBuffer::allocate(arena, layer_bytes));
    auto* values = reinterpret_cast<float*>(staging.data());
    for (uint32_t layer = 0; layer < o.layers; ++layer) {
      for (uint64_t i = 0; i < layer_values; ++i) values[i] = layer_value(layer, i);
      for (uint32_t j = 1; j <= kFractions; ++j) {
        STRATA_RETURN_IF_ERROR(reference->begin_step({}));
        STRATA_RETURN_IF_ERROR(reference->sum_squares(values, prefix_count(layer_values, j)));
        STRATA_ASSIGN_OR_RETURN(kernels::StepScalars sums, reference->end_step());
        layer_sums[layer][j] = sums.grad_sum_squares;
      }
      STRATA_RETURN_IF_ERROR(
          resident_device->copy_to_device(resident_copies, resident[layer].data(), staging.data(), layer_bytes));
      STRATA_RETURN_IF_ERROR(resident_device->synchronize(resident_copies));
      if (!store) continue;
      const int64_t shape[] = {static_cast<int64_t>(layer_values)};
      STRATA_ASSIGN_OR_RETURN(memory::StoreTicket ticket,
                              store->write_tensor_async(fmt::format("layer{}.w", layer), DType::f32, shape,
                                                        staging.data(), layer_bytes));
      STRATA_RETURN_IF_ERROR(store->wait(ticket));
    }
    if (store) STRATA_RETURN_IF_ERROR(store->commit(0, {}));
  }
  scheduler::AccessPlan plan;
  std::vector<uint32_t> model_order(o.layers);
  for (uint32_t layer = 0; layer < o.layers; ++layer) {
    scheduler::TensorId id = plan.add_tensor(fmt::format("layer{}.w", layer), layer_bytes);
    plan.add_step(fmt::format("forward.{}", layer), {id});
    model_order[layer] = layer;
  }

  // One measured iteration through a fresh scheduler (after one warm-up iteration, so the
  // pipeline is in its steady state across the iteration boundary). Each iteration is one
  // backend step: its sums come back once, at its end, and are checked after the timed window.
  auto scheduled_run = [&](const Passes& passes, bool trace) -> Result<RunResult> {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(o.dir, store_options));
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::NvmeBacking> backing, scheduler::make_store_backing(store, plan));
    scheduler::SchedulerOptions options;
    options.host_budget_bytes = pool_bytes;
    options.compute_in_place = in_place;
    options.io_queue_tensors = 2;
    options.trace_capacity_events = trace ? 4096 : 0;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::Scheduler> s,
                            scheduler::Scheduler::create(plan, *device, arena, backing.get(), options));
    const bool computes = passes.count() > 0;
    RunResult result;
    scheduler::SchedulerStats before;
    uint64_t start_ns = 0;
    std::vector<double> pass_sums;
    for (int iteration = 0; iteration < 2; ++iteration) {
      if (iteration == 1) {
        before = s->stats();
        start_ns = now_ns();
      }
      if (computes) STRATA_RETURN_IF_ERROR(backend->begin_step({}));
      for (uint32_t layer = 0; layer < o.layers; ++layer) {
        STRATA_ASSIGN_OR_RETURN(scheduler::StepBuffers buffers, s->acquire(layer));
        if (!computes) {
          STRATA_RETURN_IF_ERROR(s->release(layer));
          continue;
        }
        const uint64_t compute_start_ns = now_ns();
        Status status = enqueue_layer(*backend, buffers.device_data(layer), layer_values, passes);
        if (s->timeline())
          s->timeline()->record(scheduler::TraceTrack::compute, fmt::format("layer{}", layer), compute_start_ns, now_ns());
        Status released = status.ok() ? s->release_after(layer, backend->compute_stream()) : s->release(layer);
        STRATA_RETURN_IF_ERROR(status);
        STRATA_RETURN_IF_ERROR(released);
      }
      if (computes) {
        STRATA_ASSIGN_OR_RETURN(kernels::StepScalars sums, backend->end_step());
        pass_sums.push_back(sums.grad_sum_squares);
      }
    }
    result.seconds = static_cast<double>(now_ns() - start_ns) / 1e9;
    const scheduler::SchedulerStats after = s->stats();
    result.stall_seconds = static_cast<double>(after.stall_ns - before.stall_ns) / 1e9;
    const auto& reads_after = after.transfers[static_cast<size_t>(scheduler::TierPair::nvme_to_host)];
    const auto& reads_before = before.transfers[static_cast<size_t>(scheduler::TierPair::nvme_to_host)];
    result.bytes_read = reads_after.bytes - reads_before.bytes;
    result.read_busy_seconds = static_cast<double>(reads_after.busy_ns - reads_before.busy_ns) / 1e9;
    const double expected = expected_pass_sum(layer_sums, model_order, passes);
    for (double sum : pass_sums) result.checksums_ok &= sum_matches(*backend, sum, expected);
    if (trace && !o.trace.empty()) STRATA_RETURN_IF_ERROR(s->timeline()->write_json(o.trace));
    return result;
  };
  // Compute only: the same ops over the resident layers, one step per pass over the model.
  auto compute_run = [&](const Passes& passes) -> Result<std::pair<double, bool>> {
    const uint64_t start_ns = now_ns();
    STRATA_RETURN_IF_ERROR(backend->begin_step({}));
    for (uint32_t layer = 0; layer < o.layers; ++layer)
      STRATA_RETURN_IF_ERROR(enqueue_layer(*backend, resident[layer].data(), layer_values, passes));
    STRATA_ASSIGN_OR_RETURN(kernels::StepScalars sums, backend->end_step());
    const double seconds = static_cast<double>(now_ns() - start_ns) / 1e9;
    return std::pair<double, bool>(
        seconds, sum_matches(*backend, sums.grad_sum_squares, expected_pass_sum(layer_sums, model_order, passes)));
  };

  // Calibration: seconds per pass, and the I/O time per layer when compute is "auto". A layer's
  // first pass reads it from memory, later ones may find it in cache (a 64 MiB layer fits a large
  // L3), so a layer of k passes takes first + (k − 1) × later: both from runs of 1 and 4 passes.
  STRATA_ASSIGN_OR_RETURN(auto one_pass, compute_run(Passes{1, 0}));
  STRATA_ASSIGN_OR_RETURN(auto four_passes, compute_run(Passes{4, 0}));
  const double first_pass_seconds = one_pass.first / o.layers;
  double later_pass_seconds = (four_passes.first - one_pass.first) / 3 / o.layers;
  if (later_pass_seconds <= 0) later_pass_seconds = first_pass_seconds;  // a noisy pair: no cache assumed
  double compute_ms = o.compute_ms;
  if (compute_ms <= 0) {
    STRATA_ASSIGN_OR_RETURN(RunResult probe, scheduled_run(Passes{}, false));
    compute_ms = o.compute_ratio * probe.seconds * 1e3 / o.layers;
  }
  auto passes_for = [&](double later_seconds) {
    return split_passes(std::max(1.0, 1.0 + (compute_ms / 1e3 - first_pass_seconds) / later_seconds));
  };
  Passes passes = passes_for(later_pass_seconds);
  // How much of a layer stays cached depends on the pass count, so the later passes' rate from
  // 4 passes is rough: one run at the chosen count corrects it once.
  if (passes.count() > 1) {
    STRATA_ASSIGN_OR_RETURN(auto check, compute_run(passes));
    const double check_later_seconds = (check.first / o.layers - first_pass_seconds) / (passes.count() - 1);
    if (check_later_seconds > 0) passes = passes_for(check_later_seconds);
  }
  spdlog::info("overlap: {} layers of {} on {}, compute {:.1f} ms/layer ({:.3f} sum-of-squares passes), device {} host {}",
               o.layers, format_size(layer_bytes), backend->name(), compute_ms, passes.count(),
               format_size(device_budget), format_size(host_budget));

  std::vector<double> compute_s, io_s, both_s, stall_s, io_gbps;
  bool data_ok = true;
  for (uint32_t r = 0; r < o.repeats; ++r) {
    STRATA_ASSIGN_OR_RETURN(auto compute_only, compute_run(passes));
    compute_s.push_back(compute_only.first);
    data_ok &= compute_only.second;
    if (o.compute_only) continue;
    STRATA_ASSIGN_OR_RETURN(RunResult io_only, scheduled_run(Passes{}, false));
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
  if (!data_ok) return make_error(ErrorKind::corrupt,
                      "overlap: a pass's sum of squares did not match the layers as written");
  if (o.compute_only) {
    if (o.json)
      fmt::print("{}\n", nlohmann::json({{"layers", o.layers}, {"layer_bytes", layer_bytes},
                                         {"compute_ms_per_layer", compute_ms}, {"backend", backend->name()},
                                         {"repeats", o.repeats}, {"compute_seconds", median(compute_s)},
                                         {"data_verified", data_ok}})
                                         .dump());
    else
      fmt::print("overlap: compute only, {} layers × {}, {:.1f} ms/layer on {}: {:.3f} s (median of {})\n", o.layers,
                 format_size(layer_bytes), compute_ms, backend->name(), median(compute_s), o.repeats);
    return Status();
  }
  const double compute_seconds = median(compute_s), io_seconds = median(io_s), step_seconds = median(both_s);
  const double stall_seconds = median(stall_s);
  const double efficiency = std::max(compute_seconds, io_seconds) / step_seconds;
  const double model_bytes = static_cast<double>(layer_bytes) * o.layers;
  if (o.json) {
    nlohmann::json out = {{"layers", o.layers},
                          {"layer_bytes", layer_bytes},
                          {"compute_ms_per_layer", compute_ms},
                          {"backend", backend->name()},
                          {"compute_passes_per_layer", passes.count()},
                          {"device_budget_bytes", device_budget},
                          {"host_budget_bytes", host_budget},
                          {"repeats", o.repeats},
                          {"verify_reads", o.verify_reads},
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
    fmt::print("overlap: {} layers × {} from {}, compute {:.1f} ms/layer ({:.3f} sum-of-squares passes on {}), "
               "reads verified {}, medians of {}\n",
               o.layers, format_size(layer_bytes), o.dir, compute_ms, passes.count(), backend->name(), o.verify_reads,
               o.repeats);
    fmt::print("  compute only  {:8.3f} s\n", compute_seconds);
    fmt::print("  I/O only      {:8.3f} s   {:.2f} GB/s from NVMe\n", io_seconds, median(io_gbps));
    fmt::print("  both          {:8.3f} s   {:.2f} GB/s, stall {:.3f} s ({:.1f}% of the step)\n", step_seconds,
               model_bytes / step_seconds / 1e9, stall_seconds, 100 * stall_seconds / step_seconds);
    fmt::print("  overlap_efficiency = max(compute, io) / both = {:.3f}\n", efficiency);
  }
  std::error_code ignored;  // the scratch store; a failure to remove it changes no figure
  std::filesystem::remove_all(o.dir, ignored);
  return Status();
}

}  // namespace

void add_bench_overlap_command(CLI::App& bench, CliState& state) {
  auto options = std::make_shared<OverlapOptions>();
  CLI::App* command = bench.add_subcommand(
      "overlap", "stream N layers from NVMe through the scheduler while the compute backend works on each: compute only, I/O "
      "only, both");
  command->add_option("--layers", options->layers, "layers in the synthetic model")->capture_default_str();
  command->add_option("--layer-size", options->layer_size, "bytes per layer")->capture_default_str();
  command->add_option("--compute-ms", options->compute_ms,
                      "compute time per layer; 0 = the measured I/O time per layer × --compute-ratio")
      ->capture_default_str();
  command->add_option("--compute-ratio", options->compute_ratio, "compute / I/O time when --compute-ms is 0")
      ->capture_default_str();
  command->add_option("--dir", options->dir, "scratch store folder, removed after (an existing one may hold only a scratch store)")->capture_default_str();
  command->add_option("--device", options->device, "device kind the backend computes on: cpu, cuda or emulated")
      ->capture_default_str();
  command->add_option("--device-budget", options->device_budget, "device memory budget")->capture_default_str();
  command->add_option("--host-budget", options->host_budget, "pinned host budget (below the model: data streams)")
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "alternated repetitions (medians reported)")->capture_default_str();
  command->add_option("--trace", options->trace, "write the last 'both' run's Perfetto/Chrome trace here");
  command->add_option("--verify-reads", options->verify_reads,
                      "the store's read checksums: every read (always), or each layer until seen intact once (once)")
      ->check(CLI::IsMember({"always", "once"}))
      ->capture_default_str();
  command->add_flag("--compute-only", options->compute_only,
                    "run only the compute-only pass, --repeats times (a load to measure other I/O beside; needs --compute-ms)");
  command->add_flag("--json", options->json, "print one JSON object on stdout");
  command->callback([options, &state] {
    Status status = run_overlap(*options);
    if (!status.ok()) state.exit_code = report_error(status.error());
  });
}

}  // namespace strata::cli
