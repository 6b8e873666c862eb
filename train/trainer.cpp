#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <charconv>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <sys/statvfs.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/mix.h"
#include "common/size.h"
#include "kernels/lora/lora.h"
#include "data/token_stream.h"
#include "train/train_batches.h"
#include "models/hf/hf.h"
#include "models/hf/peft.h"
#include "train/lr_schedule.h"
#include "models/model_layout.h"
#include "models/safetensors.h"
#include "train/host_update.h"
#include "run/budgets.h"
#include "run/run_store.h"
#include "run/step_model.h"
#include "run/train_plan.h"
#include "train/zero/param_gather.h"
#include "train/zero/zero.h"
#include "train/zero/zero_reslice.h"
#include "kernels/backend.h"
#include "kernels/compute_threads.h"
#include "kernels/ops.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/cast.h"
#include "device/device.h"
#include "memory/host_arena.h"
#include "memory/store.h"
#include "scheduler/scheduler.h"
#include "strata_build_config.h"

namespace strata {
namespace {

namespace sch = scheduler;
using Clock = std::chrono::steady_clock;

// --- checks before a run ---------------------------------------------------------------------

// Peak resident set of this process, from /proc/self/status (VmHWM), in bytes.
uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

// adapter.init: a PEFT folder that describes this run's adapters, checked whole before any work
// (models/hf/peft.h), so a refusal leaves no store behind.
Status check_adapter_init(const TrainConfig& config) {
  if (!config.model.adapter.enabled || config.model.adapter.init.empty()) return Status();
  Result<hf::AdapterFolder> folder = hf::AdapterFolder::open(config.model.adapter.init, config.model);
  if (!folder.ok())
    return make_error(folder.error().kind,
                      fmt::format("{}: key 'adapter.init': {}", config.source_path, folder.error().message));
  return Status();
}

// Every tensor of the model, present with its shape, before anything is created: a wrong
// init file or folder is refused up front, not halfway through writing the store.
Status check_init_file(const TrainConfig& config) {
  if (config.model.init == "random") return check_adapter_init(config);
  STRATA_ASSIGN_OR_RETURN(hf::Checkpoint checkpoint, hf::Checkpoint::open(config.model.init));
  Status checked = checkpoint.check(hf::model_tensors(config.model));
  if (!checked.ok())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'model.init': {}", config.source_path, checked.error().message));
  return check_adapter_init(config);
}

// --- fresh state ----------------------------------------------------------------------------

// Writes every unit's initial compute copy, optimizer state (master from the init, zero
// moments) and, when they live on NVMe, zero gradients into the store, one unit at a time
// through pinned buffers: the unit's fp32 master weights, and a staging area for what is
// written from them.

Status initialize_store(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run,
                        memory::Store& store, memory::HostArena& arena) {
  std::unique_ptr<hf::Checkpoint> init;
  if (config.model.init != "random") {
    STRATA_ASSIGN_OR_RETURN(hf::Checkpoint checkpoint, hf::Checkpoint::open(config.model.init));
    init = std::make_unique<hf::Checkpoint>(std::move(checkpoint));
  }
  // LoRA: the adapters start from adapter.init's PEFT folder when it names one (checked by
  // check_adapter_init), else Kaiming-uniform A and zero B; the frozen base is written in
  // adapter.base_dtype.
  const AdapterConfig& adapter = config.model.adapter;
  std::unique_ptr<hf::AdapterFolder> adapter_init;
  if (adapter.enabled && !adapter.init.empty()) {
    STRATA_ASSIGN_OR_RETURN(hf::AdapterFolder folder, hf::AdapterFolder::open(adapter.init, config.model));
    adapter_init = std::make_unique<hf::AdapterFolder>(std::move(folder));
  }
  const uint64_t largest = layout.largest_unit_elements();
  const optim::StateLayout state = config.optimizer.state();
  std::vector<std::vector<optim::TensorSpan>> spans;
  uint64_t largest_chunk_bytes = 0;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    spans.push_back(optim_spans(layout.units()[u]));
    for (const OptimChunk& chunk : run.units[u].optim)
      largest_chunk_bytes = std::max(
          largest_chunk_bytes, state.chunk_bytes(spans[u], chunk.range.begin_elements, chunk.range.element_count));
  }
  STRATA_ASSIGN_OR_RETURN(memory::HostBuffer master_buffer, memory::HostBuffer::allocate(arena, largest * 4));
  // Staging: a 16-bit init tensor or compute copy (2 B/element), zero gradients (4 B), one
  // optimizer chunk (its state layout's bytes) or a quantised base unit (its layout's bytes: raw
  // tensors as fp32 plus each piece's padding, so possibly a little over 4 B/element).
  uint64_t staging_bytes = std::max(largest * 4, largest_chunk_bytes);
  for (size_t u = 0; u < layout.units().size(); ++u)
    if (const kernels::quant::UnitLayout* quantized = layout.quant_layout(u))
      staging_bytes = std::max(staging_bytes, quantized->size_bytes);
  STRATA_ASSIGN_OR_RETURN(memory::HostBuffer staging_buffer, memory::HostBuffer::allocate(arena, staging_bytes));
  auto* master = reinterpret_cast<float*>(master_buffer.data());
  auto* staging = reinterpret_cast<float*>(staging_buffer.data());
  auto* staging_bits = reinterpret_cast<uint16_t*>(staging_buffer.data());
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Unit& unit = layout.units()[u];
    const UnitIds& ids = run.units[u];
    const uint64_t n = unit.element_count;
    if (unit.adapter_block >= 0 && adapter_init) {
      for (const UnitTensor& tensor : unit.tensors)
        STRATA_RETURN_IF_ERROR(adapter_init->read_fp32(tensor.name, master + tensor.offset_elements));
    } else if (init && unit.adapter_block < 0) {
      // check_init_file ran first; bf16 / fp16 widen in place. Adapters are never in a model
      // checkpoint: the base is.
      for (const UnitTensor& tensor : unit.tensors)
        STRATA_RETURN_IF_ERROR(init->read_fp32(hf::tensor_spec(config.model, tensor.name, tensor.shape),
                                               master + tensor.offset_elements));
    } else {
      layout.initialize_unit(u, config.model.seed, master);
    }
    for (size_t c = 0; c < ids.optim.size(); ++c) {
      if (ids.optim[c].tensor == kNoTensor) continue;  // another rank's (train/zero/zero.h)
      const ElementRange& range = ids.optim[c].range;
      const uint64_t count = range.element_count;
      const uint64_t begin = range.begin_elements;
      state.initialize(spans[u], begin, count, master + begin, staging_buffer.data());
      STRATA_RETURN_IF_ERROR(write_tensor(store, optim_name(unit, c, ids.optim.size()), state.store_dtype(),
                                          state.store_shape(spans[u], begin, count), staging_buffer.data(),
                                          state.chunk_bytes(spans[u], begin, count)));
    }
    const int64_t flat_shape[] = {static_cast<int64_t>(n)};
    // P, or at ZeRO stage 3 this rank's share of it (none when it owns none of the unit).
    if (ids.params != kNoTensor) {
      const std::string& params = run.plan.tensors()[ids.params].name;
      const float* share = master + ids.params_range.begin_elements;
      const uint64_t share_n = ids.params_range.element_count;
      const int64_t share_shape[] = {static_cast<int64_t>(share_n)};
      // A frozen base unit is stored in adapter.base_dtype (ModelLayout::frozen_params_bytes:
      // int8 / nf4 blocks quantised once, here); every other P in the run's precision.
      const DType params_dtype = !unit.frozen                          ? config.precision
                                 : adapter.base_dtype == BaseDType::fp32 ? DType::f32
                                                                         : DType::bf16;
      if (const kernels::quant::UnitLayout* quantized = layout.quant_layout(u)) {
        kernels::quant::quantize_unit(*quantized, master, reinterpret_cast<std::byte*>(staging_buffer.data()));
        const int64_t byte_shape[] = {static_cast<int64_t>(quantized->size_bytes / 2)};
        // Stored as 16-bit words (the store's dtypes have no byte type); the bytes are the format's.
        STRATA_RETURN_IF_ERROR(write_tensor(store, params, DType::bf16, byte_shape, staging_buffer.data(),
                                            quantized->size_bytes));
      } else if (params_dtype == DType::f32) {
        STRATA_RETURN_IF_ERROR(write_tensor(store, params, DType::f32, share_shape, share, share_n * 4));
      } else {
        kernels::cast_fp32_to_bf16(std::span<const float>(share, share_n), std::span<uint16_t>(staging_bits, share_n));
        STRATA_RETURN_IF_ERROR(write_tensor(store, params, DType::bf16, share_shape, staging_bits, share_n * 2));
      }
    }
    if (ids.grads != kNoTensor && run.plan.tensors()[ids.grads].home == sch::Home::nvme) {
      std::fill(staging, staging + n, 0.0f);
      STRATA_RETURN_IF_ERROR(write_tensor(store, grads_name(unit), DType::f32, flat_shape, staging, n * 4));
    }
  }
  return Status();
}

// --- the training loop ----------------------------------------------------------------------

struct StepFigures {
  uint64_t step = 0;
  double loss = 0.0;
  double learning_rate = 0.0;  // the lr of this step's update (lr_schedule.h)
  double seconds = 0.0;
  double compute_seconds = 0.0;
  double stall_seconds = 0.0;
  uint64_t bytes[sch::kTierPairCount] = {};
  uint64_t tier_bytes[progress::kTierCount] = {};  // device, host, nvme in use at the step's end
  bool committed = false;
  std::optional<double> eval_loss;  // evaluated after this step's commit
};

// A step's figures as an observer takes them (scheduler::TierPair order is progress.h's).
progress::StepSample monitor_sample(const StepFigures& f) {
  static_assert(sch::kTierPairCount == progress::kPairCount);
  progress::StepSample sample{f.step, f.loss, f.seconds, f.compute_seconds, f.stall_seconds, {}, {}, f.committed,
                             f.learning_rate, f.eval_loss};
  std::copy(std::begin(f.bytes), std::end(f.bytes), sample.transfer_bytes);
  std::copy(std::begin(f.tier_bytes), std::end(f.tier_bytes), sample.tier_bytes);
  return sample;
}

