#include "train/zero/zero.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "common/size.h"
#include "run/run_store.h"
#include "run/train_plan.h"
#include "kernels/optim/adamw.h"
#include "memory/store.h"

namespace strata {

ChunkOwners optimizer_chunk_owners(const ModelLayout& layout, uint64_t chunk_elements, const optim::StateLayout& state,
                                   int ranks) {
  uint64_t total = 0;
  for (const Unit& unit : layout.units())
    if (!unit.frozen) total += unit.element_count;  // the units that have optimizer chunks
  ChunkOwners owners;
  uint64_t before = 0;  // elements of the chunks before this one, in model order
  for (const Unit& unit : layout.units()) {
    std::vector<int>& unit_owners = owners.emplace_back();
    for (const ElementRange& chunk : optim_chunks(unit, chunk_elements, state)) {
      // The rank whose 1/N of the flat element space holds the chunk's middle element.
      const uint64_t middle = before + chunk.element_count / 2;
      unit_owners.push_back(static_cast<int>(std::min<uint64_t>(middle * static_cast<uint64_t>(ranks) / total,
                                                                static_cast<uint64_t>(ranks - 1))));
      before += chunk.element_count;
    }
  }
  return owners;
}

Result<TrainConfig> config_for_rank(const TrainConfig& config, int rank, int ranks) {
  TrainConfig out = config;
  if (config.batch_size % static_cast<uint32_t>(ranks) != 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'batch_size': {} is the global batch and must be divisible by the {} ranks "
                                  "of this job",
                                  config.source_path, config.batch_size, ranks));
  bool templated = false;
  for (const std::string& path : config.nvme_paths) templated = templated || path.find("{rank}") != std::string::npos;
  if (ranks > 1 && !templated)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'nvme.paths': {} ranks would share one store; put {{rank}} in each path "
                                  "(e.g. /nvme/run/rank{{rank}}) so every rank has its own",
                                  config.source_path, ranks));
  out.batch_size = config.batch_size / static_cast<uint32_t>(ranks);
  for (std::string& path : out.nvme_paths) {
    const bool per_rank = path.find("{rank}") != std::string::npos;
    path = expand_rank(path, rank);
    if (per_rank) {
      std::error_code error;
      std::filesystem::create_directories(path, error);
      if (error)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: key 'nvme.paths': cannot create rank {}'s folder {}: {}", config.source_path,
                                      rank, path, error.message()));
    }
  }
  return out;
}

Status reconcile_global_commit(comm::Communicator& comm, const std::string& store_dir) {
  int64_t mine[2] = {-1, -1};  // committed step, prepared step (-1: none)
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::path(store_dir) / memory::kStoreManifestName, error)) {
    memory::StoreOptions options;
    options.read_only = true;
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(store_dir, options));
    if (store.committed_metadata().count("format") != 0) mine[0] = static_cast<int64_t>(store.committed_step());
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<uint64_t> prepared, memory::Store::prepared_commit_step(store_dir));
  if (prepared) mine[1] = static_cast<int64_t>(*prepared);
  std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
  STRATA_RETURN_IF_ERROR(comm.allgather(mine, all.data(), sizeof mine));
  int64_t newest = -1;
  int newest_rank = 0;
  for (int r = 0; r < comm.size(); ++r)
    if (all[2 * r] > newest) newest = all[2 * r], newest_rank = r;
  if (mine[0] == newest) return Status();
  if (mine[1] == newest)
    return memory::Store::roll_forward_prepared_commit(store_dir);  // the others finished it
  return make_error(ErrorKind::corrupt,
                    fmt::format("store {} (rank {}) is at step {} but rank {}'s store committed step {}, which this "
                                "one never prepared: these stores are not one job's (or one was replaced)",
                                store_dir, comm.rank(), mine[0], newest_rank, newest));
}

ZeroTraffic zero_formula_bytes(uint64_t parameter_count, DType precision, uint32_t stage, int ranks,
                               uint32_t micro_batches) {
  ZeroTraffic traffic;
  if (ranks <= 1) return traffic;
  const auto n = static_cast<uint64_t>(ranks);
  const uint64_t reduced = parameter_count * 4 * (n - 1) / n;
  traffic.gradient_bytes = stage >= 2 ? reduced : 2 * reduced;
  traffic.parameter_bytes = parameter_count * dtype_size_bytes(precision) * (n - 1) / n;
  // Gathered for the forward and again for the backward, in each of the K passes of an update.
  if (stage >= 3) traffic.parameter_bytes *= 2 * uint64_t{micro_batches};
  return traffic;
}

