// strata/train/zero/zero.h — ZeRO data parallelism for `strata train` (issue 15): how the training
// state is split over the ranks of a job, and the collectives of one step.
//
// Partition. Whole optimizer chunks (optimizer.chunk_elements; one chunk per unit for small
// units) are owned by ranks: the flat list of every unit's chunks, in model order, is cut into
// N contiguous runs of near-equal elements (ZeRO's flat partition, at chunk granularity). Whole
// chunks rather than exact 1/N element ranges because a chunk is already the store's tensor,
// the I/O unit and the AdamW call: each rank's store holds whole tensors of its own, a resume on
// another N moves whole tensors between stores instead of cutting bytes, and nothing below the
// trainer learns about ranks. The price is balance at chunk granularity: lower chunk_elements
// to balance a small model over many ranks.
//
// Stages (parallel.zero_stage; N = 1 runs exactly the single-rank trainer, any stage):
//   1  optimizer state partitioned: each rank's plan and store hold only the chunks it owns; the
//      gradients are all-reduced (every rank keeps the averaged whole gradient); each owner
//      updates its chunks and broadcasts the new compute copy of their range to every rank.
//   2  + gradients reduced to their owner only (rank-ordered reduce per chunk = a reduce-scatter
//      over the owners): a rank never receives the gradient of a chunk it does not update.
//   3  + parameters partitioned: each rank's plan and store hold only its share of each unit's
//      compute copy (the elements of the chunks it owns: one contiguous range per unit, since
//      the partition is contiguous). Before a unit's forward, the head and each backward
//      recompute, the unit's whole compute copy is all-gathered (in place, allgatherv) into
//      one of two buffers allocated at start-up, the next unit's gather started before this
//      unit's compute; gradients as stage 2; owners update their share and nothing is
//      broadcast (the next step's gathers bring the new values).
// The global batch (`batch_size`) is split into N equal row blocks, rank r taking rows
// [r·B/N, (r+1)·B/N) of the batch the single-rank run would read; losses and gradients are
// averaged (sum in rank order, times 1/N). The gradient norm for clipping is the rank-ordered
// allreduce of each owner's sum of squares over its chunks. Every rank thus holds the same bits.
//
// CUDA ranks (device.kind: cuda, N > 1): the gradients and compute copies live on each rank's
// GPU, so their collectives go through a second, NCCL communicator (`device_comm`, one GPU per
// rank, comm/comm.h) on device pointers; the scalars (norm, loss) stay on MPI. The gradients are
// then left as SUMS (no host loop can touch them): the trainer adds each owned chunk's sum of
// squares on its stream (ComputeBackend::sum_squares), and `device_grad_scale` turns the global
// sum into AdamW's grad_scale = clip factor / N — the same update as averaging first. NCCL's own
// reduction order applies (not rank order): such runs are deterministic for a fixed N and
// topology, not bit-identical to MPI ranks. Not run in this repository's CI (no GPUs).
// Emulated ranks (device.kind: emulated) take the same device-tensor path with the world's MPI
// communicator as `device_comm` (their device region is the process's own memory), so ZeRO's
// discrete branches run on machines without a GPU.
//
// Threads: the Run's thread only (comm/ is MPI_THREAD_SERIALIZED). The CPU device's stream is
// synchronized before a collective reads or writes a step buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "common/dtype.h"
#include "common/status.h"
#include "models/model_layout.h"
#include "run/train_config.h"

namespace strata {

// owner[unit][chunk]: the rank that keeps and updates that optimizer chunk.
using ChunkOwners = std::vector<std::vector<int>>;
// The chunks are optim_chunks(unit, chunk_elements, state): cut where the state layout allows.
ChunkOwners optimizer_chunk_owners(const ModelLayout& layout, uint64_t chunk_elements, const optim::StateLayout& state,
                                   int ranks);

// The config one rank trains with: `{rank}` expanded in nvme.paths (each folder created), the
// batch its share of the global batch. Refuses, in one line naming the key: a batch that N does
// not divide; N > 1 ranks whose nvme.paths have no `{rank}` (their stores would collide).
[[nodiscard]] Result<TrainConfig> config_for_rank(const TrainConfig& config, int rank, int ranks);

// Bytes one rank sends (= receives, symmetric) per step by ZeRO's accounting for `stage` on N
// ranks, Ψ elements, p bytes per compute-copy element: stage 1 and 2 move the gradients once
// reduced ((N−1)/N·4Ψ; stage 1 also sends them back, as an allreduce) and the new compute copy
// once gathered ((N−1)/N·pΨ); stage 3 reduces the gradients as stage 2 and gathers the
// parameters twice, for the forward and for the backward (2·(N−1)/N·pΨ). 0 for one rank.
// A step is one update: with K micro-batches (gradient_accumulation_steps) the gradients are
// reduced and stages 1–2's new copy gathered once, but stage 3 gathers for every pass (2K·(N−1)/N·pΨ).
struct ZeroTraffic {
  uint64_t gradient_bytes = 0;
  uint64_t parameter_bytes = 0;
  uint64_t total() const { return gradient_bytes + parameter_bytes; }
};
ZeroTraffic zero_formula_bytes(uint64_t parameter_count, DType precision, uint32_t stage, int ranks,
                               uint32_t micro_batches = 1);

// The global commit (docs/parallel.md): each rank prepares its store's commit (data and the
// new manifest fsynced), all meet at a barrier, then each renames its manifest into place. So
// when any store holds step S every store has at least prepared S. Before a rank opens its store
// this finds the newest step any rank committed and rolls this store forward to it when it only
// prepared it; a store that has neither is an error naming it (not a silent divergence).
[[nodiscard]] Status reconcile_global_commit(comm::Communicator& comm, const std::string& store_dir);

// What `strata plan CONFIG --ranks N` adds: each rank's optimizer chunks and bytes, and the
// bytes each rank moves per step by ZeRO's formula — as text, and as the plan JSON's "zero".
std::string format_zero_plan(const TrainConfig& config, const ModelLayout& layout, int ranks);
nlohmann::ordered_json zero_plan_json(const TrainConfig& config, const ModelLayout& layout, int ranks);

// The collectives of one training step on one rank (see the top of this file).
class ZeroStep {
 public:
  // `device_comm`: NCCL between the ranks' GPUs for the gradients and compute copies (CUDA
  // ranks; see the top of this file); null: everything through `comm` on host memory.
  ZeroStep(comm::Communicator& comm, const ModelLayout& layout, const TrainConfig& config, uint32_t global_batch,
           comm::Communicator* device_comm = nullptr);