class Run {
 public:
  Run(const TrainConfig& config, const TrainOptions& options, ZeroStep* zero = nullptr)
      : config_(config), options_(options), layout_(config.model), state_(config.optimizer.state()),
        shape_{config.batch_size, config.model.seq_len}, zero_(zero != nullptr && zero->active() ? zero : nullptr) {
    for (const Unit& unit : layout_.units()) unit_spans_.push_back(optim_spans(unit));
  }
  // Ops still on the compute stream may hold scheduler callbacks (release_after): they finish
  // before the scheduler and the buffers they name go away.
  ~Run() {
    if (backend_) (void)backend_->synchronize();
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  Result<TrainSummary> execute();
  // `strata eval`: the held-out loss of the committed weights (eval_path: --data, else the
  // config's eval data), touching nothing in the store.
  Result<EvalFigures> evaluate_committed(const std::string& eval_path);

 private:
  Status open_store(uint64_t& start_step);
  // A scheduler over `plan` (run_ or eval_run_) on the open store; host-homed persistent state
  // is read from the store's last commit.
  Status create_scheduler(const TrainPlan& plan);
  // Evaluation (trainer.h "Evaluation"). Right after a commit: the training scheduler gives way
  // to one over eval_run_, which reads the committed P, then comes back as after a resume.
  Status open_eval(const std::string& eval_path = {});
  Result<EvalFigures> evaluate_after_commit(uint64_t step);
  Result<EvalFigures> eval_passes();
  Status compute_eval(size_t step_index, const sch::StepBuffers& buffers);
  // Closes the scheduler (its statistics join carried_stats_ when `carry`), reopens the store
  // (an engine belongs to the thread that first submits: a new scheduler needs a fresh one)
  // and starts a scheduler over `plan`. `between` runs while no Store object is open.
  Status switch_scheduler(const TrainPlan& plan, bool carry, const std::function<Status()>& between = {});
  Status keep_if_best(uint64_t step, double eval_loss);
  sch::SchedulerStats training_stats() const;
  Status run_step(uint64_t step, StepFigures& figures);
  // Whether a forward/backward plan step belongs to the update's last micro-batch (always
  // with gradient_accumulation_steps 1): only then are its gradients complete.
  bool last_micro_batch(const StepInfo& info) const {
    return info.micro_batch + 1 == config_.gradient_accumulation_steps;
  }
  // Interleaved updates (train_plan.h): the pass that applies the pending update and nothing
  // else, so that a commit holds every step's update and no gradients are pending.
  Status drain_pending_update();
  Status compute_and_release(size_t index, const sch::StepBuffers& buffers, uint64_t step, Status status,
                             double& compute_seconds);
  Status open_device();
  Status open_memory();
  Status compute(size_t step_index, const sch::StepBuffers& buffers, uint64_t step);
  // Unit `unit`'s compute copy `params` as fp32: as it is when it is fp32, else widened into
  // `scratch` (bf16; a frozen base's bf16 — or dequantised, int8/nf4).
  Result<const float*> widen(size_t unit, const void* params, float* scratch);
  // LoRA: block `block_unit`'s adapters for the kernels — their P (widened into `scratch` when
  // bf16), their gradients when `with_grads`, the dropout key of (step, block) and the first
  // token row of this micro-batch on this rank in the update's whole batch;
  // nullopt without adapters. `train`: dropout on (forward and backward of a training step).
  Result<std::optional<kernels::lora::BlockAdapters>> adapters_for(size_t block_unit, const TrainPlan& plan,
                                                                   const sch::StepBuffers& buffers, float* scratch,
                                                                   bool with_grads, bool train, uint64_t step,
                                                                   uint32_t micro_batch);
  float* grads_of(size_t unit, const sch::StepBuffers& buffers);
  // ZeRO (train/zero/zero.h): the stream is drained, then the collectives run on this thread.
  Status reduce_across_ranks(size_t unit, float* grads);
  Status share_updated_params(const StepInfo& info, const sch::StepBuffers& buffers);
  const void* params_of(size_t unit, size_t position, const sch::StepBuffers& buffers) const;
  Status checkpoint(uint64_t step);
  Error step_failed(Error error, uint64_t step, bool committing) const;
  Status write_metrics(const std::vector<StepFigures>& figures, const TrainSummary& summary) const;

  const TrainConfig& config_;
  const TrainOptions& options_;
  ModelLayout layout_;
  optim::StateLayout state_;                              // the optimizer's chunks (optim/state.h)
  std::vector<std::vector<optim::TensorSpan>> unit_spans_;  // per unit: its tensors, for the update
  std::vector<kernels::AdamWChunk> device_pieces_;          // the device-site update's calls, reused
  kernels::BatchShape shape_;
  ZeroStep* zero_ = nullptr;  // N > 1 ranks (train/zero/zero.h); null: one rank, as before
  TrainPlan run_;
  // Evaluation: the forward-only plan, the held-out batches, what the training schedulers
  // before the current one counted (each evaluation replaces it), the best evaluation so far.
  TrainPlan eval_run_;
  std::unique_ptr<TrainBatches> eval_batches_;
  bool evaluating_ = false;  // strata eval: nothing trains
  sch::SchedulerStats carried_stats_;
  std::optional<double> best_eval_loss_;
  // --trace: one timeline across the schedulers of a run (training's and evaluation's).
  std::unique_ptr<sch::Timeline> timeline_;
  // Step s's tokens and targets (train/train_batches.h): the token stream or fine-tuning examples.
  std::unique_ptr<TrainBatches> batches_;
  std::unique_ptr<memory::Store> store_;
  std::unique_ptr<memory::HostArena> host_arena_;
  uint64_t pool_bytes_ = 0;  // the scheduler's host budget: host.memory, plus device.memory on the CPU device
  uint64_t device_budget_bytes_ = 0;  // device.memory, or only the kernels' scratch on the CPU device
  std::unique_ptr<device::Device> device_;
  // Every op of a step goes through the backend of device_'s kind (kernels/backend.h).
  std::unique_ptr<kernels::ComputeBackend> backend_;
  device::DeviceBuffer workspace_;
  // ZeRO stage 3 only (TrainPlan::params_gathered; made in execute): the units a step computes
  // on whole, gathered into two start-up buffers (train/zero/param_gather.h). After device_ and
  // backend_: freed before them.
  std::optional<ParamGather> gather_;
  device::DeviceBuffer weights_fp32_;
  device::DeviceBuffer lora_scratch_;  // LoRA: the adapter op's scratch (kernels/lora/lora.h)
  // grads: device — the gradients, which then never leave the device (train_plan.h): one
  // block's at a time, or with accumulation every unit's, at device_grads_offsets_.
  device::DeviceBuffer block_grads_, embed_grads_, ln_f_grads_;
  std::vector<uint64_t> device_grads_offsets_;
  std::unique_ptr<sch::NvmeBacking> backing_;
  std::unique_ptr<sch::Scheduler> scheduler_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> targets_;
  // The K micro-batches of one update (gradient_accumulation_steps; K = 1: one batch), rows
  // after rows, filled before the first and untouched until the update's last end_step
  // (backend.h: begin_step's batch is host memory). Positions and segment ids (StepBatch's
  // packed attention) only for fine-tuning examples: empty, so null, for a token stream.
  std::vector<int32_t> positions_;
  std::vector<int32_t> segments_;
  uint64_t committed_step_ = 0;  // the trainer's own copy: the store belongs to the I/O thread
  // The store's size, sampled before the scheduler takes it and at each commit (on the I/O
  // thread, which owns it): the nvme tier's occupancy and budget for the metrics.
  uint64_t nvme_used_bytes_ = 0;
  uint64_t nvme_capacity_bytes_ = 0;
  // OptimizerSite::host (train_plan.h): the CPU AdamW on host-homed state, beside the compute
  // stream (train/host_update.h). After scheduler_: destroyed (its worker joined) first.
  Status open_host_optimizer();
  Status update_on_host(size_t step_index, const StepInfo& info, const sch::StepBuffers& buffers, uint64_t step);
  // The optimizer's kernel calls for one chunk of `unit` (optim/state.h), into `pieces`.
  void optimizer_pieces(size_t unit, uint64_t begin, uint64_t count, uint64_t step, std::byte* chunk,
                        const float* grads, uint16_t* copy, std::vector<kernels::AdamWChunk>& pieces) const;
  std::unique_ptr<HostUpdater> host_updater_;
  std::optional<float> host_clip_scale_;  // this step's, once the norm came back
  // Interleaved updates: the step whose gradients (and clip coefficient, on the stream) wait
  // for their update in the next pass; none after a start, a resume or a commit.
  std::optional<uint64_t> pending_update_step_;
  // Set by update_on_host when the step's release became the host updater's (compute_and_release).
  bool release_promised_ = false;
};

Status Run::open_store(uint64_t& start_step) {
  const std::string dir = store_dir_for(config_);
  if (zero_ != nullptr) STRATA_RETURN_IF_ERROR(reconcile_global_commit(zero_->comm(), dir));
  std::error_code exists_error;
  bool exists = std::filesystem::exists(std::filesystem::path(dir) / memory::kStoreManifestName, exists_error);
  if (exists_error) return make_errno_error(exists_error.value(), "stat", dir + "/" + memory::kStoreManifestName);
  if (exists) {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, memory::Store::open(dir, store_options_for(config_)));
    store_ = std::make_unique<memory::Store>(std::move(store));
    if (store_->committed_metadata().count("format") == 0) {
      // Killed while the first version was being written: nothing was ever committed, so
      // nothing is lost by starting that first version again.
      spdlog::warn("{} holds no committed step (an earlier run stopped while initializing); starting afresh", dir);
      store_.reset();
      exists = false;
    }
  }
  if (!exists) STRATA_RETURN_IF_ERROR(discard_uncommitted_store(config_));
  if (exists) {
    if (auto format = store_->committed_metadata().find("format");
        format != store_->committed_metadata().end() && format->second == kWeightsOnlyFormat)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{} holds weights staged by `strata generate --model` (no optimizer state); give "
                                    "training another nvme path", dir));
    STRATA_ASSIGN_OR_RETURN(ModelConfig stored, model_from_metadata(store_->committed_metadata(), dir));
    if (!options_.resume)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{} already holds a run committed at step {}; pass --resume to continue it, or "
                                    "remove that directory to start over",
                                    dir, store_->committed_step()));
    if (std::optional<std::string> key = models::first_shape_difference(stored, config_.model)) {
      const auto stored_keys = models::store_metadata(stored);
      const auto config_keys = models::store_metadata(config_.model);
      auto value = [](const std::map<std::string, std::string>& keys, const std::string& k) {
        auto found = keys.find(k);
        return found == keys.end() ? std::string("(absent)") : found->second;
      };
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{} holds a model of {} layers × {} wide (vocab {}, seq {}), not the one {} "
                                    "describes: key '{}' is {} in the store and {} in the config; --resume needs "
                                    "the same model shape",
                                    dir, stored.n_layer, stored.n_embd, stored.vocab_size, stored.seq_len,
                                    config_.source_path, *key, value(stored_keys, *key), value(config_keys, *key)));
    }
    auto precision = store_->committed_metadata().find("precision");
    if (precision == store_->committed_metadata().end() || precision->second != dtype_name(config_.precision))
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{} was trained with another precision; --resume needs precision: {}", dir,
                                    precision == store_->committed_metadata().end() ? "?" : precision->second));
    // The optimizer state is read as the layout it was written with, or not at all: a kind or
    // rule change would reinterpret its bytes, and converting state is not something a resume
    // does silently (one line, naming the key).
    STRATA_ASSIGN_OR_RETURN(const optim::StateLayout stored_state, optim_state_of(store_->committed_metadata(), dir));
    if (!(stored_state == state_))
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: key 'optimizer.kind': {} holds {} optimizer state, the config asks for {}; "
                                    "--resume does not convert optimizer state: resume with the store's settings",
                                    config_.source_path, dir, stored_state.describe(), state_.describe()));
    STRATA_ASSIGN_OR_RETURN(const uint64_t stored_chunk, optim_chunk_elements_of(store_->committed_metadata(), dir));
    // Evaluation reads P alone: how the optimizer state is chunked does not matter to it.
    if (stored_chunk != config_.optimizer.chunk_elements && !evaluating_)
      return make_error(ErrorKind::invalid_argument,
                        config_.optimizer.chunk_elements_set
                            ? fmt::format("{}: key 'optimizer.chunk_elements': {} keeps optimizer state in chunks of {} "
                                          "elements, not {}; --resume needs the same value",
                                          config_.source_path, dir, stored_chunk, config_.optimizer.chunk_elements)
                            : fmt::format("{}: key 'optimizer.chunk_elements' is not set, so the budgets chose {} "
                                          "elements; {} keeps optimizer state in chunks of {}: set "
                                          "optimizer.chunk_elements: {} to resume it",
                                          config_.source_path, config_.optimizer.chunk_elements, dir, stored_chunk,
                                          stored_chunk));
    const auto stored_ranks = store_->committed_metadata().count("parallel.ranks") == 0
                                  ? uint64_t{1}
                                  : std::strtoull(store_->committed_metadata().at("parallel.ranks").c_str(), nullptr, 10);
    const uint64_t ranks = zero_ != nullptr ? static_cast<uint64_t>(zero_->ranks()) : 1;
    if (stored_ranks != ranks)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{} was committed by a job of {} ranks, this one has {}, and re-slicing "
                                    "(train/zero/zero_reslice.h) did not run: is {} outside the {{rank}} template?",
                                    dir, stored_ranks, ranks, dir));
    start_step = store_->committed_step();
    if (evaluating_) spdlog::info("evaluating the weights committed at step {} in {}", start_step, dir);
    else spdlog::info("resuming from step {} committed in {}", start_step, dir);
    return Status();
  }
  // A fresh run. The store holds each of its tensors at most twice: the committed version
  // and the one being written (a rewrite of an uncommitted version frees it first), plus
  // slack for alignment and for holes the versions leave between commits.
  const uint64_t capacity_bytes = training_store_capacity_bytes(run_);
  struct statvfs fs {};
  if (::statvfs(config_.nvme_paths.front().c_str(), &fs) == 0) {
    uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
    if (free_bytes < capacity_bytes)
      return make_error(ErrorKind::no_space,
                        fmt::format("{} has {} free but the store needs {} (two versions of the training state)",
                                    config_.nvme_paths.front(), format_size(free_bytes), format_size(capacity_bytes)));
  }
  std::vector<std::string> data_paths;
  for (const std::string& path : config_.nvme_paths)
    data_paths.push_back((std::filesystem::path(path) / "strata.data").string());
  STRATA_ASSIGN_OR_RETURN(memory::Store store,
                          memory::Store::create(dir, data_paths, capacity_bytes, store_options_for(config_)));
  store_ = std::make_unique<memory::Store>(std::move(store));
  const std::string trainable =
      layout_.has_adapters()
          ? fmt::format(", {} of them LoRA adapters that train over a frozen {} base", layout_.trainable_parameter_count(),
                        base_dtype_name(config_.model.adapter.base_dtype))
          : std::string();
  spdlog::info("initializing {} parameters ({}{}) in {}", layout_.parameter_count(),
               config_.model.init == "random" ? "random, seed " + std::to_string(config_.model.seed) : config_.model.init,
               trainable, dir);
  STRATA_RETURN_IF_ERROR(initialize_store(config_, layout_, run_, *store_, *host_arena_));
  STRATA_RETURN_IF_ERROR(store_->commit(0, commit_metadata(config_, 0, zero_ != nullptr ? zero_->ranks() : 1)));
  // Reopened so that its engine is fresh: an engine binds to the first thread that submits,
  // and from now on that is the scheduler's I/O thread.
  store_.reset();
  STRATA_ASSIGN_OR_RETURN(memory::Store reopened, memory::Store::open(dir, store_options_for(config_)));
  store_ = std::make_unique<memory::Store>(std::move(reopened));
  start_step = 0;
  return Status();
}

