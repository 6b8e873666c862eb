#include "run/train_plan.h"

#include <algorithm>
#include <cassert>

#include <fmt/format.h>

#include "common/size.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/lora/lora.h"
#include "device/device.h"

namespace strata {

namespace sch = scheduler;

std::string params_name(const Unit& unit) { return "params." + unit.name; }
std::string grads_name(const Unit& unit) { return "grads." + unit.name; }
std::string optim_name(const Unit& unit, size_t chunk, size_t chunk_count) {
  // One chunk keeps the plain name, so small models' stores read as they always have.
  return chunk_count == 1 ? "optim." + unit.name : fmt::format("optim.{}.{}", unit.name, chunk);
}
std::string params_share_name(const Unit& unit, size_t first_chunk, size_t last_chunk, size_t chunk_count) {
  if (first_chunk == 0 && last_chunk + 1 == chunk_count) return params_name(unit);
  return fmt::format("params.{}.{}-{}", unit.name, first_chunk, last_chunk);
}

namespace {

sch::Home home_of(Tier tier) { return tier == Tier::nvme ? sch::Home::nvme : sch::Home::host; }

// ZeRO stage 3: `rank`'s share of `unit`'s compute copy — the elements of the optimizer chunks
// it owns (`unit_owners`, one entry per chunk), which are one contiguous run (the partition is
// contiguous in model order) — added to `run` as its P. None when it owns none of the unit.
// Training and evaluation plans both take it from here, so they name the same store tensors.
void add_params_share(TrainPlan& run, const TrainConfig& config, const Unit& unit, const std::vector<int>& unit_owners,
                      int rank, UnitIds& ids) {
  const std::vector<ElementRange> chunks = optim_chunks(unit, config.optimizer.chunk_elements, config.optimizer.state());
  size_t first = chunks.size(), last = 0;
  for (size_t c = 0; c < chunks.size(); ++c)
    if (unit_owners[c] == rank) first = std::min(first, c), last = c;
  if (first == chunks.size()) {
    ids.params_range = ElementRange{0, 0};
    return;
  }
  ids.params_range = ElementRange{chunks[first].begin_elements,
                                  chunks[last].begin_elements + chunks[last].element_count - chunks[first].begin_elements};
  ids.params = run.plan.add_tensor(params_share_name(unit, first, last, chunks.size()),
                                   ids.params_range.element_count * dtype_size_bytes(config.precision),
                                   home_of(config.placement.params));
}

// Stage 3's lookahead: each gathering step also reads the shares of the next gathering step's
// units (`gathers`, the units of every gathering step in step order), so they are resident when
// that step's gather starts during this one's compute. Each call is the next gathering step.
class GatherLookahead {
 public:
  GatherLookahead(const TrainPlan& run, std::vector<std::vector<size_t>> gathers)
      : run_(run), gathers_(std::move(gathers)) {}
  std::vector<sch::TensorId> reads(std::vector<sch::TensorId> reads) {
    if (!run_.params_gathered) return reads;
    ++index_;
    if (index_ < gathers_.size())
      for (size_t unit : gathers_[index_])
        if (std::find(reads.begin(), reads.end(), run_.units[unit].params) == reads.end())
          reads.push_back(run_.units[unit].params);
    return reads;
  }