  int rank() const { return comm_.rank(); }
  int ranks() const { return comm_.size(); }
  bool active() const { return comm_.size() > 1; }
  bool owns(size_t unit, size_t chunk) const { return owners_[unit][chunk] == comm_.rank(); }
  int owner(size_t unit, size_t chunk) const { return owners_[unit][chunk]; }
  uint32_t global_batch() const { return global_batch_; }
  comm::Communicator& comm() { return comm_; }
  const ChunkOwners& owners() const { return owners_; }

  uint32_t stage() const { return stage_; }
  // Stage 3 on N > 1 ranks: P is partitioned and gathered per unit (TrainPlan::params_gathered).
  bool gathers_params() const { return stage_ >= 3 && active(); }
  // Stage 3: starts the in-place all-gather of `unit`'s whole compute copy into `unit_params`
  // (the unit's layout, p bytes per element), where this rank's share must already sit at its
  // range. `unit_params` stays untouched by the caller until wait() returns. On CUDA ranks
  // (device_tensors()) it is device memory gathered over NCCL, else host memory over MPI.
  [[nodiscard]] Result<comm::Request> gather_params_async(size_t unit, void* unit_params);
  [[nodiscard]] Status wait(comm::Request request) {
    return device_comm_ != nullptr ? device_comm_->wait(request) : comm_.wait(request);
  }

  void begin_step() { sum_squares_ = 0.0, clip_scale_known_ = false; }
  // Masked examples (data/examples.h) train a different number of tokens on each rank, so the
  // mean over every trained token is not the mean of the ranks' means. There each rank divides
  // its loss by the GLOBAL trained-token count (global_count) and the ranks' gradients and
  // losses are summed, not averaged: `sum_over_ranks` switches reduce_gradients,
  // device_grad_scale and mean_loss from ÷N to ÷1. Off (the token stream): as before, bit for bit.
  void set_sum_over_ranks(bool on) { sum_over_ranks_ = on; }
  // The sum of every rank's `local` (one allreduce; exact below 2^53).
  [[nodiscard]] Result<int64_t> global_count(int64_t local);
  // The unit's whole gradient (host memory, the unit's elements), local mean → global mean:
  // stage 1 everywhere, stage 2 at each chunk's owner. Adds the owned chunks' sums of squares.
  [[nodiscard]] Status reduce_gradients(size_t unit, float* grads);
  // torch's clip factor from the global norm: one allreduce, on the step's first update.
  [[nodiscard]] Result<float> clip_scale(double max_norm);
  // The chunk's new compute copy, from its owner to every rank (unit_params: the unit's P).
  [[nodiscard]] Status share_params(size_t unit, size_t chunk, void* unit_params);
  [[nodiscard]] Result<double> mean_loss(double local_loss);

  // CUDA ranks (device_comm set): gradients stay summed on the device.
  bool device_tensors() const { return device_comm_ != nullptr; }
  const std::vector<ElementRange>& chunks(size_t unit) const { return chunks_[unit]; }
  // AdamW's grad_scale for summed gradients: torch's clip factor of the averaged gradient's
  // global norm (1 without clipping, max_norm ≤ 0), over N. `local_sum_squares` (this rank's
  // owned chunks, of the sums) is called once per step, on the first update.
  [[nodiscard]] Result<float> device_grad_scale(double max_norm, const std::function<Result<double>()>& local_sum_squares);

 private:
  comm::Communicator& comm_;
  comm::Communicator* device_comm_ = nullptr;
  std::vector<uint64_t> unit_elements_;
  uint32_t stage_;
  uint32_t param_bytes_;
  uint32_t global_batch_;
  uint64_t chunk_elements_;
  optim::StateLayout state_;
  ChunkOwners owners_;
  std::vector<std::vector<ElementRange>> chunks_;  // [unit][chunk]
  // Stage 3, per unit: each rank's share of P as byte counts and displacements (allgatherv).
  std::vector<std::vector<uint64_t>> share_bytes_, share_offset_bytes_;
  double sum_squares_ = 0.0;
  bool sum_over_ranks_ = false;
  // What the summed gradients and losses are divided by: the ranks, or 1 (set_sum_over_ranks).
  int divisor() const { return sum_over_ranks_ ? 1 : comm_.size(); }
  float clip_scale_ = 1.0f;
  bool clip_scale_known_ = false;
};

}  // namespace strata