Status Run::create_scheduler(const TrainPlan& plan) {
  // The compute copies are whole units at ZeRO stages 1 and 2 and each rank's share at stage 3
  // (train/zero/zero.h): a store written at the other kind of stage lacks this plan's P tensors.
  for (const UnitIds& ids : plan.units)
    if (ids.params != kNoTensor && !store_->find(plan.plan.tensors()[ids.params].name).has_value())
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: key 'parallel.zero_stage': store {} has no tensor '{}' — it was trained at "
                                    "another stage ({}); --resume needs the zero_stage it was written with",
                                    config_.source_path, store_dir_for(config_), plan.plan.tensors()[ids.params].name,
                                    run_.params_gathered ? "this job keeps each rank's share of the compute copy "
                                                           "(stage 3), the store the whole"
                                                         : "this job keeps the whole compute copy, the store only a "
                                                           "stage-3 rank's share"));
  STRATA_ASSIGN_OR_RETURN(backing_, sch::make_store_backing(*store_, plan.plan));
  sch::SchedulerOptions options;
  options.host_budget_bytes = pool_bytes_;
  // The CPU device computes on the host blocks where they lie (docs/scheduler.md).
  options.compute_in_place = device_->memory_is_host();
  if (!options_.trace_path.empty() && timeline_ == nullptr) timeline_ = std::make_unique<sch::Timeline>(1 << 20);
  options.timeline = timeline_.get();
  STRATA_ASSIGN_OR_RETURN(scheduler_, sch::Scheduler::create(plan.plan, *device_, *host_arena_, backing_.get(),
                                                             std::move(options)));
  // Host-homed persistent state starts from the store's last commit, read on the I/O thread
  // (the store's engine belongs to it) before the first step is acquired.
  for (sch::TensorId id = 0; id < plan.plan.tensors().size(); ++id) {
    const sch::PlanTensor& tensor = plan.plan.tensors()[id];
    if (tensor.home != sch::Home::host || !is_persistent(plan, id)) continue;
    void* host_data = scheduler_->begin_host_access(id);
    Status status =
        scheduler_->run_on_io_thread([&] { return read_tensor(*store_, tensor.name, host_data, tensor.size_bytes); });
    scheduler_->end_host_access(id);
    STRATA_RETURN_IF_ERROR(status);
  }
  return Status();
}

Result<const float*> Run::widen(size_t unit_index, const void* params, float* scratch) {
  const Unit& unit = layout_.units()[unit_index];
  DType dtype = config_.precision;
  if (unit.frozen) {
    if (const kernels::quant::UnitLayout* quantized = layout_.quant_layout(unit_index)) {
      STRATA_RETURN_IF_ERROR(backend_->dequantize_unit(*quantized, params, scratch));
      return static_cast<const float*>(scratch);
    }
    dtype = config_.model.adapter.base_dtype == BaseDType::fp32 ? DType::f32 : DType::bf16;
  }
  if (dtype == DType::f32) return static_cast<const float*>(params);
  STRATA_RETURN_IF_ERROR(
      backend_->cast_bf16_to_fp32(static_cast<const uint16_t*>(params), scratch, unit.element_count));
  return static_cast<const float*>(scratch);
}

Result<std::optional<kernels::lora::BlockAdapters>> Run::adapters_for(size_t block_unit, const TrainPlan& plan,
                                                                      const sch::StepBuffers& buffers, float* scratch,
                                                                      bool with_grads, bool train, uint64_t step,
                                                                      uint32_t micro_batch) {
  if (!layout_.has_adapters()) return std::optional<kernels::lora::BlockAdapters>();
  const int64_t block = layout_.units()[block_unit].block_index;
  const size_t unit_index = layout_.adapter_unit(block);
  const UnitIds& ids = plan.units[unit_index];
  STRATA_ASSIGN_OR_RETURN(const float* weights, widen(unit_index, buffers.device_data(ids.params), scratch));
  float* grads = with_grads ? grads_of(unit_index, buffers) : nullptr;
  // PEFT's dropout is nn.Dropout: on in training, off in evaluation and generation. One key per
  // (seed, update, block): the backward's recompute draws the forward's mask. The mask's rows
  // are token rows of the update's global batch (micro-batch k on rank r starts at row
  // (k·ranks + r)·batch_size·seq_len: TrainBatches::fill's order), so K micro-batches and ZeRO
  // ranks draw the mask one process training the whole batch draws.
  const float dropout = train ? static_cast<float>(config_.model.adapter.dropout) : 0.0f;
  const uint64_t mask_key = splitmix64(splitmix64(splitmix64(config_.model.seed ^ 0x4c6f5241ull) ^ step) ^
                                       static_cast<uint64_t>(block));
  kernels::lora::BlockAdapters adapters = layout_.bind_adapters(
      block, weights, grads, dropout, mask_key,
      kernels::Workspace{static_cast<float*>(lora_scratch_.data()), lora_scratch_.size_bytes()});
  const uint64_t ranks = zero_ != nullptr ? static_cast<uint64_t>(zero_->ranks()) : 1;
  const uint64_t rank = zero_ != nullptr ? static_cast<uint64_t>(zero_->rank()) : 0;
  adapters.spec.mask_first_row = static_cast<int64_t>((uint64_t{micro_batch} * ranks + rank) * shape_.rows());
  return std::optional<kernels::lora::BlockAdapters>(adapters);
}