 private:
  const TrainPlan& run_;
  std::vector<std::vector<size_t>> gathers_;
  size_t index_ = 0;
};

}  // namespace

const char* optimizer_site_name(OptimizerSite site) { return site == OptimizerSite::host ? "host" : "device"; }

OptimizerSite optimizer_site(const TrainConfig& config) {
  // Host memory computed on in place is already where a host update would run.
  return !device::memory_is_host(config.device_kind) && config.placement.optimizer == Tier::host
             ? OptimizerSite::host
             : OptimizerSite::device;
}

std::string optimizer_site_reason(const TrainConfig& config) {
  if (device::memory_is_host(config.device_kind)) return "the CPU backend updates the state in place";
  switch (config.placement.optimizer) {
    case Tier::device: return "the device's AdamW on the device-homed state";
    case Tier::host:
      return config.optimizer.grad_clip > 0
                 ? "CPU AdamW on the host-homed state, gradients device→host; after the global norm (grad_clip)"
                 : "CPU AdamW on the host-homed state, gradients device→host, overlapped with the next backward";
    case Tier::nvme:
      return "the device's AdamW: NVMe-homed state is staged through the device (no NVMe→host-only step yet)";
  }
  return "";
}

bool interleaved_updates(const TrainConfig& config, bool zero) {
  // Without clipping the updates already follow their backward. The host site has its own
  // overlap (CPU AdamW beside the device's backward), and ZeRO's updates take part in a
  // collective per step, which expects them after that step's backward.
  // With gradient accumulation the updates follow the last micro-batch: a pass of K
  // micro-batches already has K forwards and backwards to amortize the update's I/O over.
  return config.optimizer.grad_clip > 0 && config.optimizer.interleave && !zero &&
         optimizer_site(config) == OptimizerSite::device && config.gradient_accumulation_steps == 1;
}

TrainPlan build_train_plan(const TrainConfig& config, const ModelLayout& layout,
                           const std::vector<std::vector<int>>& owners, int rank) {
  TrainPlan run;
  run.optimizer_site = optimizer_site(config);
  const uint32_t param_bytes = dtype_size_bytes(config.precision);
  const optim::StateLayout state = config.optimizer.state();
  const bool scratch_grads = config.placement.grads == Tier::device;
  run.params_gathered = !owners.empty() && config.parallel.zero_stage >= 3;
  run.interleaved_updates = interleaved_updates(config, !owners.empty());
  for (const Unit& unit : layout.units()) {
    const size_t unit_index = run.units.size();
    UnitIds ids;
    if (unit.frozen) {
      // The frozen base (LoRA): P alone, in the base's dtype, read by the steps and never written.
      ids.frozen = true;
      ids.params_range = ElementRange{0, unit.element_count};
      ids.params = run.plan.add_tensor(params_name(unit), params_size_bytes(config, layout, unit_index),
                                       home_of(config.placement.params));
      run.units.push_back(std::move(ids));
      continue;
    }
    const std::vector<ElementRange> chunks = optim_chunks(unit, config.optimizer.chunk_elements, state);
    const std::vector<optim::TensorSpan> spans = optim_spans(unit);
    ids.params_range = ElementRange{0, unit.element_count};
    if (run.params_gathered) {
      add_params_share(run, config, unit, owners[unit_index], rank, ids);
    } else {
      ids.params = run.plan.add_tensor(params_name(unit), unit.element_count * param_bytes,
                                       home_of(config.placement.params));
    }
    if (!scratch_grads)
      ids.grads = run.plan.add_tensor(grads_name(unit), unit.element_count * 4, home_of(config.placement.grads));
    for (size_t c = 0; c < chunks.size(); ++c) {
      OptimChunk chunk;
      chunk.range = chunks[c];
      if (!owners.empty() && owners[unit_index][c] != rank) {  // another rank's (ZeRO)
        ids.optim.push_back(chunk);
        continue;
      }
      // On the host site the chunk never leaves host memory: the host update reads it where it
      // lives (train/trainer.cpp), so it is the host's alone, in no step.
      chunk.tensor = run.optimizer_site == OptimizerSite::host
                         ? run.plan.add_host_only_tensor(optim_name(unit, c, chunks.size()),
                                                         state.chunk_bytes(spans, chunks[c].begin_elements,
                                                                           chunks[c].element_count))
                         : run.plan.add_tensor(optim_name(unit, c, chunks.size()),
                                               state.chunk_bytes(spans, chunks[c].begin_elements,
                                                                 chunks[c].element_count),
                                               home_of(config.placement.optimizer));
      ids.optim.push_back(chunk);
    }
    run.units.push_back(std::move(ids));
  }
  const uint64_t activation_bytes = uint64_t{config.batch_size} * config.model.seq_len * config.model.n_embd * 4;
  for (uint32_t i = 0; i <= config.model.n_layer; ++i)
    run.activations.push_back(run.plan.add_tensor("act." + std::to_string(i), activation_bytes, sch::Home::host));
  run.d_x = run.plan.add_tensor("grad.x", activation_bytes, sch::Home::host);

  auto add = [&](std::string name, StepInfo info, std::vector<sch::TensorId> reads,
                 std::vector<sch::TensorId> writes) {
    std::erase(reads, kNoTensor);
    std::erase(writes, kNoTensor);
    run.plan.add_step(std::move(name), std::move(reads), std::move(writes));
    run.steps.push_back(info);
  };
  auto optimize = [&](size_t unit) {
    const UnitIds& ids = run.units[unit];
    for (size_t c = 0; c < ids.optim.size(); ++c) {
      std::string name = "opt." + layout.units()[unit].name;
      if (ids.optim.size() > 1) name += "." + std::to_string(c);
      if (run.params_gathered) {
        // Stage 3: the owner rewrites its chunk's range of its share of P, and nothing else
        // (no broadcast: the next step's gathers bring it); another rank's chunk only joins the
        // step's clip-scale collective.
        const bool owned = ids.optim[c].tensor != kNoTensor;
        const bool whole_share = ids.params_range.begin_elements == ids.optim[c].range.begin_elements &&
                                 ids.params_range.element_count == ids.optim[c].range.element_count;
        const sch::TensorId share = owned ? ids.params : kNoTensor;
        const sch::TensorId optim = run.optimizer_site == OptimizerSite::host ? kNoTensor : ids.optim[c].tensor;
        add(std::move(name), StepInfo{StepKind::optimize, unit, c, run.optimizer_site},
            {ids.grads, optim, whole_share ? kNoTensor : share}, {optim, share});
        continue;
      }
      // The update rewrites P from the master weights. Split in chunks, each rewrites only its
      // own range, so P must also be read (loaded) for the rest to stay valid.
      // Interleaved, P is always read: an opt step without math (no pending gradients) must
      // write back the bytes it loaded, and the forward after it loads P anyway.
      const sch::TensorId params_read = ids.optim.size() > 1 || run.interleaved_updates ? ids.params : kNoTensor;
      // On the host site the chunk stays in host memory: not a tensor of the device step.
      const sch::TensorId optim = run.optimizer_site == OptimizerSite::host ? kNoTensor : ids.optim[c].tensor;
      add(std::move(name), StepInfo{StepKind::optimize, unit, c, run.optimizer_site}, {ids.grads, optim, params_read},
          {optim, ids.params});
    }
  };
  const size_t embed = layout.embed_unit();
  const size_t ln_f = layout.ln_f_unit();
  const uint32_t n_layer = config.model.n_layer;
  const bool clip = config.optimizer.grad_clip > 0;
  // LoRA: a block's steps also read its adapters (and the backward writes their gradients), and
  // the block's update is its adapters' (the frozen base has no optimizer chunks).
  auto adapter_of = [&](size_t block_unit) -> const UnitIds* {
    if (!layout.has_adapters()) return nullptr;
    return &run.units[layout.adapter_unit(layout.units()[block_unit].block_index)];
  };
  auto adapter_params = [&](size_t block_unit) { return adapter_of(block_unit) ? adapter_of(block_unit)->params : kNoTensor; };
  auto adapter_grads = [&](size_t block_unit) { return adapter_of(block_unit) ? adapter_of(block_unit)->grads : kNoTensor; };
  auto optimize_block = [&](size_t block_unit) {
    optimize(block_unit);
    if (layout.has_adapters()) optimize(layout.adapter_unit(layout.units()[block_unit].block_index));
  };

  // Stage 3: the units each gathering step computes on, in step order; each such step also
  // reads the next one's shares (its gather starts while this step computes). With K
  // micro-batches every pass gathers again, so the order is one pass's K times over, and the
  // last backward of pass k reads the embeddings' share for pass k+1's fwd.embed: no update
  // runs between passes, so that share is the one pass k+1 computes on. None across
  // iterations: fwd.embed's share is rewritten by opt.embed after the last pass's backward.
  std::vector<std::vector<size_t>> gathers;
  for (uint32_t k = 0; k < config.gradient_accumulation_steps; ++k) {
    gathers.push_back({embed});
    for (uint32_t i = 0; i < n_layer; ++i) gathers.push_back({layout.block_unit(i)});
    gathers.push_back({ln_f, embed});
    for (uint32_t i = n_layer; i-- > 0;) gathers.push_back({layout.block_unit(i)});
  }
  GatherLookahead lookahead(run, std::move(gathers));
  auto with_next_shares = [&](std::vector<sch::TensorId> reads) { return lookahead.reads(std::move(reads)); };

  // Interleaved: the previous step's update of each unit right before its forward.
  const bool interleave = run.interleaved_updates;
  // Gradient accumulation: K forward/backward passes, one per micro-batch, then the updates.
  // Micro-batch k > 0 adds to the gradients the passes before it left (so its head and
  // backward steps also read G), and only the last one's backward is followed by updates:
  // the optimizer state is read and written once per update. With K = 1 the steps, their
  // names and their tensors are exactly the single pass's.
  const uint32_t micro_batches = config.gradient_accumulation_steps;
  for (uint32_t k = 0; k < micro_batches; ++k) {
    const std::string suffix = micro_batches == 1 ? "" : ".mb" + std::to_string(k);
    const bool last = k + 1 == micro_batches;
    auto info = [k](StepKind kind, size_t unit) {
      StepInfo step{kind, unit};
      step.micro_batch = k;
      return step;
    };
    // G as read by micro-batch k's head and backward: the sum so far, from k = 1 on.
    auto accumulated = [&](size_t unit) { return k > 0 ? run.units[unit].grads : kNoTensor; };
    auto accumulated_adapter = [&](size_t unit) { return k > 0 ? adapter_grads(unit) : kNoTensor; };
    if (interleave) optimize(embed);
    add("fwd.embed" + suffix, info(StepKind::fwd_embed, embed), with_next_shares({run.units[embed].params}),
        {run.activations[0]});
    for (uint32_t i = 0; i < n_layer; ++i) {
      size_t unit = layout.block_unit(i);
      if (interleave) optimize_block(unit);
      add("fwd.h." + std::to_string(i) + suffix, info(StepKind::fwd_block, unit),
          with_next_shares({run.units[unit].params, adapter_params(unit), run.activations[i]}), {run.activations[i + 1]});
    }
    if (interleave) optimize(ln_f);
    add("head" + suffix, info(StepKind::head, ln_f),
        with_next_shares({run.units[ln_f].params, run.units[embed].params, run.activations[n_layer], accumulated(ln_f),
                          accumulated(embed)}),
        {run.units[ln_f].grads, run.units[embed].grads, run.d_x});
    if (!clip && last) optimize(ln_f);
    for (uint32_t i = n_layer; i-- > 0;) {
      size_t unit = layout.block_unit(i);
      add("bwd.h." + std::to_string(i) + suffix, info(StepKind::bwd_block, unit),
          with_next_shares({run.units[unit].params, adapter_params(unit), run.activations[i], run.d_x,
                            accumulated(unit), accumulated_adapter(unit)}),
          {run.units[unit].grads, adapter_grads(unit), run.d_x});
      if (!clip && last) optimize_block(unit);
    }
    // A frozen embedding has nothing to learn from the gradient that reaches it.
    if (!run.units[embed].frozen)
      add("bwd.embed" + suffix, info(StepKind::bwd_embed, embed), {run.units[embed].grads, run.d_x},
          {run.units[embed].grads});
  }
  if (interleave) return run;
  if (clip) {
    // The global norm is known only now: every update waits for it (gradients parked on
    // their tier meanwhile). Reverse order ends with the embeddings, which the next
    // iteration's first step reads.
    optimize(ln_f);
    for (uint32_t i = n_layer; i-- > 0;) optimize_block(layout.block_unit(i));
  }
  optimize(embed);
  return run;
}

TrainPlan build_eval_plan(const TrainConfig& config, const ModelLayout& layout,
                          const std::vector<std::vector<int>>& owners, int rank) {
  TrainPlan run;
  run.params_gathered = !owners.empty() && config.parallel.zero_stage >= 3;
  for (const Unit& unit : layout.units()) {
    UnitIds ids;
    ids.frozen = unit.frozen;
    ids.params_range = ElementRange{0, unit.element_count};
    if (run.params_gathered)
      add_params_share(run, config, unit, owners[run.units.size()], rank, ids);
    else
      ids.params = run.plan.add_tensor(params_name(unit), params_size_bytes(config, layout, run.units.size()),
                                       home_of(config.placement.params));
    run.units.push_back(std::move(ids));
  }
  const uint64_t activation_bytes = uint64_t{config.batch_size} * config.model.seq_len * config.model.n_embd * 4;
  for (uint32_t i = 0; i <= config.model.n_layer; ++i)
    run.activations.push_back(run.plan.add_tensor("act." + std::to_string(i), activation_bytes, sch::Home::host));
  auto add = [&](std::string name, StepInfo info, std::vector<sch::TensorId> reads, std::vector<sch::TensorId> writes) {
    std::erase(reads, kNoTensor);
    run.plan.add_step(std::move(name), std::move(reads), std::move(writes));
    run.steps.push_back(info);
  };
  const size_t embed = layout.embed_unit();
  const size_t ln_f = layout.ln_f_unit();
  // Stage 3: the forward's gathers, in order (train/zero/param_gather.h), with their lookahead.
  std::vector<std::vector<size_t>> gathers = {{embed}};
  for (uint32_t i = 0; i < config.model.n_layer; ++i) gathers.push_back({layout.block_unit(i)});
  gathers.push_back({ln_f, embed});
  GatherLookahead lookahead(run, std::move(gathers));
  add("fwd.embed", StepInfo{StepKind::fwd_embed, embed}, lookahead.reads({run.units[embed].params}),
      {run.activations[0]});
  for (uint32_t i = 0; i < config.model.n_layer; ++i) {
    const size_t unit = layout.block_unit(i);
    std::vector<sch::TensorId> reads = {run.units[unit].params, run.activations[i]};
    if (layout.has_adapters()) reads.push_back(run.units[layout.adapter_unit(i)].params);
    add("fwd.h." + std::to_string(i), StepInfo{StepKind::fwd_block, unit}, lookahead.reads(std::move(reads)),
        {run.activations[i + 1]});
  }
  add("head", StepInfo{StepKind::head, ln_f},
      lookahead.reads({run.units[ln_f].params, run.units[embed].params, run.activations[config.model.n_layer]}), {});
  return run;
}

uint64_t DeviceScratchSizes::total() const {
  uint64_t bytes = 0;
  for (uint64_t part : {workspace_bytes, weights_fp32_bytes, block_grads_bytes, embed_grads_bytes, ln_f_grads_bytes,
                        param_gather_bytes, lora_scratch_bytes})
    bytes += align_up(part, device::kDeviceAlignmentBytes);
  return bytes;
}

uint64_t gather_second_offset_bytes(const TrainConfig& config, const ModelLayout& layout) {
  return align_up(layout.units()[layout.ln_f_unit()].element_count * dtype_size_bytes(config.precision), 64);
}

uint64_t gather_buffer_bytes(const TrainConfig& config, const ModelLayout& layout) {
  const uint64_t head = gather_second_offset_bytes(config, layout) +
                        layout.units()[layout.embed_unit()].element_count * dtype_size_bytes(config.precision);
  return std::max(head, layout.largest_unit_elements() * dtype_size_bytes(config.precision));
}

DeviceScratchSizes device_scratch(const TrainConfig& config, const ModelLayout& layout, const TrainPlan* run) {
  DeviceScratchSizes sizes;
  // Two buffers, each rounded as the device rounds an allocation.
  if (run != nullptr && run->params_gathered)
    sizes.param_gather_bytes = 2 * align_up(gather_buffer_bytes(config, layout), device::kDeviceAlignmentBytes);
  kernels::BatchShape shape{config.batch_size, config.model.seq_len};
  // The backend's workspace for this device kind (CUDA's grows with T²) and the fixed buffers
  // make_backend takes beside it, each rounded as the device rounds an allocation.
  Result<device::Kind> parsed = device::parse_kind(config.device_kind);
  assert(parsed.ok());  // device.kind is checked when the config is read
  const device::Kind kind = parsed.ok() ? *parsed : device::Kind::cpu;
  sizes.workspace_bytes = align_up(layout.definition().workspace_size_bytes(kind, shape),
                                   device::kDeviceAlignmentBytes);
  if (const uint64_t fixed = kernels::fixed_device_bytes(kind, shape); fixed > 0)
    sizes.workspace_bytes += align_up(fixed, device::kDeviceAlignmentBytes);
  const uint64_t ln_f_elements = layout.units()[layout.ln_f_unit()].element_count;
  const bool base_widened = layout.has_adapters() ? config.model.adapter.base_dtype != BaseDType::fp32
                                                  : config.precision != DType::f32;
  if (base_widened || config.precision != DType::f32) {
    // One unit widened at a time, plus ln_f for the head (which also widens the embeddings) —
    // or, with LoRA, a block's adapters after the block.
    uint64_t second = ln_f_elements;
    if (layout.has_adapters())
      for (int64_t i = 0; i < layout.n_layer(); ++i)
        second = std::max(second, layout.units()[layout.adapter_unit(i)].element_count);
    sizes.weights_fp32_bytes = (layout.largest_unit_elements() + second) * 4;
  }
  if (layout.has_adapters()) {
    int64_t max_in = 0, max_out = 0;
    for (const BlockLinear& linear : layout.definition().block_linears()) {
      max_in = std::max(max_in, linear.in_features);
      max_out = std::max(max_out, linear.out_features);
    }
    sizes.lora_scratch_bytes = kernels::lora::scratch_size_bytes(
        shape.rows(), max_in, max_out, config.model.adapter.rank, static_cast<float>(config.model.adapter.dropout));
  }
  if (config.placement.grads == Tier::device) {
    // K = 1: one unit's at a time, the largest block's (a LoRA adapter's are smaller). K > 1:
    // every trained unit's side by side, to the end of the last one.
    for (int64_t i = 0; i < layout.n_layer(); ++i)
      sizes.block_grads_bytes =
          std::max(sizes.block_grads_bytes, layout.units()[layout.block_unit(i)].element_count * 4);
    if (config.gradient_accumulation_steps > 1) {
      const std::vector<uint64_t> offsets = device_grads_offsets(config, layout);
      sizes.block_grads_bytes = 0;
      for (size_t u = 0; u < layout.units().size(); ++u)
        if (u != layout.embed_unit() && u != layout.ln_f_unit() && !layout.units()[u].frozen)
          sizes.block_grads_bytes = std::max(sizes.block_grads_bytes, offsets[u] + layout.units()[u].element_count * 4);
    }
    sizes.embed_grads_bytes = layout.units()[layout.embed_unit()].element_count * 4;
    sizes.ln_f_grads_bytes = ln_f_elements * 4;
  }
  return sizes;
}

std::vector<uint64_t> device_grads_offsets(const TrainConfig& config, const ModelLayout& layout) {
  std::vector<uint64_t> offsets(layout.units().size(), 0);
  if (config.gradient_accumulation_steps == 1) return offsets;
  uint64_t next_bytes = 0;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    if (u == layout.embed_unit() || u == layout.ln_f_unit() || layout.units()[u].frozen) continue;
    offsets[u] = next_bytes;
    // Each unit's gradients start on the device's allocation alignment, as a buffer of its own would.
    next_bytes = align_up(next_bytes + layout.units()[u].element_count * 4, device::kDeviceAlignmentBytes);
  }
  return offsets;
}