nlohmann::ordered_json zero_plan_json(const TrainConfig& config, const ModelLayout& layout, int ranks) {
  const optim::StateLayout state = config.optimizer.state();
  const ChunkOwners owners = optimizer_chunk_owners(layout, config.optimizer.chunk_elements, state, ranks);
  const uint32_t stage = std::max<uint32_t>(config.parallel.zero_stage, 1);
  const uint64_t param_bytes = dtype_size_bytes(config.precision);
  std::vector<uint64_t> chunks(static_cast<size_t>(ranks)), optimizer_bytes(static_cast<size_t>(ranks));
  // The compute copy each rank keeps: the whole model at stages 1 and 2 (a LoRA base in its own
  // dtype: params_size_bytes), its chunks' share at 3.
  uint64_t model_params_bytes = 0;
  for (size_t u = 0; u < layout.units().size(); ++u) model_params_bytes += params_size_bytes(config, layout, u);
  std::vector<uint64_t> params_bytes(static_cast<size_t>(ranks), stage >= 3 && ranks > 1 ? 0 : model_params_bytes);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const std::vector<ElementRange> ranges = optim_chunks(layout.units()[u], config.optimizer.chunk_elements, state);
    const std::vector<optim::TensorSpan> spans = optim_spans(layout.units()[u]);
    for (size_t c = 0; c < ranges.size(); ++c) {
      chunks[static_cast<size_t>(owners[u][c])] += 1;
      optimizer_bytes[static_cast<size_t>(owners[u][c])] +=
          state.chunk_bytes(spans, ranges[c].begin_elements, ranges[c].element_count);
      if (stage >= 3 && ranks > 1) params_bytes[static_cast<size_t>(owners[u][c])] += ranges[c].element_count * param_bytes;
    }
  }
  // Stage 3: two gather buffers per rank, allocated at start-up and counted in device.memory.
  const uint64_t gather_bytes = stage >= 3 && ranks > 1 ? 2 * gather_buffer_bytes(config, layout) : 0;
  // Ψ is what trains: a LoRA base is frozen, so neither reduced nor re-gathered.
  const ZeroTraffic traffic = zero_formula_bytes(layout.trainable_parameter_count(), config.precision, stage, ranks,
                                                 config.gradient_accumulation_steps);
  nlohmann::ordered_json per_rank = nlohmann::ordered_json::array();
  for (int r = 0; r < ranks; ++r)
    per_rank.push_back({{"rank", r}, {"optimizer_chunks", chunks[static_cast<size_t>(r)]},
                        {"optimizer_bytes", optimizer_bytes[static_cast<size_t>(r)]},
                        {"params_bytes", params_bytes[static_cast<size_t>(r)]},
                        {"gather_buffer_bytes", gather_bytes}});
  return {{"ranks", ranks},
          {"zero_stage", stage},
          {"batch_per_rank", config.batch_size / static_cast<uint32_t>(ranks)},
          {"gradient_bytes_per_step", traffic.gradient_bytes},
          {"parameter_bytes_per_step", traffic.parameter_bytes},
          {"sent_bytes_per_step", traffic.total()},
          {"received_bytes_per_step", traffic.total()},
          {"per_rank", std::move(per_rank)}};
}

std::string format_zero_plan(const TrainConfig& config, const ModelLayout& layout, int ranks) {
  const nlohmann::ordered_json j = zero_plan_json(config, layout, ranks);
  std::string out = fmt::format(
      "\nZeRO stage {} on {} ranks ({} rows of the global batch each): per rank and step, gradients {} and "
      "parameters {} — {} sent and as much received (ZeRO's formula: stage 1 all-reduces 2·(N−1)/N·4Ψ, stages 2 "
      "and 3 reduce-scatter (N−1)/N·4Ψ; stages 1 and 2 gather (N−1)/N·pΨ of new parameters, stage 3 gathers each "
      "unit before its forward and again before its backward, 2·(N−1)/N·pΨ, in each of the K micro-batches' passes)\n",
      j["zero_stage"].get<uint32_t>(), ranks, j["batch_per_rank"].get<uint32_t>(),
      format_size(j["gradient_bytes_per_step"].get<uint64_t>()), format_size(j["parameter_bytes_per_step"].get<uint64_t>()),
      format_size(j["sent_bytes_per_step"].get<uint64_t>()));
  for (const auto& rank : j["per_rank"]) {
    out += fmt::format("  rank {}: {} optimizer chunks, {} of optimizer state, {} of compute copy", rank["rank"].get<int>(),
                       rank["optimizer_chunks"].get<uint64_t>(), format_size(rank["optimizer_bytes"].get<uint64_t>()),
                       format_size(rank["params_bytes"].get<uint64_t>()));
    if (const uint64_t gather = rank["gather_buffer_bytes"].get<uint64_t>(); gather > 0)
      out += fmt::format(" (its share) + {} of gather buffers (two, each the largest step's units)", format_size(gather));
    out += "\n";
  }
  return out;
}