// Enqueues the ops of one plan step on the backend's stream; nothing here waits for them.
Status Run::compute(size_t step_index, const sch::StepBuffers& buffers, uint64_t step) {
  const StepInfo& info = run_.steps[step_index];
  const models::ModelDefinition& model = layout_.definition();
  const Unit& unit = layout_.units()[info.unit];
  const UnitIds& ids = run_.units[info.unit];
  kernels::ComputeBackend& backend = *backend_;
  auto f32 = [&](sch::TensorId id) { return static_cast<float*>(buffers.device_data(id)); };
  auto* scratch = static_cast<float*>(weights_fp32_.data());
  kernels::Workspace workspace{static_cast<float*>(workspace_.data()), workspace_.size_bytes()};

  switch (info.kind) {
    case StepKind::fwd_embed: {
      STRATA_ASSIGN_OR_RETURN(const float* embed, widen(info.unit, params_of(info.unit, 0, buffers), scratch));
      return model.embedding_forward(backend, shape_, embed, f32(run_.activations[0]));
    }
    case StepKind::fwd_block: {
      STRATA_ASSIGN_OR_RETURN(const float* weights, widen(info.unit, params_of(info.unit, 0, buffers), scratch));
      // The adapters' widened copy goes right after the block's (device_scratch sizes both).
      STRATA_ASSIGN_OR_RETURN(std::optional<kernels::lora::BlockAdapters> adapters,
                              adapters_for(info.unit, run_, buffers, scratch == nullptr ? nullptr : scratch + unit.element_count,
                                           /*with_grads=*/false, /*train=*/true, step, info.micro_batch));
      auto i = static_cast<size_t>(unit.block_index);
      return model.block_forward(backend, shape_, weights, f32(run_.activations[i]),
                                 f32(run_.activations[i + 1]), workspace, adapters ? &*adapters : nullptr);
    }
    case StepKind::head: {
      const Unit& embed_unit = layout_.units()[layout_.embed_unit()];
      STRATA_ASSIGN_OR_RETURN(const float* ln_f, widen(info.unit, params_of(info.unit, 0, buffers), scratch));
      // An fp32 run has no widening scratch (widen hands back the parameters as they are), and
      // an offset from a null pointer is undefined even when nothing reads through it.
      float* const embed_scratch = scratch == nullptr ? nullptr : scratch + unit.element_count;
      STRATA_ASSIGN_OR_RETURN(const float* embed, widen(layout_.embed_unit(), params_of(layout_.embed_unit(), 1, buffers),
                                                        embed_scratch));
      // A frozen head and embedding (LoRA) take no gradient: the head gives grad.x alone.
      float* ln_f_grads = grads_of(info.unit, buffers);
      float* embed_grads = grads_of(layout_.embed_unit(), buffers);
      // Micro-batches after the first add to the gradients the ones before left.
      if (info.micro_batch == 0 && ln_f_grads != nullptr) {
        STRATA_RETURN_IF_ERROR(backend.zero(ln_f_grads, unit.element_count));
        STRATA_RETURN_IF_ERROR(backend.zero(embed_grads, embed_unit.element_count));
      }
      STRATA_RETURN_IF_ERROR(model.head_forward_backward(backend, shape_, ln_f, embed,
                                                         f32(run_.activations[static_cast<size_t>(model.n_layer())]),
                                                         f32(run_.d_x), ln_f_grads, embed_grads, workspace));
      if (ln_f_grads == nullptr) return Status();
      if (!last_micro_batch(info)) return Status();  // the norm is the accumulated gradient's
      if (zero_ != nullptr) return reduce_across_ranks(info.unit, ln_f_grads);
      return backend.sum_squares(ln_f_grads, unit.element_count);
    }
    case StepKind::bwd_block: {
      STRATA_ASSIGN_OR_RETURN(const float* weights, widen(info.unit, params_of(info.unit, 0, buffers), scratch));
      STRATA_ASSIGN_OR_RETURN(std::optional<kernels::lora::BlockAdapters> adapters,
                              adapters_for(info.unit, run_, buffers, scratch == nullptr ? nullptr : scratch + unit.element_count,
                                           /*with_grads=*/true, /*train=*/true, step, info.micro_batch));
      // LoRA: the frozen block takes no gradient; its adapters' unit does.
      const size_t trained = adapters ? layout_.adapter_unit(unit.block_index) : info.unit;
      const uint64_t trained_elements = layout_.units()[trained].element_count;
      float* block_grads = adapters ? nullptr : grads_of(info.unit, buffers);
      float* grads = grads_of(trained, buffers);
      if (info.micro_batch == 0) STRATA_RETURN_IF_ERROR(backend.zero(grads, trained_elements));
      auto i = static_cast<size_t>(unit.block_index);
      float* d_x = f32(run_.d_x);
      STRATA_RETURN_IF_ERROR(model.block_backward(backend, shape_, weights, f32(run_.activations[i]), d_x, d_x,
                                                  block_grads, workspace, /*recompute=*/true,
                                                  adapters ? &*adapters : nullptr));
      if (!last_micro_batch(info)) return Status();
      if (zero_ != nullptr) return reduce_across_ranks(trained, grads);
      return backend.sum_squares(grads, trained_elements);
    }
    case StepKind::bwd_embed: {
      float* grads = grads_of(info.unit, buffers);
      STRATA_RETURN_IF_ERROR(
          model.embedding_backward(backend, shape_, f32(run_.d_x), grads));
      if (!last_micro_batch(info)) return Status();
      if (zero_ != nullptr) return reduce_across_ranks(info.unit, grads);
      return backend.sum_squares(grads, unit.element_count);
    }
    case StepKind::optimize: {
      if (info.site == OptimizerSite::host) return update_on_host(step_index, info, buffers, step);
      // ZeRO: every rank takes the step's clip scale together; a chunk's owner updates it and
      // sends its new compute copy to the others (train/zero/zero.h).
      std::optional<float> zero_clip_scale;
      if (zero_ != nullptr && zero_->device_tensors()) {  // CUDA ranks: summed gradients, scaled here
        STRATA_ASSIGN_OR_RETURN(zero_clip_scale, zero_->device_grad_scale(config_.optimizer.grad_clip, [&] {
          return backend.grad_sum_squares_now();
        }));
      } else if (zero_ != nullptr && config_.optimizer.grad_clip > 0) {
        STRATA_ASSIGN_OR_RETURN(zero_clip_scale, zero_->clip_scale(config_.optimizer.grad_clip));
      }
      if (zero_ != nullptr && !zero_->owns(info.unit, info.chunk))
        return run_.params_gathered ? Status() : share_updated_params(info, buffers);
      // One optimizer chunk, packed as the optimizer's state layout says, updated piecewise.
      const ElementRange range = ids.optim[info.chunk].range;
      const uint64_t begin = range.begin_elements;
      const uint64_t count = range.element_count;
      auto* chunk = static_cast<std::byte*>(buffers.device_data(ids.optim[info.chunk].tensor));
      const float* grads = grads_of(info.unit, buffers);
      // P, or at stage 3 this rank's share of it, which starts at element `first` of the unit.
      void* params = buffers.device_data(ids.params);
      const uint64_t first = run_.params_gathered ? ids.params_range.begin_elements : 0;
      // The clip factor comes from the gradient norm on the stream: no host round trip.
      // Interleaved, it was taken at the end of the pass that computed these gradients.
      const bool clip = config_.optimizer.grad_clip > 0 && !zero_clip_scale;
      if (clip && !run_.interleaved_updates)
        STRATA_RETURN_IF_ERROR(backend.clip_coefficient(config_.optimizer.grad_clip));
      // Interleaved, this pass applies the previous step's update (run_step only computes an
      // opt step when one is pending).
      const uint64_t update_step = run_.interleaved_updates ? pending_update_step_.value_or(step) : step;
      uint16_t* copy = config_.precision == DType::bf16 ? static_cast<uint16_t*>(params) + (begin - first) : nullptr;
      optimizer_pieces(info.unit, begin, count, update_step, chunk, grads + begin, copy, device_pieces_);
      for (kernels::AdamWChunk& piece : device_pieces_) {
        piece.use_clip_scale = clip;
        if (zero_clip_scale) piece.scalars.grad_scale = *zero_clip_scale;
        STRATA_RETURN_IF_ERROR(backend.adamw(piece));
      }
      if (config_.precision == DType::f32)
        STRATA_RETURN_IF_ERROR(
            backend.copy(static_cast<float*>(params) + (begin - first), state_.master(chunk), count * 4));
      if (zero_ != nullptr && !run_.params_gathered) return share_updated_params(info, buffers);
      return Status();
    }
  }
  return Status();
}

// The optimizer work of one chunk, elements [begin, begin + count) of `unit`, on either site:
// the state layout cuts it into one kernel call per unit tensor overlapping the chunk, each with
// its own weight-decay rule. `grads` and `copy` (bf16 compute copy, or null) point at the
// chunk's first element.
void Run::optimizer_pieces(size_t unit, uint64_t begin, uint64_t count, uint64_t step, std::byte* chunk,
                           const float* grads, uint16_t* copy, std::vector<kernels::AdamWChunk>& pieces) const {
  // The schedule's lr of this update (lr_schedule.h: `step` is the update's 0-based index).
  const kernels::AdamWConfig adamw{learning_rate_at(config_, step), config_.optimizer.beta1, config_.optimizer.beta2,
                                   config_.optimizer.eps, config_.optimizer.weight_decay};
  state_.update_pieces(adamw, step, unit_spans_[unit], begin, count, chunk, grads, copy, pieces);
}

// OptimizerSite::host's updater (train/host_update.h), slots sized for the largest chunk;
// nothing when updates run on the device.
Status Run::open_host_optimizer() {
  if (run_.optimizer_site != OptimizerSite::host) return Status();
  uint64_t largest_chunk = 0;
  for (const UnitIds& ids : run_.units)
    for (const OptimChunk& chunk : ids.optim) largest_chunk = std::max(largest_chunk, chunk.range.element_count);
  STRATA_ASSIGN_OR_RETURN(host_updater_, HostUpdater::open(*device_, *host_arena_, largest_chunk, config_.precision));
  return Status();
}

// One optimizer chunk updated on the host (OptimizerSite::host; train/host_update.h): its
// gradients staged device→host behind the backward that made them, the CPU AdamW's calls over
// master/m/v in their host home, the new compute copy back into the step's P and the step's
// release behind it — all the updater's worker's, while the compute stream runs the next
// backward; run_step makes it wait for the updates before the step ends.
Status Run::update_on_host(size_t step_index, const StepInfo& info, const sch::StepBuffers& buffers,
                           uint64_t step) {
  const UnitIds& ids = run_.units[info.unit];
  const ElementRange range = ids.optim[info.chunk].range;
  const uint64_t begin = range.begin_elements;
  const uint64_t count = range.element_count;
  const bool clip = config_.optimizer.grad_clip > 0;
  if (clip && !host_clip_scale_) {
    // The global norm, once per step, after the last backward and before the first update.
    STRATA_ASSIGN_OR_RETURN(double sum_squares, backend_->grad_sum_squares_now());
    host_clip_scale_ = kernels::clip_coefficient(std::sqrt(sum_squares), config_.optimizer.grad_clip);
  }
  // The chunk's home: host memory the scheduler never copies (it is in no step), whose block
  // is fixed for the scheduler's life; only the worker touches it during a step.
  const sch::TensorId optim_id = ids.optim[info.chunk].tensor;
  auto* chunk = static_cast<std::byte*>(scheduler_->begin_host_access(optim_id));
  scheduler_->end_host_access(optim_id);

  device::Stream& compute = backend_->compute_stream();
  STRATA_ASSIGN_OR_RETURN(HostUpdater::Staging staged,
                          host_updater_->stage(compute, grads_of(info.unit, buffers) + begin, count));
  uint16_t* copy = config_.precision == DType::bf16 ? staged.copy : nullptr;
  optimizer_pieces(info.unit, begin, count, step, chunk, staged.grads, copy, *staged.pieces);
  if (clip)
    for (kernels::AdamWChunk& piece : *staged.pieces) piece.scalars.grad_scale = *host_clip_scale_;
  // fp32: the master IS the new compute copy; bf16: the rounded copy the update wrote.
  const uint32_t param_bytes = dtype_size_bytes(config_.precision);
  const void* new_params = config_.precision == DType::f32 ? static_cast<const void*>(state_.master(chunk)) : copy;
  void* device_params = static_cast<std::byte*>(buffers.device_data(ids.params)) + begin * param_bytes;
  return host_updater_->post(staged, compute, *scheduler_, step_index, new_params, device_params, count * param_bytes,
                             release_promised_);
}

Status Run::reduce_across_ranks(size_t unit, float* grads) {
  STRATA_RETURN_IF_ERROR(backend_->synchronize());
  STRATA_RETURN_IF_ERROR(zero_->reduce_gradients(unit, grads));
  if (!zero_->device_tensors()) return Status();
  // CUDA ranks: the owned chunks' share of the global norm, on the stream (train/zero/zero.h).
  for (size_t c = 0; c < zero_->chunks(unit).size(); ++c)
    if (zero_->owns(unit, c))
      STRATA_RETURN_IF_ERROR(backend_->sum_squares(grads + zero_->chunks(unit)[c].begin_elements,
                                                   zero_->chunks(unit)[c].element_count));
  return Status();
}

Status Run::share_updated_params(const StepInfo& info, const sch::StepBuffers& buffers) {
  STRATA_RETURN_IF_ERROR(backend_->synchronize());
  return zero_->share_params(info.unit, info.chunk, buffers.device_data(run_.units[info.unit].params));
}

// The unit's whole compute copy for this step: its P, or at stage 3 the gathered copy
// (`position`: first or second unit of the step's gather).
const void* Run::params_of(size_t unit, size_t position, const sch::StepBuffers& buffers) const {
  if (!run_.params_gathered) return buffers.device_data(run_.units[unit].params);
  return gather_->params(position);
}

float* Run::grads_of(size_t unit, const sch::StepBuffers& buffers) {
  if (run_.units[unit].frozen) return nullptr;
  const sch::TensorId id = run_.units[unit].grads;
  if (id != kNoTensor) return static_cast<float*>(buffers.device_data(id));
  if (unit == layout_.embed_unit()) return static_cast<float*>(embed_grads_.data());
  if (unit == layout_.ln_f_unit()) return static_cast<float*>(ln_f_grads_.data());
  // One block's at a time, or with accumulation each unit's own place (device_grads_offsets).
  return reinterpret_cast<float*>(static_cast<std::byte*>(block_grads_.data()) + device_grads_offsets_[unit]);
}

