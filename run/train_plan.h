// strata/run/train_plan.h — one training iteration as data: the tensors each unit owns and
// their homes, the ordered steps that read and write them, and what follows from those alone
// (the budget checks, the bytes of state). The trainer hands `plan` to the prefetch scheduler;
// `strata plan` reads the same object to predict a step before anything runs.
//
// Per unit (models/model_layout.h): P, the compute copy (bf16 or fp32); G, the fp32 gradient;
// O, the optimizer state in chunks (optimizer.chunk_elements), each chunk [master | m | v]. Homes
// come from the config's `placement`. `grads: device` means the gradients never leave the
// device: they are scratch the trainer owns, not plan tensors (so `UnitIds::grads` is
// kNoTensor), and each update runs straight after its backward — which is why it needs
// `grad_clip: 0`. Activations (`act.i`, block inputs) and the backward's running gradient
// (`grad.x`) are host-homed plan tensors.
//
// LoRA (`adapter:`): the base's units are frozen (UnitIds::frozen) and each block has an adapter
// unit. fwd.h.i and bwd.h.i also read the block's adapter P; bwd.h.i writes its adapter G; the
// head writes no gradient but grad.x; there is no bwd.embed; and each block's opt steps are its
// adapter unit's, where the block's would be.
//
// Steps, in order:
//   fwd.embed  fwd.h.0 … fwd.h.{L-1}  head  [opt.ln_f]  bwd.h.{L-1} [opt.h.{L-1}] … bwd.embed  opt.embed
// where each opt.X is one step per optimizer chunk (opt.X.c when X has several). Without
// clipping the bracketed updates follow their backward; with clipping every update waits
// for the global norm after bwd.embed.
//
// Gradient accumulation (`gradient_accumulation_steps: K` > 1): the forward/backward part
// repeats K times, one micro-batch each (steps named `<step>.mb<k>`), and the updates follow
// the last micro-batch's backward only — fused after it without clipping, after its bwd.embed
// with clipping — so O is read and written once per update. From micro-batch 1 on, the head
// and each backward also read G (the sum so far) before adding to it. K > 1 never interleaves.
// With `grads: device` G is no plan tensor but device scratch that then holds every unit's
// gradients side by side for the whole update (device_grads_offsets), not one block's.
//
// Interleaved updates (`interleaved_updates`): with clipping, the updates after bwd.embed are
// 16 B read and 14 B written per parameter with almost no compute to hide behind — where
// offloaded training stalled. So when the site is `device`, there is no ZeRO and
// `optimizer.interleave` is on (the default), one pass of the plan is instead
//   opt.embed fwd.embed  opt.h.0 fwd.h.0 … opt.h.{L-1} fwd.h.{L-1}  opt.ln_f head  bwd.h.{L-1} … bwd.embed
// and the updates in pass k are step k−1's: each unit's chunks run just before its forward
// needs the new weights, so their I/O overlaps the previous unit's forward. The gradients wait
// on their tier for one pass, and the clip coefficient is taken at the end of pass k−1
// (after bwd.embed) and kept on the stream into pass k (kernels/backend.h). A pass with no
// pending gradients (the first after a start, a resume or a commit) runs its opt steps without
// math; a pass after the last backward (the drain before a commit) runs only its opt steps —
// train/trainer.cpp. Every opt step then also reads P (it is loaded for the forward right
// after anyway), so an opt step that does no math writes back the bytes it loaded.
//
// Where each update runs (`OptimizerSite`, `optimizer_site`): on the device, by the device's
// backend, with the chunk [master | m | v] acquired on the device — every CPU run (the CPU
// backend IS the CPU: it updates the state in place) and CUDA with `placement.optimizer:
// device`. On the host — CUDA with `placement.optimizer: host` — the chunk is not part of the
// step at all (it never leaves host memory): the step holds G and P on the device, G's chunk
// goes device→host into pinned staging, a CPU backend's AdamW updates master/m/v where they
// live and writes the new P into staging, and that goes host→device into the step's P; the
// scheduler writes P back to its home as after any step. CUDA with `placement.optimizer: nvme`
// stays on the device for now: a host-site update needs the scheduler to stage a tensor
// NVMe→host for a step without copying it to the device, which it cannot say yet.
//
// Pure data built from the config; any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"
#include "models/model_layout.h"
#include "run/train_config.h"
#include "scheduler/scheduler.h"

