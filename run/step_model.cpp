#include "run/step_model.h"

#include "run/run_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "run/budgets.h"
#include "common/size.h"
#include "kernels/ops.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/cast.h"
#include "memory/store.h"
#include "models/architectures.h"
#include "scheduler/replay.h"

namespace strata {

namespace sch = scheduler;
using Clock = std::chrono::steady_clock;

namespace {

// --- timing ----------------------------------------------------------------------------------

template <typename Fn>
double seconds_of(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Small deterministic values, so the kernels see ordinary floats (no denormals, no NaNs).
void fill_values(float* values, uint64_t count, float scale) {
  for (uint64_t i = 0; i < count; ++i) values[i] = scale * static_cast<float>(static_cast<int64_t>(i % 97) - 48) / 48.0f;
}

// Zeroed through the backend (device memory need not be host memory), waited for: on the CPU
// this faults the pages in before anything is timed.
Result<float*> allocate_floats(device::Device& device, kernels::ComputeBackend& backend,
                               std::vector<device::DeviceBuffer>& held, uint64_t count) {
  STRATA_ASSIGN_OR_RETURN(device::DeviceBuffer buffer, device.allocate(std::max<uint64_t>(count, 1) * 4));
  auto* data = static_cast<float*>(buffer.data());
  STRATA_RETURN_IF_ERROR(backend.zero(data, count));
  STRATA_RETURN_IF_ERROR(backend.synchronize());
  held.push_back(std::move(buffer));
  return data;
}

}  // namespace

namespace {

// The scheduler the trainer creates for this config, as data: its options and its arenas.
struct ReplaySetup {
  sch::SchedulerOptions options;
  sch::ReplayMemory memory;
};

ReplaySetup replay_setup(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run) {
  // As Run::create does (train/trainer.cpp): on the CPU device the device arena keeps only
  // the kernels' scratch and the rest of device.memory joins host.memory in one pool, computed
  // on in place.
  ReplaySetup setup;
  const RunBudgets budgets = run_budgets(config, layout, &run);
  const uint64_t pool_bytes = budgets.pool_bytes;
  setup.memory.device_budget_bytes = budgets.device_region_bytes;
  setup.memory.device_external_bytes = budgets.scratch_bytes;
  setup.options.compute_in_place = budgets.one_pool;
  setup.memory.host_arena_bytes = pool_bytes + host_optimizer_staging_bytes(config, layout, run);
  setup.options.host_budget_bytes = pool_bytes;
  return setup;
}

// How long the trainer holds each plan step: its kernels, timed alone, and the bf16 widening
// of the compute copies it uses.
std::vector<double> step_compute_seconds(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                         const ComputeRates& rates) {
  // A unit is widened when its compute copy is not fp32: the precision's, or a frozen base's dtype.
  auto widen_s = [&](size_t unit) {
    const Unit& u = layout.units()[unit];
    if (layout.quant_layout(unit) != nullptr)
      return rates.dequant_ns_per_element * 1e-9 * static_cast<double>(u.element_count);
    const bool widens = u.frozen ? config.model.adapter.base_dtype != BaseDType::fp32 : config.precision != DType::f32;
    return widens ? rates.widen_ns_per_element * 1e-9 * static_cast<double>(u.element_count) : 0.0;
  };
  // A block's steps widen its adapters too.
  auto block_widen_s = [&](size_t unit) {
    const int64_t block = layout.units()[unit].block_index;
    return widen_s(unit) + (layout.has_adapters() ? widen_s(layout.adapter_unit(block)) : 0.0);
  };
  std::vector<double> seconds;
  seconds.reserve(run.steps.size());
  for (const StepInfo& info : run.steps) {
    switch (info.kind) {
      case StepKind::fwd_embed: seconds.push_back(rates.fwd_embed_s + widen_s(layout.embed_unit())); break;
      case StepKind::fwd_block: seconds.push_back(rates.fwd_block_s + block_widen_s(info.unit)); break;
      case StepKind::head:
        seconds.push_back(rates.head_s + widen_s(layout.ln_f_unit()) + widen_s(layout.embed_unit()));
        break;
      case StepKind::bwd_block: seconds.push_back(rates.bwd_block_s + block_widen_s(info.unit)); break;
      case StepKind::bwd_embed: seconds.push_back(rates.bwd_embed_s); break;
      case StepKind::optimize: {
        const std::vector<OptimChunk>& chunks = run.units[info.unit].optim;
        const uint64_t elements = info.chunk < chunks.size() ? chunks[info.chunk].range.element_count
                                                             : layout.units()[info.unit].element_count;
        seconds.push_back(rates.adamw_ns_per_element * 1e-9 * static_cast<double>(elements));
        break;
      }
    }
  }
  return seconds;
}

}  // namespace

Result<sch::ReplayResult> replay_step(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                      const ComputeRates& rates, double cpu_share) {
  const ReplaySetup setup = replay_setup(config, layout, run);
  sch::ReplayTiming timing;
  timing.compute_s = step_compute_seconds(config, layout, run, rates);
  for (double& seconds : timing.compute_s) seconds *= cpu_share;
  timing.read_bytes_per_s = config.io.read.measured_MBps.value_or(kUntunedReadMBps) * 1e6;
  timing.write_bytes_per_s = config.io.write.measured_MBps.value_or(kUntunedWriteMBps) * 1e6;
  if (!setup.options.compute_in_place && rates.copy_ns_per_byte > 0) {
    // Without a measured link, copies run at the memcpy rate (the CPU device's copy thread).
    timing.h2d_bytes_per_s = 1e9 / rates.copy_ns_per_byte;
    timing.d2h_bytes_per_s = timing.h2d_bytes_per_s;
  }
  return sch::replay_plan(run.plan, setup.options, setup.memory, timing, /*warm_iterations=*/1,
                          /*counted_iterations=*/1);
}

// Enqueues `ops` on the backend and waits for them: the time of the ops themselves, whether the
// backend runs them on the calling thread (CPU) or on a device stream (CUDA).
template <typename Ops>
Result<double> timed(kernels::ComputeBackend& backend, Ops&& ops) {
  const auto start = Clock::now();
  STRATA_RETURN_IF_ERROR(ops());
  STRATA_RETURN_IF_ERROR(backend.synchronize());
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Fills `count` floats of the backend's device memory with `fill`: in place where that memory is
// host memory (no second copy: the timing must not raise the run's RSS past its budgets),
// through a host staging vector and a waited copy where it is not.
template <typename Fill>
Status fill_device(device::Device& device, kernels::ComputeBackend& backend, float* dst, uint64_t count, Fill&& fill) {
  if (backend.is_host()) {
    fill(dst);
    return Status();
  }
  std::vector<float> staging(count);
  fill(staging.data());
  STRATA_RETURN_IF_ERROR(device.copy_to_device(backend.compute_stream(), dst, staging.data(), count * 4));
  return device.synchronize(backend.compute_stream());
}

Result<ComputeRates> measure_compute(const TrainConfig& config, const ModelLayout& layout, device::Device& device,
                                     kernels::ComputeBackend& backend) {
  const auto start = Clock::now();
  ComputeRates rates;
  rates.backend = backend.name();
  const models::ModelDefinition& model = layout.definition();
  const kernels::BatchShape shape{config.batch_size, config.model.seq_len};
  const auto rows = static_cast<uint64_t>(shape.rows());
  const auto width = static_cast<uint64_t>(model.n_embd());
  const auto vocab = static_cast<uint64_t>(config.model.vocab_size);
  std::vector<int32_t> tokens(rows), targets(rows);
  for (uint64_t i = 0; i < rows; ++i) {
    tokens[i] = static_cast<int32_t>((i * 31) % vocab);
    targets[i] = static_cast<int32_t>((i * 17 + 5) % vocab);
  }
  STRATA_RETURN_IF_ERROR(backend.begin_step({tokens.data(), targets.data(), shape.rows()}));
  const uint64_t workspace_bytes = model.workspace_size_bytes(backend, shape);
  auto init_unit = [&](size_t unit, float* dst) {
    return fill_device(device, backend, dst, layout.units()[unit].element_count,
                       [&](float* values) { layout.initialize_unit(unit, config.model.seed, values); });
  };
  auto init_values = [&](float* dst, uint64_t count, float scale) {
    return fill_device(device, backend, dst, count, [&](float* values) { fill_values(values, count, scale); });
  };

  {  // Phase 1: one block, forward and backward with recompute, and widening its weights.
    std::vector<device::DeviceBuffer> held;
    const Unit& block = layout.units()[layout.block_unit(0)];
    const uint64_t n = block.element_count;
    STRATA_ASSIGN_OR_RETURN(float* workspace, allocate_floats(device, backend, held, workspace_bytes / 4 + 1));
    STRATA_ASSIGN_OR_RETURN(float* weights, allocate_floats(device, backend, held, n));
    STRATA_ASSIGN_OR_RETURN(float* grads, allocate_floats(device, backend, held, n));
    STRATA_ASSIGN_OR_RETURN(float* x_in, allocate_floats(device, backend, held, rows * width));
    STRATA_ASSIGN_OR_RETURN(float* x_out, allocate_floats(device, backend, held, rows * width));
    STRATA_ASSIGN_OR_RETURN(float* d_x, allocate_floats(device, backend, held, rows * width));
    STRATA_RETURN_IF_ERROR(init_unit(layout.block_unit(0), weights));
    STRATA_RETURN_IF_ERROR(init_values(x_in, rows * width, 1.0f));
    STRATA_RETURN_IF_ERROR(init_values(d_x, rows * width, 1e-3f));
    const kernels::Workspace ws{workspace, workspace_bytes};
    if (config.precision != DType::f32 ||
        (layout.has_adapters() && config.model.adapter.base_dtype == BaseDType::bf16)) {
      // The bf16 copy goes into the gradient buffer's bytes (free until backward).
      auto* bits = reinterpret_cast<uint16_t*>(grads);
      STRATA_RETURN_IF_ERROR(backend.cast_fp32_to_bf16(weights, bits, n));
      STRATA_ASSIGN_OR_RETURN(double seconds, timed(backend, [&] { return backend.cast_bf16_to_fp32(bits, weights, n); }));
      rates.widen_ns_per_element = seconds * 1e9 / static_cast<double>(n);
    }
    // Blocks are most of a step: each is timed twice and the faster kept, so one
    // interruption on a shared machine does not skew the whole prediction.
    // LoRA: the block's adapters ride along, the frozen block takes no gradient and the
    // adapters' unit does (train/trainer.cpp computes it so).
    std::optional<kernels::lora::BlockAdapters> adapters;
    float* trained_grads = grads;
    uint64_t trained_n = n;
    if (layout.has_adapters()) {
      const size_t adapter_unit = layout.adapter_unit(0);
      trained_n = layout.units()[adapter_unit].element_count;
      const DeviceScratchSizes sizes = device_scratch(config, layout);
      STRATA_ASSIGN_OR_RETURN(float* adapter_weights, allocate_floats(device, backend, held, trained_n));
      STRATA_ASSIGN_OR_RETURN(trained_grads, allocate_floats(device, backend, held, trained_n));
      STRATA_ASSIGN_OR_RETURN(float* lora_scratch,
                              allocate_floats(device, backend, held, sizes.lora_scratch_bytes / 4 + 1));
      STRATA_RETURN_IF_ERROR(init_unit(adapter_unit, adapter_weights));
      adapters = layout.bind_adapters(0, adapter_weights, trained_grads, static_cast<float>(config.model.adapter.dropout),
                                      1, kernels::Workspace{lora_scratch, sizes.lora_scratch_bytes});
    }
    if (const kernels::quant::UnitLayout* quantized = layout.quant_layout(layout.block_unit(0))) {
      // The quantised base's widening is its dequantisation (into the weights, from a quantised
      // copy of them in the gradient buffer's bytes, before the timed passes).
      STRATA_ASSIGN_OR_RETURN(float* packed, allocate_floats(device, backend, held, quantized->size_bytes / 4 + 16));
      STRATA_ASSIGN_OR_RETURN(double seconds, timed(backend, [&] {
        return backend.dequantize_unit(*quantized, packed, weights);
      }));
      rates.dequant_ns_per_element = seconds * 1e9 / static_cast<double>(n);
      STRATA_RETURN_IF_ERROR(init_unit(layout.block_unit(0), weights));
    }
    rates.fwd_block_s = std::numeric_limits<double>::max();
    rates.bwd_block_s = std::numeric_limits<double>::max();
    for (int repeat = 0; repeat < 2; ++repeat) {
      STRATA_ASSIGN_OR_RETURN(double forward, timed(backend, [&] {
        return model.block_forward(backend, shape, weights, x_in, x_out, ws, adapters ? &*adapters : nullptr);
      }));
      STRATA_ASSIGN_OR_RETURN(double backward, timed(backend, [&]() -> Status {
        STRATA_RETURN_IF_ERROR(backend.zero(trained_grads, trained_n));
        STRATA_RETURN_IF_ERROR(model.block_backward(backend, shape, weights, x_in, d_x, d_x,
                                                    adapters ? nullptr : grads, ws, true,
                                                    adapters ? &*adapters : nullptr));
        return backend.sum_squares(trained_grads, trained_n);
      }));
      rates.fwd_block_s = std::min(rates.fwd_block_s, forward);
      rates.bwd_block_s = std::min(rates.bwd_block_s, backward);
    }
  }
  {  // Phase 2: the embeddings and the head (LayerNorm, tied LM head, loss).
    std::vector<device::DeviceBuffer> held;
    const uint64_t embed_n = layout.units()[layout.embed_unit()].element_count;
    const uint64_t ln_f_n = layout.units()[layout.ln_f_unit()].element_count;
    STRATA_ASSIGN_OR_RETURN(float* workspace, allocate_floats(device, backend, held, workspace_bytes / 4 + 1));
    STRATA_ASSIGN_OR_RETURN(float* embed, allocate_floats(device, backend, held, embed_n));
    STRATA_ASSIGN_OR_RETURN(float* embed_grads, allocate_floats(device, backend, held, embed_n));
    STRATA_ASSIGN_OR_RETURN(float* ln_f, allocate_floats(device, backend, held, ln_f_n));
    STRATA_ASSIGN_OR_RETURN(float* ln_f_grads, allocate_floats(device, backend, held, ln_f_n));
    STRATA_ASSIGN_OR_RETURN(float* x, allocate_floats(device, backend, held, rows * width));
    STRATA_ASSIGN_OR_RETURN(float* d_x, allocate_floats(device, backend, held, rows * width));
    STRATA_RETURN_IF_ERROR(init_unit(layout.embed_unit(), embed));
    STRATA_RETURN_IF_ERROR(init_unit(layout.ln_f_unit(), ln_f));
    STRATA_ASSIGN_OR_RETURN(rates.fwd_embed_s,
                            timed(backend, [&] { return model.embedding_forward(backend, shape, embed, x); }));
    const kernels::Workspace ws{workspace, workspace_bytes};
    // A frozen head (LoRA) gives grad.x alone.
    const bool frozen = layout.has_adapters();
    STRATA_ASSIGN_OR_RETURN(rates.head_s, timed(backend, [&]() -> Status {
      if (frozen) return model.head_forward_backward(backend, shape, ln_f, embed, x, d_x, nullptr, nullptr, ws);
      STRATA_RETURN_IF_ERROR(backend.zero(embed_grads, embed_n));
      STRATA_RETURN_IF_ERROR(backend.zero(ln_f_grads, ln_f_n));
      STRATA_RETURN_IF_ERROR(
          model.head_forward_backward(backend, shape, ln_f, embed, x, d_x, ln_f_grads, embed_grads, ws));
      return backend.sum_squares(ln_f_grads, ln_f_n);
    }));
    STRATA_ASSIGN_OR_RETURN(rates.bwd_embed_s, timed(backend, [&]() -> Status {
      STRATA_RETURN_IF_ERROR(model.embedding_backward(backend, shape, d_x, embed_grads));
      return backend.sum_squares(embed_grads, embed_n);
    }));
  }
  {  // Phase 3: the optimizer over one chunk (or less: the rate per element is what counts),
     // laid out and cut into kernel calls as the run's optimizer does it (optim/state.h).
    std::vector<device::DeviceBuffer> held;
    const optim::StateLayout state = config.optimizer.state();
    const uint64_t count = std::min<uint64_t>(layout.largest_unit_elements(), uint64_t{4} << 20);
    // One decayed tensor: under adamw8bit an 8-bit one (the bulk of a model's elements).
    const optim::TensorSpan whole{0, count, true};
    const uint64_t chunk_bytes = state.chunk_bytes({&whole, 1}, 0, count);
    const uint64_t chunk_floats = (chunk_bytes + sizeof(float) - 1) / sizeof(float);
    STRATA_ASSIGN_OR_RETURN(float* optim, allocate_floats(device, backend, held, chunk_floats));
    STRATA_ASSIGN_OR_RETURN(float* grads, allocate_floats(device, backend, held, count));
    STRATA_ASSIGN_OR_RETURN(float* params, allocate_floats(device, backend, held, count));
    STRATA_RETURN_IF_ERROR(fill_device(device, backend, optim, chunk_floats, [&](float* values) {
      std::vector<float> master(count);
      fill_values(master.data(), count, 0.02f);
      state.initialize({&whole, 1}, 0, count, master.data(), reinterpret_cast<std::byte*>(values));
    }));
    STRATA_RETURN_IF_ERROR(init_values(grads, count, 1e-3f));
    const kernels::AdamWConfig adamw{config.optimizer.lr, config.optimizer.beta1, config.optimizer.beta2,
                                     config.optimizer.eps, config.optimizer.weight_decay};
    std::vector<kernels::AdamWChunk> pieces;
    auto update = [&](int64_t t) -> Status {
      uint16_t* copy = config.precision == DType::bf16 ? reinterpret_cast<uint16_t*>(params) : nullptr;
      state.update_pieces(adamw, static_cast<uint64_t>(t - 1), {&whole, 1}, 0, count,
                          reinterpret_cast<std::byte*>(optim), grads, copy, pieces);
      for (const kernels::AdamWChunk& piece : pieces) STRATA_RETURN_IF_ERROR(backend.adamw(piece));
      return Status();
    };
    STRATA_RETURN_IF_ERROR(timed(backend, [&] { return update(1); }).status());  // the first pays for TBB's threads
    STRATA_ASSIGN_OR_RETURN(double seconds, timed(backend, [&] { return update(2); }));
    rates.adamw_ns_per_element = seconds * 1e9 / static_cast<double>(count);
    // Host work beside the kernels: a large memcpy (the CPU device's copies) and the store's
    // checksum — on these buffers where they are host memory, else on host memory of the size.
    std::vector<float> host_copy;
    float* source = optim;
    float* target = params;
    if (!backend.is_host()) {
      host_copy.resize(chunk_floats + count);
      fill_values(host_copy.data(), chunk_floats, 0.02f);
      source = host_copy.data();
      target = host_copy.data() + chunk_floats;
    }
    const uint64_t bytes = count * 4;
    rates.copy_ns_per_byte = seconds_of([&] { std::memcpy(target, source, bytes); }) * 1e9 / static_cast<double>(bytes);
    volatile uint64_t digest = 0;
    rates.hash_ns_per_byte =
        seconds_of([&] { digest = memory::extent_checksum(source, chunk_bytes); }) * 1e9 /
        static_cast<double>(chunk_bytes);
    (void)digest;
  }
  rates.measure_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return rates;
}

StepPrediction predict_step(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                            const ComputeRates& rates) {
  StepPrediction p;
  const std::vector<double> step_seconds = step_compute_seconds(config, layout, run, rates);
  for (double seconds : step_seconds) p.compute_s += seconds;
  p.tuned = config.io.read.measured_MBps.has_value() && config.io.write.measured_MBps.has_value();
  p.read_MBps = config.io.read.measured_MBps.value_or(kUntunedReadMBps);
  p.write_MBps = config.io.write.measured_MBps.value_or(kUntunedWriteMBps);
  // The CPU device's copies and the checksums take CPU time from the same cores as the
  // kernels, which use all of them: spread over the cores, they lengthen every step's compute
  // in proportion. Their bytes come from the replay, which needs the compute times: replay once
  // with the kernels alone, then again with the steps lengthened by what that one moved.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  double cpu_share = 1.0;
  for (int round = 0; round < 2; ++round) {
    Result<sch::ReplayResult> replayed = replay_step(config, layout, run, rates, cpu_share);
    if (!replayed.ok()) {
      p.replay_error = replayed.status().to_string();
      break;
    }
    const sch::ReplayResult& r = *replayed;
    p.traffic.nvme_read_bytes = r.bytes[static_cast<size_t>(sch::TierPair::nvme_to_host)];
    p.traffic.nvme_write_bytes = r.bytes[static_cast<size_t>(sch::TierPair::host_to_nvme)];
    p.traffic.host_to_device_bytes = r.bytes[static_cast<size_t>(sch::TierPair::host_to_device)];
    p.traffic.device_to_host_bytes = r.bytes[static_cast<size_t>(sch::TierPair::device_to_host)];
    p.replay_step_s = r.iteration_s;
    p.stall_s = r.stall_s;
    const auto copied = static_cast<double>(p.traffic.host_to_device_bytes + p.traffic.device_to_host_bytes);
    // Every write is hashed. A steady step reads only what earlier steps wrote, so under
    // nvme.verify_reads: once its reads are trusted, not hashed again (memory/store.h).
    const uint64_t hashed_reads = config.verify_reads == memory::VerifyReads::always ? p.traffic.nvme_read_bytes : 0;
    const auto hashed = static_cast<double>(hashed_reads + p.traffic.nvme_write_bytes);
    p.copy_cpu_s = copied * rates.copy_ns_per_byte * 1e-9;
    p.hash_cpu_s = hashed * rates.hash_ns_per_byte * 1e-9;
    if (p.compute_s <= 0) break;
    cpu_share = (p.compute_s + (p.copy_cpu_s + p.hash_cpu_s) / cores) / p.compute_s;
  }
  // One drive path serves both directions: reads and writes share it.
  p.io_s = static_cast<double>(p.traffic.nvme_read_bytes) / (p.read_MBps * 1e6) +
           static_cast<double>(p.traffic.nvme_write_bytes) / (p.write_MBps * 1e6);
  const double compute_side = p.compute_s + (p.copy_cpu_s + p.hash_cpu_s) / cores;
  // The replay's step already holds the waits for data; the floors cover its edges (a
  // transfer that began in the iteration before).
  p.step_s = std::max({p.replay_step_s, p.io_s, compute_side});
  p.bound = p.io_s > compute_side ? "NVMe" : "compute";
  return p;
}

namespace {

struct KindBytes {
  const char* kind;
  Tier tier;
  uint64_t bytes;
};

template <typename... Args>
void append_line(std::string& out, fmt::format_string<Args...> format, Args&&... args) {
  out += fmt::format(format, std::forward<Args>(args)...);
  out += '\n';
}

std::vector<KindBytes> kinds_of(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run) {
  uint64_t params = 0, grads = 0, optim = 0;
  for (size_t u = 0; u < run.units.size(); ++u) {
    if (run.units[u].params != kNoTensor) params += run.plan.tensors()[run.units[u].params].size_bytes;
    if (!run.units[u].frozen) grads += layout.units()[u].element_count * 4;  // a frozen base has none
    for (const OptimChunk& chunk : run.units[u].optim)
      if (chunk.tensor != kNoTensor) optim += run.plan.tensors()[chunk.tensor].size_bytes;
  }
  const uint64_t activations = static_cast<uint64_t>(config.model.n_layer + 2) *
                               run.plan.tensors()[run.activations[0]].size_bytes;
  return {{"parameters (compute copy)", config.placement.params, params},
          {"gradients", config.placement.grads, grads},
          {"optimizer (master, m, v)", config.placement.optimizer, optim},
          {"activations (block inputs)", Tier::host, activations}};
}

}  // namespace

std::string format_plan(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                        const ComputeRates& rates, const StepPrediction& p) {
  std::string out;
  const DeviceScratchSizes scratch = device_scratch(config, layout, &run);
  const auto parameters = static_cast<double>(layout.parameter_count());
  const ModelConfig& m = config.model;
  const char* biases = m.o_proj_bias ? ", q/k/v/o biases" : m.qkv_bias ? ", q/k/v biases" : "";
  const std::string heads = m.decoder_keys() ? fmt::format("{} heads ({} k/v) of {}{}, MLP {}, {} head", m.n_head,
                                                            m.kv_heads(), m.head_size(), biases, m.intermediate_size,
                                                            m.tie_word_embeddings ? "tied" : "untied")
                                              : fmt::format("{} heads", m.n_head);
  // A step is one update: with gradient accumulation, K micro-batches of batch_size rows, and
  // the plan (so the prediction) holds all K forward/backward passes.
  const uint32_t micro_batches = config.gradient_accumulation_steps;
  append_line(out, "{}: {}, {} layers × {} wide, {}, vocab {}: {} parameters; {} tokens per step ({}{} × {})",
       config.source_path, models::architecture_of(m).label, m.n_layer, m.n_embd, heads, m.vocab_size,
       parameters >= 1e9 ? fmt::format("{:.2f} B", parameters * 1e-9) : fmt::format("{:.1f} M", parameters * 1e-6),
       uint64_t{config.batch_size} * config.model.seq_len * micro_batches,
       micro_batches > 1 ? fmt::format("{} micro-batches × ", micro_batches) : std::string(), config.batch_size,
       config.model.seq_len);
  append_line(out, "");
  append_line(out, "where the state lives (its lasting home; the device holds what a step needs, streamed in):");
  for (const KindBytes& kind : kinds_of(config, layout, run))
    append_line(out, "  {:<28} {:>7}  {:>10}{}", kind.kind, tier_name(kind.tier), format_size(kind.bytes),
                kind.tier != Tier::device ? ""
                : micro_batches > 1 ? "  (all of them, on the device for the whole update: its K micro-batches sum into them)"
                                    : "  (one unit at a time: each is consumed by its update at once)");
  append_line(out, "  {:<28} {:>7}  ({})", "optimizer step runs on", optimizer_site_name(run.optimizer_site),
              optimizer_site_reason(config));
  if (run.interleaved_updates)
    append_line(out, "  {:<28} {:>7}  (each unit's, just before its forward in the next step: optimizer.interleave)",
                "clipped updates run", "next step");
  append_line(out, "");
  append_line(out, "what each tier holds:");
  uint64_t host_homed = 0, nvme_homed = 0;
  for (const sch::PlanTensor& tensor : run.plan.tensors())
    (tensor.home == sch::Home::host ? host_homed : nvme_homed) += tensor.size_bytes;
  const RunBudgets budgets = run_budgets(config, layout, &run);
  const char* grads_note = config.placement.grads == Tier::device ? " (incl. gradients)" : "";
  if (budgets.one_pool) {
    append_line(out, "  device + host {} + {}: one pool on the CPU device (device memory is host memory), computed on in place",
                format_size(config.device_memory_bytes), format_size(config.host_memory_bytes));
    append_line(out, "                {:>10} kernel workspace and scratch{}", format_size(budgets.device_region_bytes),
                grads_note);
    append_line(out, "                {:>10} for the scheduler: {} homed there, the rest stages NVMe traffic",
                format_size(budgets.pool_bytes), format_size(host_homed));
  } else {
    append_line(out, "  device  {:>10} budget: {} kernel workspace and scratch{}, the rest streamed step by step",
                format_size(config.device_memory_bytes), format_size(scratch.total()), grads_note);
    append_line(out, "  host    {:>10} budget: {} homed there, the rest stages NVMe traffic",
                format_size(config.host_memory_bytes), format_size(host_homed));
  }
  append_line(out, "  nvme    {:>10} of state in the store (which reserves two versions of what a commit rewrites: {})",
              format_size(nvme_homed), format_size(training_store_capacity_bytes(run)));
  append_line(out, "");
  append_line(out, "bytes moved per step (the scheduler's own policy replayed on a simulated clock):");
  if (!p.replay_error.empty()) append_line(out, "  the replay could not run the plan: {}", p.replay_error);
  append_line(out, "  nvme → host    {:>10}", format_size(p.traffic.nvme_read_bytes));
  append_line(out, "  host → nvme    {:>10}", format_size(p.traffic.nvme_write_bytes));
  append_line(out, "  host → device  {:>10}", format_size(p.traffic.host_to_device_bytes));
  append_line(out, "  device → host  {:>10}", format_size(p.traffic.device_to_host_bytes));
  append_line(out, "");
  append_line(out, "compute, each kernel timed alone at this shape (measuring took {:.1f} s):", rates.measure_seconds);
  append_line(out, "  block forward {:.3f} s, backward with recompute {:.3f} s (× {}), head {:.3f} s, embeddings {:.3f} s,",
       rates.fwd_block_s, rates.bwd_block_s, config.model.n_layer, rates.head_s, rates.fwd_embed_s + rates.bwd_embed_s);
  append_line(out, "  AdamW {:.2f} ns/parameter, bf16 widening {:.2f} ns/element{}", rates.adamw_ns_per_element,
       rates.widen_ns_per_element,
       rates.dequant_ns_per_element > 0
           ? fmt::format(", {} dequantisation {:.2f} ns/element", base_dtype_name(config.model.adapter.base_dtype),
                         rates.dequant_ns_per_element)
           : std::string());
  append_line(out, "  compute-only step        {:8.2f} s", p.compute_s);
  append_line(out, "  + copies and checksums   {:8.2f} s of CPU time (memcpy {:.2f} GB/s, xxh3 {:.2f} GB/s of {}), shared by {} cores",
       p.copy_cpu_s + p.hash_cpu_s, rates.copy_ns_per_byte > 0 ? 1.0 / rates.copy_ns_per_byte : 0.0,
       rates.hash_ns_per_byte > 0 ? 1.0 / rates.hash_ns_per_byte : 0.0,
       config.verify_reads == memory::VerifyReads::always ? "writes and reads" : "writes; reads trusted: verify_reads once",
       std::max(1u, std::thread::hardware_concurrency()));
  append_line(out, "NVMe at {:.0f} MB/s read, {:.0f} MB/s write{}:", p.read_MBps, p.write_MBps,
       p.tuned ? " (tuned)" : " (untuned defaults: run `strata tune` and give its file as nvme.io_file)");
  append_line(out, "  I/O floor                {:8.2f} s", p.io_s);
  append_line(out, "  replayed step            {:8.2f} s  (of which {:.2f} s waiting for data)", p.replay_step_s, p.stall_s);
  append_line(out, "");
  append_line(out, "predicted step time        {:8.2f} s  ({}-bound; {:.0f} tokens/s)", p.step_s, p.bound,
       static_cast<double>(uint64_t{config.batch_size} * config.model.seq_len * micro_batches) / p.step_s);
  // What was measured and what assumed, when the kernels did not run where the config trains.
  // Only cuda's kernels can be missing here: emulated runs the CPU backend by design.
  if (config.device_kind == "cuda" && rates.backend != "cuda")
    append_line(out, "note: device.kind is {} but the kernels were timed on the {} backend (no {} device here): the "
                "compute figures are assumed from it, only the I/O figures{} apply to the run",
                config.device_kind, rates.backend, config.device_kind, p.tuned ? " (measured by strata tune)" : "");
  else if (rates.backend != "cpu")
    append_line(out, "measured: the kernels on the {} backend and{} NVMe rates; assumed: host copies and checksums "
                "overlap the device's compute", rates.backend, p.tuned ? " the tuned" : " untuned default");
  return out;
}

nlohmann::ordered_json plan_json(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                                 const ComputeRates& rates, const StepPrediction& p) {
  nlohmann::ordered_json placement = nlohmann::ordered_json::object();
  for (const KindBytes& kind : kinds_of(config, layout, run))
    placement[kind.kind] = {{"tier", tier_name(kind.tier)}, {"bytes", kind.bytes}};
  return {{"config", config.source_path},
          {"parameters", layout.parameter_count()},
          {"placement", placement},
          {"optimizer_site", optimizer_site_name(run.optimizer_site)},
          {"optimizer_site_reason", optimizer_site_reason(config)},
          {"interleaved_updates", run.interleaved_updates},
          {"device_budget_bytes", config.device_memory_bytes},
          {"device_scratch_bytes", device_scratch(config, layout, &run).total()},
          {"host_budget_bytes", config.host_memory_bytes},
          {"nvme_read_bytes", p.traffic.nvme_read_bytes},
          {"nvme_write_bytes", p.traffic.nvme_write_bytes},
          {"host_to_device_bytes", p.traffic.host_to_device_bytes},
          {"device_to_host_bytes", p.traffic.device_to_host_bytes},
          {"fwd_block_s", rates.fwd_block_s},
          {"bwd_block_s", rates.bwd_block_s},
          {"head_s", rates.head_s},
          {"adamw_ns_per_element", rates.adamw_ns_per_element},
          {"compute_s", p.compute_s},
          {"copy_cpu_s", p.copy_cpu_s},
          {"hash_cpu_s", p.hash_cpu_s},
          {"verify_reads", memory::verify_reads_name(config.verify_reads)},
          {"read_MBps", p.read_MBps},
          {"write_MBps", p.write_MBps},
          {"tuned", p.tuned},
          {"io_floor_s", p.io_s},
          {"replay_step_s", p.replay_step_s},
          {"replay_stall_s", p.stall_s},
          {"predicted_step_s", p.step_s},
          {"bound", p.bound}};
}

}  // namespace strata