// One training step: every plan step's ops are enqueued on the backend's stream and its
// tensors given back behind them (release_after); the loss and the gradient norm come back
// once, at the end.
Status Run::run_step(uint64_t step, StepFigures& figures) {
  const uint32_t micro_batches = config_.gradient_accumulation_steps;
  const size_t rows = static_cast<size_t>(shape_.rows());
  // Micro-batch k of update s reads batch s·K + k: K = 1 reads what runs always read (with ZeRO
  // ranks, this rank's block of rows of that global batch: TrainBatches::fill).
  for (uint32_t k = 0; k < micro_batches; ++k)
    batches_->fill(step * micro_batches + k, tokens_.data() + k * rows, targets_.data() + k * rows,
                   positions_.empty() ? nullptr : positions_.data() + k * rows,
                   segments_.empty() ? nullptr : segments_.data() + k * rows);
  if (zero_ != nullptr) zero_->begin_step();
  // K = 1: the batch's own trained-token count (backend.h, StepBatch). K > 1: the count of all
  // K, so the update's loss is the mean over every trained token, not a mean of means. Masked
  // examples on ZeRO ranks: the count over every rank's rows (ZeroStep::set_sum_over_ranks).
  int64_t loss_normalizer_tokens =
      micro_batches > 1 || (zero_ != nullptr && batches_->has_boundaries())
          ? kernels::count_trained_targets(targets_.data(), static_cast<int64_t>(targets_.size()))
          : 0;
  if (zero_ != nullptr && batches_->has_boundaries()) {
    STRATA_ASSIGN_OR_RETURN(loss_normalizer_tokens, zero_->global_count(loss_normalizer_tokens));
  }
  double accumulated_loss = 0.0;  // K > 1: the micro-batches' losses so far (each is its sum / N)
  auto micro_batch = [&](size_t k) {
    const size_t first = k * rows;
    // Packed rows (data.packing): each token's position within its example and the example's
    // id in its row, so attention never crosses examples (null for a token stream).
    kernels::StepBatch batch{tokens_.data() + first, targets_.data() + first, shape_.rows()};
    batch.positions = positions_.empty() ? nullptr : positions_.data() + first;
    batch.segments = segments_.empty() ? nullptr : segments_.data() + first;
    batch.loss_normalizer_tokens = loss_normalizer_tokens;
    return batch;
  };
  if (micro_batches == 1) STRATA_RETURN_IF_ERROR(backend_->begin_step(micro_batch(0)));
  host_clip_scale_.reset();
  for (size_t index = 0; index < run_.plan.step_count(); ++index) {
    if (const StepInfo& info = run_.steps[index]; micro_batches > 1 && info.kind == StepKind::fwd_embed) {
      // A micro-batch begins. The one before it ends with a wait for its loss (begin_step
      // clears it); its gradients stay where the plan keeps them, summed into by this one.
      if (info.micro_batch > 0) {
        STRATA_ASSIGN_OR_RETURN(kernels::StepScalars previous, backend_->end_step());
        accumulated_loss += previous.loss;
      }
      STRATA_RETURN_IF_ERROR(backend_->begin_step(micro_batch(info.micro_batch)));
    }
    STRATA_ASSIGN_OR_RETURN(sch::StepBuffers buffers, scheduler_->acquire(index));
    if (run_.interleaved_updates && run_.steps[index].kind == StepKind::optimize && !pending_update_step_) {
      // No gradients wait (the first pass after a start, resume or commit): the step's
      // tensors were loaded (P and O are read) and go back unchanged, behind the stream's
      // earlier work like any step's.
      STRATA_RETURN_IF_ERROR(scheduler_->release_after(index, backend_->compute_stream()));
      continue;
    }
    // Stage 3: this step's gathered units (waited for; counted in comm time, not compute).
    Status gathered;
    if (gather_ && gather_->gathers(index)) gathered = gather_->for_step(index, buffers);
    STRATA_RETURN_IF_ERROR(compute_and_release(index, buffers, step, std::move(gathered), figures.compute_seconds));
  }
  if (run_.optimizer_site == OptimizerSite::host) {
    // The step ends when the host updates have: once the worker has enqueued the last copy,
    // the compute stream waits for them on the device, so end_step's one sync covers them and
    // the next step's compute follows them. (end_step waits on the host anyway: waiting for
    // the worker first costs nothing.)
    STRATA_RETURN_IF_ERROR(host_updater_->finish_step(backend_->compute_stream()));
  }
  // Interleaved: this step's clip coefficient, from the whole sum, stays on the stream for its
  // updates in the next pass (begin_step does not clear it).
  if (run_.interleaved_updates) STRATA_RETURN_IF_ERROR(backend_->clip_coefficient(config_.optimizer.grad_clip));
  STRATA_ASSIGN_OR_RETURN(kernels::StepScalars scalars, backend_->end_step());
  // The mean over every trained token of the K micro-batches: each loss is its sum over N.
  if (micro_batches > 1) scalars.loss += accumulated_loss;
  if (zero_ != nullptr) {
    STRATA_ASSIGN_OR_RETURN(scalars.loss, zero_->mean_loss(scalars.loss));
  }
  host_clip_scale_.reset();
  if (host_updater_ != nullptr)
    if (Status updated = host_updater_->first_error(); !updated.ok())
      return make_error(ErrorKind::internal,
                        fmt::format("step {}: a host AdamW update failed: {}", step + 1, updated.error().message));
  // A diverged step is never committed: the check comes before the checkpoint that follows.
  if (!std::isfinite(scalars.loss))
    return make_error(ErrorKind::internal,
                      fmt::format("step {}: the loss is {} — training diverged (lower optimizer.lr?); the last "
                                  "commit (step {}) is intact",
                                  step + 1, scalars.loss, committed_step_));
  figures.loss = scalars.loss;
  if (run_.interleaved_updates) pending_update_step_ = step;
  return Status();
}

// Computes an acquired step (unless `status`, e.g. a failed gather, already failed), adds its
// time to `compute_seconds` and the trace, and releases it behind the work it enqueued — or at
// once when it failed.
Status Run::compute_and_release(size_t index, const sch::StepBuffers& buffers, uint64_t step, Status status,
                                double& compute_seconds) {
  const uint64_t start_ns = sch::Timeline::now_ns();
  release_promised_ = false;
  if (status.ok()) status = compute(index, buffers, step);
  const uint64_t end_ns = sch::Timeline::now_ns();
  compute_seconds += static_cast<double>(end_ns - start_ns) * 1e-9;
  if (sch::Timeline* timeline = scheduler_->timeline(); timeline != nullptr)
    timeline->record(sch::TraceTrack::compute, run_.plan.steps()[index].name, start_ns, end_ns);
  // A host-site update's step is released by the host updater, behind the copy of its P back.
  if (release_promised_) return status;
  Status released = status.ok() ? scheduler_->release_after(index, backend_->compute_stream())
                                 : scheduler_->release(index);
  STRATA_RETURN_IF_ERROR(status);
  return released;
}

Status Run::drain_pending_update() {
  if (!run_.interleaved_updates || !pending_update_step_) return Status();
  // One pass of the plan in which only the opt steps compute. The others are acquired and
  // released untouched: the plan is cyclic, so the scheduler must see every step in order.
  // What they list as written but not read (activations, gradients, grad.x) may go home as
  // whatever their buffers held — none of it is persistent, and every one is rewritten before
  // it is next read (the next pass's opt steps have no gradients to read).
  double compute_seconds = 0;  // a drain is not a training step: its time goes in no figure
  for (size_t index = 0; index < run_.plan.step_count(); ++index) {
    STRATA_ASSIGN_OR_RETURN(sch::StepBuffers buffers, scheduler_->acquire(index));
    if (run_.steps[index].kind != StepKind::optimize) {
      STRATA_RETURN_IF_ERROR(scheduler_->release_after(index, backend_->compute_stream()));
      continue;
    }
    STRATA_RETURN_IF_ERROR(compute_and_release(index, buffers, *pending_update_step_, Status(), compute_seconds));
  }
  STRATA_RETURN_IF_ERROR(backend_->synchronize());
  pending_update_step_.reset();
  return Status();
}

// --- Evaluation (trainer.h) ----------------------------------------------------------------

// Where keep_best keeps the best evaluation's weights: an HF folder beside the store's files,
// with best.json naming its step and eval loss (read back on resume).
std::string best_dir_for(const TrainConfig& config) {
  return (std::filesystem::path(store_dir_for(config)) / "best").string();
}

void add_stats(sch::SchedulerStats& into, const sch::SchedulerStats& from) {
  into.steps_acquired += from.steps_acquired;
  into.stall_ns += from.stall_ns;
  into.max_step_stall_ns = std::max(into.max_step_stall_ns, from.max_step_stall_ns);
  if (into.stall_ns_by_step.size() < from.stall_ns_by_step.size()) into.stall_ns_by_step.resize(from.stall_ns_by_step.size());
  for (size_t i = 0; i < from.stall_ns_by_step.size(); ++i) into.stall_ns_by_step[i] += from.stall_ns_by_step[i];
  for (size_t pair = 0; pair < sch::kTierPairCount; ++pair) {
    into.transfers[pair].bytes += from.transfers[pair].bytes;
    into.transfers[pair].transfers += from.transfers[pair].transfers;
    into.transfers[pair].busy_ns += from.transfers[pair].busy_ns;
  }
  into.device_evictions += from.device_evictions;
  into.host_evictions += from.host_evictions;
  into.device_high_water_bytes = std::max(into.device_high_water_bytes, from.device_high_water_bytes);
  into.host_high_water_bytes = std::max(into.host_high_water_bytes, from.host_high_water_bytes);
  into.host_budget_bytes = from.host_budget_bytes;
  into.device_budget_bytes = from.device_budget_bytes;
}

sch::SchedulerStats Run::training_stats() const {
  sch::SchedulerStats stats = carried_stats_;
  add_stats(stats, scheduler_->stats());
  return stats;
}

Status Run::open_eval(const std::string& eval_path) {
  if (zero_ != nullptr && config_.eval.keep_best)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'checkpoint.keep_best' is one rank's for now (the best weights are read "
                                  "from every rank's store): drop it and export the best step's commit",
                                  config_.source_path));
  // Stage 3: the same shares as training's, each step gathering its units as training's do.
  eval_run_ = zero_ != nullptr ? build_eval_plan(config_, layout_, zero_->owners(), zero_->rank())
                               : build_eval_plan(config_, layout_);
  STRATA_RETURN_IF_ERROR(eval_run_.plan.validate());
  const uint32_t global_rows = zero_ != nullptr ? zero_->global_batch() : config_.batch_size;
  STRATA_ASSIGN_OR_RETURN(eval_batches_,
                          TrainBatches::open(config_, global_rows, config_.batch_size, zero_ != nullptr ? zero_->rank() : 0,
                                             TrainBatches::Part::eval, eval_path));
  // keep_best across a resume: the best so far is what best.json says.
  if (config_.eval.keep_best) {
    std::ifstream in(std::filesystem::path(best_dir_for(config_)) / "best.json");
    if (in) {
      nlohmann::json best = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (best.is_object() && best.contains("eval_loss") && best["eval_loss"].is_number())
        best_eval_loss_ = best["eval_loss"].get<double>();
    }
  }
  return Status();
}

Status Run::switch_scheduler(const TrainPlan& plan, bool carry, const std::function<Status()>& between) {
  if (carry) add_stats(carried_stats_, scheduler_->stats());
  scheduler_.reset();
  backing_.reset();
  store_.reset();
  if (between) STRATA_RETURN_IF_ERROR(between());
  STRATA_ASSIGN_OR_RETURN(memory::Store reopened, memory::Store::open(store_dir_for(config_), store_options_for(config_)));
  store_ = std::make_unique<memory::Store>(std::move(reopened));
  return create_scheduler(plan);
}

Result<EvalFigures> Run::evaluate_after_commit(uint64_t step) {
  STRATA_RETURN_IF_ERROR(switch_scheduler(eval_run_, /*carry=*/true));
  // Stage 3: the gather buffers serve the evaluation's steps (no gather is in flight between
  // iterations), then training's again. A failed evaluation fails the run: nothing to switch back.
  if (gather_) gather_->use_plan(eval_run_);
  Result<EvalFigures> figures = eval_passes();
  if (figures.ok()) figures->step = step;
  if (gather_ && figures.ok()) gather_->use_plan(run_);
  // Back to training as after a resume, whatever the evaluation did; a new best is exported
  // while no Store object is open.
  Status back = switch_scheduler(run_, /*carry=*/false, [&]() -> Status {
    if (!figures.ok() || !config_.eval.keep_best) return Status();
    return keep_if_best(step, figures->loss);
  });
  STRATA_RETURN_IF_ERROR(figures.status());
  STRATA_RETURN_IF_ERROR(back);
  return figures;
}