ZeroStep::ZeroStep(comm::Communicator& comm, const ModelLayout& layout, const TrainConfig& config,
                   uint32_t global_batch, comm::Communicator* device_comm)
    : comm_(comm), device_comm_(device_comm), stage_(std::max<uint32_t>(config.parallel.zero_stage, 1)),
      param_bytes_(dtype_size_bytes(config.precision)), global_batch_(global_batch),
      chunk_elements_(config.optimizer.chunk_elements), state_(config.optimizer.state()),
      owners_(optimizer_chunk_owners(layout, config.optimizer.chunk_elements, state_, comm.size())) {
  for (const Unit& unit : layout.units()) {
    chunks_.push_back(optim_chunks(unit, chunk_elements_, state_));
    unit_elements_.push_back(unit.element_count);
  }
  const auto n = static_cast<size_t>(comm.size());
  for (size_t u = 0; u < chunks_.size(); ++u) {
    std::vector<uint64_t>& bytes = share_bytes_.emplace_back(n, 0);
    std::vector<uint64_t>& offsets = share_offset_bytes_.emplace_back(n, 0);
    for (size_t c = 0; c < chunks_[u].size(); ++c) {  // a rank's chunks are contiguous in the unit
      const auto r = static_cast<size_t>(owners_[u][c]);
      if (bytes[r] == 0) offsets[r] = chunks_[u][c].begin_elements * param_bytes_;
      bytes[r] += chunks_[u][c].element_count * param_bytes_;
    }
  }
}

Result<comm::Request> ZeroStep::gather_params_async(size_t unit, void* unit_params) {
  comm::Communicator& comm = device_comm_ != nullptr ? *device_comm_ : comm_;  // NCCL: device pointers
  return comm.allgatherv_inplace_async(unit_params, share_bytes_[unit], share_offset_bytes_[unit]);
}

Status ZeroStep::reduce_gradients(size_t unit, float* grads) {
  const std::vector<ElementRange>& chunks = chunks_[unit];
  if (device_comm_ != nullptr) {  // device pointers: summed by NCCL, scaled in device_grad_scale
    if (stage_ == 1) return device_comm_->allreduce_sum(std::span<float>(grads, unit_elements_[unit]));
    for (size_t c = 0; c < chunks.size(); ++c)
      STRATA_RETURN_IF_ERROR(
          device_comm_->reduce_sum(grads + chunks[c].begin_elements, chunks[c].element_count, owner(unit, c)));
    return Status();
  }
  const float inverse = 1.0f / static_cast<float>(divisor());
  auto scale_and_square = [&](const ElementRange& range) {
    double sum = 0.0;
    for (uint64_t i = range.begin_elements; i < range.begin_elements + range.element_count; ++i) {
      grads[i] *= inverse;
      sum += static_cast<double>(grads[i]) * grads[i];
    }
    return sum;
  };
  if (stage_ == 1) {
    const uint64_t count = unit_elements_[unit];
    STRATA_RETURN_IF_ERROR(comm_.allreduce_sum(std::span<float>(grads, count)));
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (owns(unit, c)) sum_squares_ += scale_and_square(chunks[c]);
      else
        for (uint64_t i = chunks[c].begin_elements; i < chunks[c].begin_elements + chunks[c].element_count; ++i)
          grads[i] *= inverse;
    }
    return Status();
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    STRATA_RETURN_IF_ERROR(comm_.reduce_sum(grads + chunks[c].begin_elements, chunks[c].element_count, owner(unit, c)));
    if (owns(unit, c)) sum_squares_ += scale_and_square(chunks[c]);
  }
  return Status();
}

Result<float> ZeroStep::clip_scale(double max_norm) {
  if (!clip_scale_known_) {
    double total = sum_squares_;
    STRATA_RETURN_IF_ERROR(comm_.allreduce_sum(std::span<double>(&total, 1)));
    clip_scale_ = kernels::clip_coefficient(std::sqrt(total), max_norm);
    clip_scale_known_ = true;
  }
  return clip_scale_;
}

Result<float> ZeroStep::device_grad_scale(double max_norm,
                                          const std::function<Result<double>()>& local_sum_squares) {
  if (!clip_scale_known_) {
    STRATA_ASSIGN_OR_RETURN(double total, local_sum_squares());
    STRATA_RETURN_IF_ERROR(comm_.allreduce_sum(std::span<double>(&total, 1)));
    const double ranks = static_cast<double>(divisor());
    const float clip = max_norm > 0 ? kernels::clip_coefficient(std::sqrt(total) / ranks, max_norm) : 1.0f;
    clip_scale_ = static_cast<float>(clip / ranks);
    clip_scale_known_ = true;
  }
  return clip_scale_;
}

Status ZeroStep::share_params(size_t unit, size_t chunk, void* unit_params) {
  const ElementRange& range = chunks_[unit][chunk];
  comm::Communicator& comm = device_comm_ != nullptr ? *device_comm_ : comm_;
  return comm.broadcast(static_cast<std::byte*>(unit_params) + range.begin_elements * param_bytes_,
                         range.element_count * param_bytes_, owner(unit, chunk));
}

Result<double> ZeroStep::mean_loss(double local_loss) {
  double total = local_loss;
  STRATA_RETURN_IF_ERROR(comm_.allreduce_sum(std::span<double>(&total, 1)));
  return total / divisor();
}

Result<int64_t> ZeroStep::global_count(int64_t local) {
  double total = static_cast<double>(local);
  STRATA_RETURN_IF_ERROR(comm_.allreduce_sum(std::span<double>(&total, 1)));
  return static_cast<int64_t>(total);
}

}  // namespace strata