namespace strata {

inline constexpr scheduler::TensorId kNoTensor = std::numeric_limits<scheduler::TensorId>::max();

enum class StepKind : uint8_t { fwd_embed, fwd_block, head, bwd_block, bwd_embed, optimize };

enum class OptimizerSite : uint8_t { device, host };
const char* optimizer_site_name(OptimizerSite site);  // "device", "host"

struct StepInfo {
  StepKind kind;
  size_t unit;       // the unit the step works on (for head: ln_f)
  size_t chunk = 0;  // optimize: which optimizer chunk
  OptimizerSite site = OptimizerSite::device;  // optimize: where the update runs
  uint32_t micro_batch = 0;  // forward, head, backward: which of the K micro-batches (optimize: 0)
};

struct OptimChunk {
  scheduler::TensorId tensor = kNoTensor;
  ElementRange range;  // of the unit's elements
};

struct UnitIds {
  // The compute copy this rank keeps: the whole unit, or at ZeRO stage 3 its share — the
  // elements of the chunks it owns (`params_range`; kNoTensor when it owns none of the unit).
  scheduler::TensorId params = kNoTensor;
  ElementRange params_range;
  scheduler::TensorId grads = kNoTensor;  // kNoTensor: `grads: device`, trainer scratch; a frozen unit's
  std::vector<OptimChunk> optim;          // empty for a frozen unit
  // LoRA's frozen base (models/model_layout.h): P alone, in adapter.base_dtype, read by the
  // forward and backward steps and never written — no G, no optimizer chunks, no update step.
  bool frozen = false;
};

struct TrainPlan {
  scheduler::AccessPlan plan;
  std::vector<UnitIds> units;
  std::vector<scheduler::TensorId> activations;  // A_0 … A_L (block inputs, and the head's input)
  scheduler::TensorId d_x = kNoTensor;           // the gradient flowing back through the blocks
  std::vector<StepInfo> steps;                   // parallel to plan.steps()
  OptimizerSite optimizer_site = OptimizerSite::device;  // every optimize step's
  // ZeRO stage 3 on N > 1 ranks: P is partitioned (UnitIds::params_range) and each forward,
  // head and backward step computes on the unit's whole compute copy all-gathered into one of
  // two start-up buffers (train/zero/zero.h). Each such step also reads the shares of the next
  // gathering step's units, so they are resident when that gather starts during this compute —
  // with K micro-batches, through all K passes (the last backward of one pass reads the
  // embeddings' share for the next pass's fwd.embed).
  bool params_gathered = false;
  // Step k's updates run in pass k+1, before each unit's forward (see the top of this file).
  bool interleaved_updates = false;
};

// Where the config's updates run (see the top of this file), and why, in a few words.
OptimizerSite optimizer_site(const TrainConfig& config);
std::string optimizer_site_reason(const TrainConfig& config);

// Whether updates interleave with the next pass's forward (the top of this file): clipping,
// the device site, one rank (`zero`: false) and optimizer.interleave.
bool interleaved_updates(const TrainConfig& config, bool zero);

// Store and plan tensor names.
std::string params_name(const Unit& unit);
std::string grads_name(const Unit& unit);
std::string optim_name(const Unit& unit, size_t chunk, size_t chunk_count);

// A stage-3 share of P: `params_name` when it is the whole unit, else
// "params.<unit>.<first chunk>-<last chunk>" (the optimizer chunks whose elements it holds).
std::string params_share_name(const Unit& unit, size_t first_chunk, size_t last_chunk, size_t chunk_count);

// `owners` (train/zero/zero.h, N > 1 ranks): only the optimizer chunks `rank` owns are plan (and
// store) tensors; the update step of any other chunk keeps P (the owner's broadcast rewrites
// it) and has that chunk's tensor as kNoTensor. Empty: every chunk, one rank. With
// parallel.zero_stage 3 and owners, P is this rank's share too (`params_gathered`).
TrainPlan build_train_plan(const TrainConfig& config, const ModelLayout& layout,
                           const std::vector<std::vector<int>>& owners = {}, int rank = 0);

// The evaluation pass (`eval:`, train/trainer.h): the forward steps alone —
//   fwd.embed  fwd.h.0 … fwd.h.{L-1}  head
// over each unit's P (the same store tensors and homes as training's) and the activations; no
// gradients, no optimizer state, so an evaluation reads P and writes nothing to the store. With
// `owners` at ZeRO stage 3 (as build_train_plan), P is this rank's share (`params_gathered`) and
// each step computes on the whole copy gathered from every rank's share, with the same
// lookahead as training: each step also reads the next step's shares. Every step's tensors are
// a subset of the training step of the same name (of the first micro-batch's, `<step>.mb0`, with
// accumulation), so budgets that fit training fit it.
TrainPlan build_eval_plan(const TrainConfig& config, const ModelLayout& layout,
                          const std::vector<std::vector<int>>& owners = {}, int rank = 0);

// Device memory the trainer holds outside the plan for the whole run.
struct DeviceScratchSizes {
  uint64_t workspace_bytes = 0;
  uint64_t weights_fp32_bytes = 0;  // bf16 compute copies widened for the kernels
  uint64_t block_grads_bytes = 0;   // grads: device — the block being updated
  uint64_t embed_grads_bytes = 0;   // grads: device — from the head to opt.embed
  uint64_t ln_f_grads_bytes = 0;    // grads: device — from the head to opt.ln_f
  uint64_t param_gather_bytes = 0;  // ZeRO stage 3: the two gather buffers (gather_buffer_bytes)
  uint64_t lora_scratch_bytes = 0;  // LoRA: the adapter op's scratch (kernels/lora/lora.h)
  uint64_t total() const;
};
// `run` (optional) adds stage 3's gather buffers when its P is partitioned.
DeviceScratchSizes device_scratch(const TrainConfig& config, const ModelLayout& layout, const TrainPlan* run = nullptr);

// grads: device — where each unit's gradients lie in the block-gradient scratch
// (DeviceScratchSizes::block_grads_bytes), in bytes from its start, one entry per unit (the
// embeddings and ln_f have buffers of their own, a frozen unit has no gradients: theirs are 0 and
// unused). K = 1: every unit at 0 — one at a time, each consumed by its update right after its
// backward. K > 1 (gradient_accumulation_steps): side by side, each trained unit's own, since
// they are summed over the K passes and the updates run only after the last — so the scratch
// is then the whole model's gradients (4 B per trained parameter), held on the device for the
// whole update, and check_budgets refuses a device.memory that cannot hold it.
std::vector<uint64_t> device_grads_offsets(const TrainConfig& config, const ModelLayout& layout);

// ZeRO stage 3: one gather buffer, the largest step's whole compute copies — the largest unit,
// or the head's ln_f and embeddings side by side (ln_f first, the embeddings at
// `gather_second_offset_bytes`). Two are allocated at start-up (double-buffered).
uint64_t gather_buffer_bytes(const TrainConfig& config, const ModelLayout& layout);
uint64_t gather_second_offset_bytes(const TrainConfig& config, const ModelLayout& layout);

// Pinned host memory the trainer holds outside the plan when updates run on the host: two
// slots (one being updated by the CPU while the next chunk's gradients arrive), each the
// largest chunk's gradients (fp32) and its new compute copy. 0 when they run on the device.
uint64_t host_optimizer_staging_bytes(const TrainConfig& config, const ModelLayout& layout, const TrainPlan& run);

// The budgets a run stages within and their checks: run/budgets.h (the one pool rule).

// The training state proper (compute copies, gradients, optimizer state; not activations),
// each tensor rounded up to `alignment_bytes`; gradients counted even when they are scratch.
uint64_t training_state_bytes(const TrainPlan& run, const ModelLayout& layout, uint64_t alignment_bytes = 1);

// What lives in the store: every P and O, and G when it is NVMe-homed.
bool is_store_tensor(const TrainPlan& run, scheduler::TensorId id);
// What a commit must make durable: P and O (gradients are rewritten before they are read).
bool is_persistent(const TrainPlan& run, scheduler::TensorId id);
// What the steps rewrite among those: all but a frozen base's P, which a commit leaves as the
// store has it.
bool is_rewritten(const TrainPlan& run, scheduler::TensorId id);
// The bytes of a unit's compute copy: precision's dtype, or a frozen base's
// (ModelLayout::frozen_params_bytes).
uint64_t params_size_bytes(const TrainConfig& config, const ModelLayout& layout, size_t unit);

}  // namespace strata