Status Run::keep_if_best(uint64_t step, double eval_loss) {
  if (best_eval_loss_ && eval_loss >= *best_eval_loss_) return Status();
  // Written beside and swapped in, so a kill leaves the previous best or the new one whole.
  const std::filesystem::path best = best_dir_for(config_);
  const std::filesystem::path fresh = best.string() + ".new";
  const std::filesystem::path old = best.string() + ".old";
  std::error_code error;
  std::filesystem::remove_all(fresh, error);
  STRATA_RETURN_IF_ERROR(export_store_weights(store_dir_for(config_), fresh.string()));
  {
    std::ofstream out(fresh / "best.json");
    out << nlohmann::ordered_json{{"step", step}, {"eval_loss", eval_loss}}.dump() << "\n";
    if (!out) return make_errno_error(errno, "write", (fresh / "best.json").string());
  }
  std::filesystem::remove_all(old, error);
  if (std::filesystem::exists(best, error)) std::filesystem::rename(best, old, error);
  if (error) return make_errno_error(error.value(), "rename", best.string());
  std::filesystem::rename(fresh, best, error);
  if (error) return make_errno_error(error.value(), "rename", fresh.string());
  std::filesystem::remove_all(old, error);
  best_eval_loss_ = eval_loss;
  spdlog::info("eval loss {:.4f} at step {} is the best so far: its weights are in {}", eval_loss, step, best.string());
  return Status();
}

// Every held-out batch through the forward steps of eval_run_; the loss over every trained
// token (each batch's mean times its count, summed in double — over every rank with ZeRO).
Result<EvalFigures> Run::eval_passes() {
  const auto start = Clock::now();
  EvalFigures figures;
  const auto rows = static_cast<size_t>(shape_.rows());
  double loss_sum = 0.0;
  double tokens = 0.0;
  for (uint64_t b = 0; b < eval_batches_->eval_batches(); ++b) {
    eval_batches_->fill(b, tokens_.data(), targets_.data(), positions_.empty() ? nullptr : positions_.data(),
                        segments_.empty() ? nullptr : segments_.data());
    const int64_t trained = kernels::count_trained_targets(targets_.data(), static_cast<int64_t>(rows));
    kernels::StepBatch batch{tokens_.data(), targets_.data(), shape_.rows()};
    batch.positions = positions_.empty() ? nullptr : positions_.data();
    batch.segments = segments_.empty() ? nullptr : segments_.data();
    batch.loss_normalizer_tokens = trained;
    STRATA_RETURN_IF_ERROR(backend_->begin_step(batch));
    for (size_t index = 0; index < eval_run_.plan.step_count(); ++index) {
      STRATA_ASSIGN_OR_RETURN(sch::StepBuffers buffers, scheduler_->acquire(index));
      // Stage 3: the step's units gathered from every rank's share, as in training.
      Status status;
      if (gather_ && gather_->gathers(index)) status = gather_->for_step(index, buffers);
      const uint64_t start_ns = sch::Timeline::now_ns();
      if (status.ok()) status = compute_eval(index, buffers);
      if (timeline_ != nullptr)
        timeline_->record(sch::TraceTrack::compute, eval_run_.plan.steps()[index].name, start_ns, sch::Timeline::now_ns());
      Status released = status.ok() ? scheduler_->release_after(index, backend_->compute_stream())
                                    : scheduler_->release(index);
      STRATA_RETURN_IF_ERROR(status);
      STRATA_RETURN_IF_ERROR(released);
    }
    STRATA_ASSIGN_OR_RETURN(kernels::StepScalars scalars, backend_->end_step());
    loss_sum += scalars.loss * static_cast<double>(trained);
    tokens += static_cast<double>(trained);
  }
  if (zero_ != nullptr) {
    double totals[2] = {loss_sum, tokens};
    STRATA_RETURN_IF_ERROR(zero_->comm().allreduce_sum(std::span<double>(totals, 2)));
    loss_sum = totals[0];
    tokens = totals[1];
  }
  figures.loss = tokens > 0 ? loss_sum / tokens : 0.0;
  figures.perplexity = std::exp(figures.loss);
  figures.tokens = static_cast<uint64_t>(tokens);
  figures.batches = eval_batches_->eval_batches();
  figures.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  figures.bytes_read_nvme = scheduler_->stats().transfers[static_cast<size_t>(sch::TierPair::nvme_to_host)].bytes;
  if (!std::isfinite(figures.loss))
    return make_error(ErrorKind::internal, fmt::format("the eval loss is {}: the weights have diverged", figures.loss));
  return figures;
}

// The forward ops of eval_run_'s steps, and the head's loss without gradients.
Status Run::compute_eval(size_t step_index, const sch::StepBuffers& buffers) {
  const StepInfo& info = eval_run_.steps[step_index];
  const models::ModelDefinition& model = layout_.definition();
  const Unit& unit = layout_.units()[info.unit];
  auto f32 = [&](sch::TensorId id) { return static_cast<float*>(buffers.device_data(id)); };
  // The unit's whole compute copy: its P, or at stage 3 the gathered one (`position` in the
  // step's gather: 0, or 1 for the head's embeddings).
  auto params = [&](size_t u, size_t position) -> const void* {
    return eval_run_.params_gathered ? gather_->params(position) : buffers.device_data(eval_run_.units[u].params);
  };
  auto* scratch = static_cast<float*>(weights_fp32_.data());
  kernels::Workspace workspace{static_cast<float*>(workspace_.data()), workspace_.size_bytes()};
  switch (info.kind) {
    case StepKind::fwd_embed: {
      STRATA_ASSIGN_OR_RETURN(const float* embed, widen(info.unit, params(info.unit, 0), scratch));
      return model.embedding_forward(*backend_, shape_, embed, f32(eval_run_.activations[0]));
    }
    case StepKind::fwd_block: {
      STRATA_ASSIGN_OR_RETURN(const float* weights, widen(info.unit, params(info.unit, 0), scratch));
      STRATA_ASSIGN_OR_RETURN(std::optional<kernels::lora::BlockAdapters> adapters,
                              adapters_for(info.unit, eval_run_, buffers,
                                           scratch == nullptr ? nullptr : scratch + unit.element_count,
                                           /*with_grads=*/false, /*train=*/false, 0, 0));
      const auto i = static_cast<size_t>(unit.block_index);
      return model.block_forward(*backend_, shape_, weights, f32(eval_run_.activations[i]),
                                 f32(eval_run_.activations[i + 1]), workspace, adapters ? &*adapters : nullptr);
    }
    case StepKind::head: {
      STRATA_ASSIGN_OR_RETURN(const float* final_weights, widen(info.unit, params(info.unit, 0), scratch));
      float* const embed_scratch = scratch == nullptr ? nullptr : scratch + unit.element_count;
      STRATA_ASSIGN_OR_RETURN(const float* embed, widen(layout_.embed_unit(), params(layout_.embed_unit(), 1), embed_scratch));
      return model.head_loss(*backend_, shape_, final_weights, embed,
                             f32(eval_run_.activations[static_cast<size_t>(model.n_layer())]), workspace);
    }
    case StepKind::bwd_block:
    case StepKind::bwd_embed:
    case StepKind::optimize:
      break;
  }
  return make_error(ErrorKind::internal, "the evaluation plan has a step that is not a forward step");
}

Status Run::checkpoint(uint64_t step) {
  // Every dirty copy reaches its home first; then host-homed persistent state joins the
  // store, and one commit makes the step durable — all on the I/O thread, which owns the store.
  STRATA_RETURN_IF_ERROR(scheduler_->flush());
  std::vector<std::pair<sch::TensorId, void*>> host_tensors;
  for (sch::TensorId id = 0; id < run_.plan.tensors().size(); ++id)
    if (run_.plan.tensors()[id].home == sch::Home::host && is_rewritten(run_, id))
      host_tensors.emplace_back(id, scheduler_->begin_host_access(id));
  Status status = scheduler_->run_on_io_thread([&]() -> Status {
    for (const auto& [id, host_data] : host_tensors) {
      const sch::PlanTensor& tensor = run_.plan.tensors()[id];
      std::optional<memory::TensorRecord> record = store_->find(tensor.name);
      assert(record.has_value());  // initialize_store wrote every persistent tensor
      STRATA_RETURN_IF_ERROR(
          write_tensor(*store_, tensor.name, record->dtype, record->shape, host_data, tensor.size_bytes));
    }
    if (zero_ != nullptr)  // phase one of the global commit (reconcile_global_commit, train/zero/zero.h)
      return store_->prepare_commit(step, commit_metadata(config_, step, zero_->ranks()));
    STRATA_RETURN_IF_ERROR(store_->commit(step, commit_metadata(config_, step)));
    nvme_used_bytes_ = store_->stats().used_bytes;
    return Status();
  });
  for (const auto& entry : host_tensors) scheduler_->end_host_access(entry.first);
  if (!status.ok() || zero_ == nullptr) return status;
  // Phase two: every rank has prepared the step; each makes it its store's committed version.
  STRATA_RETURN_IF_ERROR(zero_->comm().barrier());
  return scheduler_->run_on_io_thread([&]() -> Status {
    STRATA_RETURN_IF_ERROR(store_->finish_commit());
    nvme_used_bytes_ = store_->stats().used_bytes;
    return Status();
  });
}

// A failed step keeps the cause (tensor, file, offset, errno) and says what the user has:
// the last commit, untouched, and the command that continues from it.
Error Run::step_failed(Error error, uint64_t step, bool committing) const {
  // The whole cause (op, file, range, tensor, errno text) goes in the middle of the sentence,
  // so the line reads in order: which step, why, what is left, what to do.
  const std::string cause = error.to_string();
  error.message = fmt::format("step {} failed{}: {} — the store still holds step {} as committed (check it with "
                              "`strata store verify {}`); fix the cause and continue with `strata train {} --resume`",
                              step, committing ? " while committing" : "", cause, committed_step_,
                              store_dir_for(config_), config_.source_path);
  // Already in the message: to_string() must not print them again around it. The kind stays.
  error.op.clear();
  error.path.clear();
  error.tensor.clear();
  error.has_range = false;
  error.errno_value = 0;
  return error;
}

Status Run::write_metrics(const std::vector<StepFigures>& figures, const TrainSummary& summary) const {
  nlohmann::ordered_json json;
  json["config"] = config_.source_path;
  json["tokens_per_step"] = uint64_t{config_.batch_size} * config_.model.seq_len;
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const StepFigures& f : figures) {
    steps.push_back({{"step", f.step},
                     {"loss", f.loss},
                     {"learning_rate", f.learning_rate},
                     {"seconds", f.seconds},
                     {"compute_seconds", f.compute_seconds},
                     {"stall_seconds", f.stall_seconds},
                     {"nvme_read_bytes", f.bytes[static_cast<size_t>(sch::TierPair::nvme_to_host)]},
                     {"nvme_write_bytes", f.bytes[static_cast<size_t>(sch::TierPair::host_to_nvme)]},
                     {"host_to_device_bytes", f.bytes[static_cast<size_t>(sch::TierPair::host_to_device)]},
                     {"device_to_host_bytes", f.bytes[static_cast<size_t>(sch::TierPair::device_to_host)]},
                     {"device_bytes", f.tier_bytes[0]},
                     {"host_bytes", f.tier_bytes[1]},
                     {"nvme_bytes", f.tier_bytes[2]}});
    if (f.eval_loss) steps.back()["eval_loss"] = *f.eval_loss;
  }
  // The budgets as the run used them: on the CPU device, host is the one pool (see execute).
  json["budgets"] = {{"device", device_budget_bytes_},
                     {"host", pool_bytes_},
                     {"nvme", nvme_capacity_bytes_}};
  json["steps"] = std::move(steps);
  // Fine-tuning examples: what start-up made of them, the skipped ones counted (docs/data.md).
  if (const data::BatchStats* d = batches_->example_stats())
    json["data"] = {{"examples", d->examples},           {"examples_used", d->examples_used},
                    {"skipped_untrained", d->skipped_untrained}, {"bad_lines_skipped", d->bad_lines_skipped},
                    {"truncated", d->truncated},         {"rows_per_epoch", d->rows},
                    {"trained_tokens_per_epoch", d->trained_tokens}, {"row_tokens_per_epoch", d->row_tokens}};
  json["summary"] = summary_json(summary);
  std::ofstream out(options_.metrics_path);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return make_errno_error(errno, "write metrics", options_.metrics_path);
  return Status();
}