uint64_t host_optimizer_staging_bytes(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run) {
  (void)layout;
  if (run.optimizer_site != OptimizerSite::host) return 0;
  uint64_t largest_chunk = 0;
  for (const UnitIds& ids : run.units)
    for (const OptimChunk& chunk : ids.optim) largest_chunk = std::max(largest_chunk, chunk.range.element_count);
  const uint64_t slot = align_up(largest_chunk * 4, 4096) + align_up(largest_chunk * dtype_size_bytes(config.precision), 4096);
  return 2 * slot;
}

uint64_t training_state_bytes(const TrainPlan& run, const ModelLayout& layout, uint64_t alignment_bytes) {
  uint64_t bytes = 0;
  for (size_t u = 0; u < run.units.size(); ++u) {
    const UnitIds& ids = run.units[u];
    if (ids.params != kNoTensor) bytes += align_up(run.plan.tensors()[ids.params].size_bytes, alignment_bytes);
    if (ids.frozen) continue;  // P alone
    bytes += ids.grads == kNoTensor ? align_up(layout.units()[u].element_count * 4, alignment_bytes)
                                    : align_up(run.plan.tensors()[ids.grads].size_bytes, alignment_bytes);
    for (const OptimChunk& chunk : ids.optim)
      if (chunk.tensor != kNoTensor) bytes += align_up(run.plan.tensors()[chunk.tensor].size_bytes, alignment_bytes);
  }
  return bytes;
}

bool is_persistent(const TrainPlan& run, sch::TensorId id) {
  for (const UnitIds& ids : run.units) {
    if (id == ids.params) return true;
    for (const OptimChunk& chunk : ids.optim)
      if (id == chunk.tensor) return true;
  }
  return false;
}

bool is_rewritten(const TrainPlan& run, sch::TensorId id) {
  for (const UnitIds& ids : run.units) {
    if (id == ids.params) return !ids.frozen;
    for (const OptimChunk& chunk : ids.optim)
      if (id == chunk.tensor) return true;
  }
  return false;
}

uint64_t params_size_bytes(const TrainConfig& config, const ModelLayout& layout, size_t unit) {
  if (layout.units()[unit].frozen) return layout.frozen_params_bytes(unit);
  return layout.units()[unit].element_count * dtype_size_bytes(config.precision);
}

bool is_store_tensor(const TrainPlan& run, sch::TensorId id) {
  if (is_persistent(run, id)) return true;
  for (const UnitIds& ids : run.units)
    if (id == ids.grads) return run.plan.tensors()[id].home == sch::Home::nvme;
  return false;
}

}  // namespace strata