// The device of `device.kind` and its compute backend. No GPU where cuda is asked for is the
// user's configuration error (exit 2), said in one line before anything is created.
Status Run::open_device() {
  STRATA_ASSIGN_OR_RETURN(device::Kind kind, device::parse_kind(config_.device_kind));
  if (kind == device::Kind::cuda && device::cuda_device_count() == 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'device.kind': no CUDA device {}; use kind: cpu", config_.source_path,
                                  STRATA_HAVE_CUDA ? "is visible to this process (no GPU, or no driver)"
                                                   : "support in this build (nvcc was not found at setup)"));
  // CUDA ranks: rank r computes on the GPU its NCCL communicator took (rank % GPUs, comm/comm.h).
  const int ordinal = zero_ != nullptr && kind == device::Kind::cuda ? zero_->rank() % device::cuda_device_count() : 0;
  STRATA_ASSIGN_OR_RETURN(device_,
                          device::make_device(kind, run_budgets(config_, layout_).timing_device_bytes, ordinal));
  STRATA_ASSIGN_OR_RETURN(backend_, kernels::make_backend(*device_, shape_));
  return Status();
}

// The budgets as run_ asks for them: the device (remade as one pool on the CPU device), the
// pinned host arena, the kernels' workspace and the widening scratch — all of it once, here.
Status Run::open_memory() {
  const DeviceScratchSizes scratch = device_scratch(config_, layout_, &run_);
  // On the CPU device, device memory is host memory: the device region keeps only the kernels'
  // scratch, and the rest of device.memory + host.memory is one pool that the scheduler stages
  // and computes in (run_budgets; check_budgets has made sure one step fits it).
  const RunBudgets budgets = run_budgets(config_, layout_, &run_);
  pool_bytes_ = budgets.pool_bytes;
  device_budget_bytes_ = budgets.device_region_bytes;
  if (budgets.one_pool) {
    backend_.reset();  // it holds the device it was made for
    device_.reset();
    STRATA_ASSIGN_OR_RETURN(device_, device::make_device(device::Kind::cpu, budgets.device_region_bytes));
    STRATA_ASSIGN_OR_RETURN(backend_, kernels::make_backend(*device_, shape_));
    spdlog::info("cpu device: computing in place; device.memory + host.memory are one pool: {} of kernel scratch, "
                 "{} for the scheduler",
                 format_size(budgets.device_region_bytes), format_size(pool_bytes_));
  }
  memory::HostArenaOptions arena_options;
  arena_options.try_cuda = device_->kind() == device::Kind::cuda;  // pinned by CUDA only for a CUDA run
  // Host-site updates stage outside the scheduler's budget (host_optimizer_staging_bytes).
  arena_options.capacity_bytes = pool_bytes_ + host_optimizer_staging_bytes(config_, layout_, run_);
  STRATA_ASSIGN_OR_RETURN(memory::HostArena arena, memory::HostArena::create(arena_options));
  host_arena_ = std::make_unique<memory::HostArena>(std::move(arena));
  STRATA_ASSIGN_OR_RETURN(workspace_, device_->allocate(layout_.definition().workspace_size_bytes(*backend_, shape_)));
  if (scratch.weights_fp32_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(weights_fp32_, device_->allocate(scratch.weights_fp32_bytes));
  }
  if (scratch.lora_scratch_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(lora_scratch_, device_->allocate(scratch.lora_scratch_bytes));
  }
  return Status();
}

Result<EvalFigures> Run::evaluate_committed(const std::string& eval_path) {
  evaluating_ = true;
  run_ = build_train_plan(config_, layout_);  // the budgets and scratch as the run had them
  STRATA_RETURN_IF_ERROR(check_budgets(config_, layout_, run_));
  if (!config_.eval.enabled && eval_path.empty())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} has no eval: block; give the held-out data with --data FILE (in data.format)",
                                  config_.source_path));
  STRATA_RETURN_IF_ERROR(open_eval(eval_path));
  const std::string dir = store_dir_for(config_);
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::path(dir) / memory::kStoreManifestName, error))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} holds no store: train with {} first (strata eval reads its committed weights)", dir,
                                  config_.source_path));
  STRATA_RETURN_IF_ERROR(open_device());
  STRATA_RETURN_IF_ERROR(open_memory());
  uint64_t step = 0;
  STRATA_RETURN_IF_ERROR(open_store(step));  // options_.resume: the checks a resume makes, nothing written
  STRATA_RETURN_IF_ERROR(create_scheduler(eval_run_));
  tokens_.resize(static_cast<size_t>(shape_.rows()));
  targets_.resize(tokens_.size());
  if (eval_batches_->has_boundaries()) {
    positions_.resize(tokens_.size());
    segments_.resize(tokens_.size());
  }
  STRATA_ASSIGN_OR_RETURN(EvalFigures figures, eval_passes());
  figures.step = step;
  scheduler_.reset();
  backing_.reset();
  store_.reset();
  return figures;
}

Result<TrainSummary> Run::execute() {
  // ZeRO with accumulation: each rank sums its micro-batches' gradients in its whole G and
  // the reduction runs once, after the last micro-batch's backward. At stage 3 every pass
  // gathers its units again, in the order build_train_plan lays out K times over.
  run_ = zero_ != nullptr ? build_train_plan(config_, layout_, zero_->owners(), zero_->rank())
                         : build_train_plan(config_, layout_);
  STRATA_RETURN_IF_ERROR(run_.plan.validate());
  STRATA_RETURN_IF_ERROR(check_budgets(config_, layout_, run_));
  const uint32_t global_rows = zero_ != nullptr ? zero_->global_batch() : config_.batch_size;
  STRATA_ASSIGN_OR_RETURN(batches_, TrainBatches::open(config_, global_rows, config_.batch_size,
                                                       zero_ != nullptr ? zero_->rank() : 0));
  // Masked examples: each rank's loss over the global trained-token count, summed (zero.h).
  if (zero_ != nullptr) zero_->set_sum_over_ranks(batches_->has_boundaries());
  if (config_.eval.enabled) STRATA_RETURN_IF_ERROR(open_eval());
  STRATA_RETURN_IF_ERROR(check_init_file(config_));
  const uint64_t total_steps = options_.steps >= 0 ? static_cast<uint64_t>(options_.steps) : batches_->total_steps(config_);

  STRATA_RETURN_IF_ERROR(open_device());
  // The prediction `strata plan` makes, timed on the still empty device arena.
  std::optional<StepPrediction> prediction;
  if (Result<ComputeRates> rates = measure_compute(config_, layout_, *device_, *backend_); rates.ok()) {
    prediction = predict_step(config_, layout_, run_, *rates);
    spdlog::info("predicted step: {:.2f} s ({}-bound: compute {:.2f} s, I/O floor {:.2f} s at {:.0f}/{:.0f} MB/s{}); "
                 "timing the kernels took {:.1f} s",
                 prediction->step_s, prediction->bound, prediction->compute_s, prediction->io_s, prediction->read_MBps,
                 prediction->write_MBps, prediction->tuned ? ", tuned" : ", untuned", rates->measure_seconds);
  } else {
    spdlog::debug("no step prediction: {}", rates.error().to_string());
  }
  STRATA_RETURN_IF_ERROR(open_memory());
  const DeviceScratchSizes scratch = device_scratch(config_, layout_, &run_);
  if (run_.params_gathered) {  // ZeRO stage 3: the two gather buffers, for the whole run
    STRATA_ASSIGN_OR_RETURN(ParamGather gather,
                            ParamGather::create(config_, layout_, run_, *zero_, *device_, *backend_));
    gather_.emplace(std::move(gather));
  }
  if (config_.placement.grads == Tier::device) {
    device_grads_offsets_ = device_grads_offsets(config_, layout_);
    STRATA_ASSIGN_OR_RETURN(block_grads_, device_->allocate(scratch.block_grads_bytes));
    STRATA_ASSIGN_OR_RETURN(embed_grads_, device_->allocate(scratch.embed_grads_bytes));
    STRATA_ASSIGN_OR_RETURN(ln_f_grads_, device_->allocate(scratch.ln_f_grads_bytes));
  }

  uint64_t start_step = 0;
  STRATA_RETURN_IF_ERROR(open_store(start_step));
  committed_step_ = start_step;
  if (start_step >= total_steps) {
    spdlog::info("the store is already at step {} of {}: nothing to train", start_step, total_steps);
    TrainSummary summary;
    summary.first_step = summary.last_step = start_step;
    summary.state_bytes = training_state_bytes(run_, layout_);
    summary.peak_rss_bytes = peak_rss_bytes();
    if (!options_.export_path.empty()) {
      store_.reset();
      STRATA_RETURN_IF_ERROR(export_store_weights(store_dir_for(config_), options_.export_path,
                                                   options_.export_shard_size_bytes));
    }
    return summary;
  }
  const memory::StoreStats store_stats = store_->stats();
  nvme_used_bytes_ = store_stats.used_bytes;
  nvme_capacity_bytes_ = store_stats.capacity_bytes;
  STRATA_RETURN_IF_ERROR(create_scheduler(run_));
  STRATA_RETURN_IF_ERROR(open_host_optimizer());
  tokens_.resize(static_cast<size_t>(shape_.rows()) * config_.gradient_accumulation_steps);
  targets_.resize(tokens_.size());
  if (batches_->has_boundaries()) {
    positions_.resize(tokens_.size());
    segments_.resize(tokens_.size());
  }

  spdlog::info("training {} parameters for steps {}..{}: device {} ({}), host {}, store {} ({})",
               layout_.parameter_count(), start_step + 1, total_steps, config_.device_kind,
               format_size(config_.device_memory_bytes), format_size(config_.host_memory_bytes), store_dir_for(config_),
               format_size(training_state_bytes(run_, layout_)));
  std::vector<StepFigures> figures;
  TrainSummary summary;
  summary.first_step = start_step;
  // The job's tokens: with ZeRO ranks, the global batch (config_.batch_size is this rank's share).
  // With accumulation, the K micro-batches of one update.
  const uint64_t tokens_per_step = uint64_t{zero_ != nullptr ? zero_->global_batch() : config_.batch_size} *
                                   config_.model.seq_len * config_.gradient_accumulation_steps;
  if (options_.monitor != nullptr) {
    progress::RunInfo info{config_.source_path, start_step, total_steps, tokens_per_step,
                          prediction ? prediction->step_s : 0.0,
                          {device_budget_bytes_, pool_bytes_, nvme_capacity_bytes_}};
    options_.monitor->begin(info);
  }
  const auto run_start = Clock::now();
  sch::SchedulerStats previous = scheduler_->stats();
  for (uint64_t step = start_step; step < total_steps; ++step) {
    StepFigures f;
    f.step = step + 1;
    f.learning_rate = learning_rate_at(config_, step);
    const auto step_start = Clock::now();
    // An evaluation measures committed weights, so its step commits too (trainer.h).
    const bool evaluate = config_.eval.enabled && ((step + 1) % config_.eval.every == 0 || step + 1 == total_steps);
    const bool commit = (step + 1) % config_.checkpoint_every == 0 || step + 1 == total_steps || evaluate;
    Status status = run_step(step, f);
    // Interleaved, step + 1's update is still pending: a commit applies it first.
    if (status.ok() && commit) status = drain_pending_update();
    if (status.ok() && commit) status = checkpoint(step + 1);
    if (!status.ok()) return step_failed(status.error(), step + 1, commit);
    if (commit) committed_step_ = step + 1;
    f.seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    sch::SchedulerStats now = scheduler_->stats();
    f.stall_seconds = static_cast<double>(now.stall_ns - previous.stall_ns) * 1e-9;
    for (size_t pair = 0; pair < sch::kTierPairCount; ++pair)
      f.bytes[pair] = now.transfers[pair].bytes - previous.transfers[pair].bytes;
    previous = now;
    f.tier_bytes[0] = device_->memory_stats().used_bytes;
    f.tier_bytes[1] = host_arena_->stats().allocator.used_bytes;
    f.tier_bytes[2] = nvme_used_bytes_;
    f.committed = commit;
    if (evaluate) {
      Result<EvalFigures> evaluated = evaluate_after_commit(step + 1);
      if (!evaluated.ok()) return step_failed(evaluated.error(), step + 1, false);
      f.eval_loss = evaluated->loss;
      summary.evaluations.push_back(*evaluated);
      previous = scheduler_->stats();  // the training scheduler is a new one: it counts from zero
      if (options_.progress)
        fmt::print(stderr, "eval  {:>5}/{} | eval loss {:.4f} | perplexity {:.3f} | {} tokens in {} batches | {:.1f} s{}\n",
                   f.step, total_steps, evaluated->loss, evaluated->perplexity, evaluated->tokens, evaluated->batches,
                   evaluated->seconds, best_eval_loss_ && *best_eval_loss_ == evaluated->loss && config_.eval.keep_best
                                           ? " | best, kept"
                                           : "");
    }
    if (options_.monitor != nullptr) options_.monitor->record_step(monitor_sample(f));
    if (figures.empty()) summary.first_loss = f.loss;
    figures.push_back(f);
    if (options_.progress) {
      auto rate = [&](sch::TierPair pair) { return static_cast<double>(f.bytes[static_cast<size_t>(pair)]) / f.seconds / 1e9; };
      fmt::print(stderr,
                 "step {:>5}/{} | loss {:.4f} | lr {:.3e} | {:>7.0f} tok/s | nvme r {:.2f} w {:.2f} GB/s | h2d {:.2f} "
                 "d2h {:.2f} GB/s | stall {:4.1f}%{}\n",
                 f.step, total_steps, f.loss, f.learning_rate, static_cast<double>(tokens_per_step) / f.seconds,
                 rate(sch::TierPair::nvme_to_host), rate(sch::TierPair::host_to_nvme),
                 rate(sch::TierPair::host_to_device), rate(sch::TierPair::device_to_host),
                 100.0 * f.stall_seconds / f.seconds, commit ? " | committed" : "");
    }
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  summary.last_step = total_steps;
  summary.last_loss = figures.back().loss;
  summary.tokens_per_s = static_cast<double>(tokens_per_step * figures.size()) / summary.seconds;
  sch::SchedulerStats stats = training_stats();
  summary.stall_seconds = static_cast<double>(stats.stall_ns) * 1e-9;
  summary.bytes_read_nvme = stats.transfers[static_cast<size_t>(sch::TierPair::nvme_to_host)].bytes;
  summary.bytes_written_nvme = stats.transfers[static_cast<size_t>(sch::TierPair::host_to_nvme)].bytes;
  summary.bytes_host_to_device = stats.transfers[static_cast<size_t>(sch::TierPair::host_to_device)].bytes;
  summary.bytes_device_to_host = stats.transfers[static_cast<size_t>(sch::TierPair::device_to_host)].bytes;
  summary.device_high_water_bytes = stats.device_high_water_bytes;
  summary.host_high_water_bytes = stats.host_high_water_bytes;
  summary.state_bytes = training_state_bytes(run_, layout_);
  summary.peak_rss_bytes = peak_rss_bytes();
  std::vector<double> step_seconds;
  for (const StepFigures& f : figures) {
    step_seconds.push_back(f.seconds);
    summary.compute_seconds += f.compute_seconds;
  }
  std::sort(step_seconds.begin(), step_seconds.end());
  const size_t middle = step_seconds.size() / 2;
  summary.median_step_seconds = step_seconds.size() % 2 == 1 ? step_seconds[middle]
                                                             : (step_seconds[middle - 1] + step_seconds[middle]) / 2;
  if (prediction) {
    summary.predicted_step_seconds = prediction->step_s;
    summary.predicted_compute_seconds = prediction->compute_s;
    summary.predicted_io_seconds = prediction->io_s;
  }
  if (best_eval_loss_) summary.best_eval_loss = *best_eval_loss_;
  if (timeline_ != nullptr) STRATA_RETURN_IF_ERROR(timeline_->write_json(options_.trace_path));
  if (!options_.metrics_path.empty()) STRATA_RETURN_IF_ERROR(write_metrics(figures, summary));
  scheduler_.reset();  // the store is the trainer's again
  backing_.reset();
  store_.reset();
  if (!options_.export_path.empty()) STRATA_RETURN_IF_ERROR(export_store_weights(store_dir_for(config_), options_.export_path,
                                                   options_.export_shard_size_bytes));
  return summary;
}

}  // namespace

nlohmann::ordered_json eval_json(const EvalFigures& e) {
  return {{"step", e.step},       {"eval_loss", e.loss},       {"perplexity", e.perplexity}, {"tokens", e.tokens},
          {"batches", e.batches}, {"seconds", e.seconds}, {"nvme_read_bytes", e.bytes_read_nvme}};
}

nlohmann::ordered_json summary_json(const TrainSummary& s) {
  nlohmann::ordered_json json = {{"first_step", s.first_step},
          {"last_step", s.last_step},
          {"first_loss", s.first_loss},
          {"last_loss", s.last_loss},
          {"seconds", s.seconds},
          {"tokens_per_s", s.tokens_per_s},
          {"stall_seconds", s.stall_seconds},
          {"nvme_read_bytes", s.bytes_read_nvme},
          {"nvme_write_bytes", s.bytes_written_nvme},
          {"host_to_device_bytes", s.bytes_host_to_device},
          {"device_to_host_bytes", s.bytes_device_to_host},
          {"device_high_water_bytes", s.device_high_water_bytes},
          {"host_high_water_bytes", s.host_high_water_bytes},
          {"state_bytes", s.state_bytes},
          {"peak_rss_bytes", s.peak_rss_bytes},
          {"compute_seconds", s.compute_seconds},
          {"median_step_seconds", s.median_step_seconds},
          {"predicted_step_seconds", s.predicted_step_seconds},
          {"predicted_compute_seconds", s.predicted_compute_seconds},
          {"predicted_io_seconds", s.predicted_io_seconds},
          {"rank", s.rank},
          {"ranks", s.ranks},
          {"comm_sent_bytes", s.comm_sent_bytes},
          {"comm_received_bytes", s.comm_received_bytes},
          {"comm_seconds", s.comm_seconds},
          {"comm_formula_bytes_per_step", s.comm_formula_bytes_per_step},
          {"blas_core", kernels::blas_core_advice().picked}};  // which GEMM kernels the figures came from
  if (!s.evaluations.empty()) {
    nlohmann::ordered_json evaluations = nlohmann::ordered_json::array();
    for (const EvalFigures& e : s.evaluations) evaluations.push_back(eval_json(e));
    json["evaluations"] = std::move(evaluations);
    json["last_eval_loss"] = s.evaluations.back().loss;
  }
  if (s.best_eval_loss) json["best_eval_loss"] = *s.best_eval_loss;
  return json;
}

Result<TrainSummary> train(const TrainConfig& config, const TrainOptions& options) {
  if (!options.use_mpi) {  // one process, no MPI at all; `{rank}` is 0
    STRATA_ASSIGN_OR_RETURN(TrainConfig single, config_for_rank(config, 0, 1));
    const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
    STRATA_RETURN_IF_ERROR(reslice_if_needed(*local, config, options.resume));  // after an N-rank run
    Run run(single, options);
    return run.execute();
  }
  // One rank of a ZeRO job (train/zero/zero.h, docs/parallel.md).
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> world,
                          comm::make_world_communicator(comm::CommOptions{true, config.parallel.timeout_s}));
  const int rank = world->rank();
  const int ranks = world->size();
  // Discrete ranks keep gradients and compute copies in device memory (train/zero/zero.h): CUDA
  // moves them between the GPUs over NCCL; emulated ranks over the world's MPI, which can read
  // the emulated region in NCCL's place because it is this process's memory.
  std::unique_ptr<comm::Communicator> gpus;
  comm::Communicator* device_comm = nullptr;
  if (ranks > 1 && !device::memory_is_host(config.device_kind)) {
    if (optimizer_site(config) == OptimizerSite::host)
      return make_error(ErrorKind::unsupported,
                        fmt::format("{}: key 'placement.optimizer': host updates on {} {} ranks are not wired to ZeRO "
                                    "in this build; use device or nvme",
                                    config.source_path, ranks, config.device_kind));
    if (config.device_kind == "cuda") {
      Result<std::unique_ptr<comm::Communicator>> nccl = comm::make_nccl_communicator(*world);
      if (!nccl.ok())
        return make_error(ErrorKind::unsupported,
                          fmt::format("{}: key 'device.kind': cuda on {} ranks needs NCCL between their GPUs: {}",
                                      config.source_path, ranks, nccl.error().message));
      gpus = std::move(nccl).value();
      device_comm = gpus.get();
    } else {
      device_comm = world.get();
    }
  }
  STRATA_ASSIGN_OR_RETURN(TrainConfig mine, config_for_rank(config, rank, ranks));
  STRATA_RETURN_IF_ERROR(reslice_if_needed(*world, config, options.resume));  // committed by another N
  TrainOptions rank_options = options;
  rank_options.export_path.clear();  // rank 0 writes it below, from every rank's store
  if (rank != 0) {
    rank_options.progress = false;
    rank_options.monitor = nullptr;
    if (!options.metrics_path.empty()) rank_options.metrics_path += fmt::format(".rank{}", rank);
    if (!options.trace_path.empty()) rank_options.trace_path += fmt::format(".rank{}", rank);
  }
  ZeroStep zero(*world, ModelLayout(mine.model), mine, config.batch_size, device_comm);
  Result<TrainSummary> summary = [&] {
    Run run(mine, rank_options, &zero);
    return run.execute();
  }();
  if (!summary.ok()) return summary;
  summary->rank = rank;
  summary->ranks = ranks;
  const comm::CommStats stats = world->stats();
  const comm::CommStats gpu_stats = gpus ? gpus->stats() : comm::CommStats{};
  summary->comm_sent_bytes = stats.sent_bytes + gpu_stats.sent_bytes;
  summary->comm_received_bytes = stats.received_bytes + gpu_stats.received_bytes;
  summary->comm_seconds = static_cast<double>(stats.wait_ns + gpu_stats.wait_ns) * 1e-9;
  summary->comm_formula_bytes_per_step =
      zero_formula_bytes(ModelLayout(mine.model).trainable_parameter_count(), mine.precision,
                         std::max<uint32_t>(config.parallel.zero_stage, 1), ranks, config.gradient_accumulation_steps)
          .total();
  STRATA_RETURN_IF_ERROR(world->barrier());  // every rank's final commit is in
  if (rank == 0 && !options.export_path.empty()) {
    std::vector<std::string> dirs;
    for (int r = 0; r < ranks; ++r) dirs.push_back(store_dir_for(config, r));
    STRATA_RETURN_IF_ERROR(export_store_weights(dirs, options.export_path));
  }
  STRATA_RETURN_IF_ERROR(world->barrier());
  return summary;
}


Result<EvalFigures> evaluate(const TrainConfig& config, const std::string& eval_path) {
  // One process reads one store; a ZeRO job's are one per rank (at stage 3 each holds a share of
  // P), which only the job's own ranks read together — its `eval:` does, at every stage.
  for (const std::string& path : config.nvme_paths)
    if (path.find("{rank}") != std::string::npos)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: key 'nvme.paths': '{}' names one store per ZeRO rank and `strata eval` reads "
                                    "one process's store; evaluate inside the job (eval:), or export the rank stores "
                                    "with `strata store export` to an HF folder",
                                    config.source_path, path));
  TrainOptions options;
  options.resume = true;  // opens the committed run with a resume's checks; evaluation writes nothing
  options.progress = false;
  Run run(config, options);
  return run.evaluate_committed(eval_path);
}

}  // namespace strata
