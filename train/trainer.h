// strata/train/trainer.h — `strata train`: fine-tunes a model (a definition: GPT-2 or Llama,
// models/model.h) whose training state lives across the device, pinned host memory and
// the NVMe store. Nothing here names a model: units, tensors and ops come from the definition.
//
// How a step runs. The model is cut into units (models/model_layout.h); each unit has a
// compute copy P (bf16 or fp32), a gradient G (fp32) and optimizer state O (fp32 master,
// first and second moment, packed), each homed on the tier the config's `placement` names.
// Activations are kept only at block inputs (A_i, host-homed) and every block is recomputed
// in backward. One iteration is an access plan handed to the prefetch scheduler:
//   fwd.embed, fwd.h.0 … fwd.h.{L-1}, head (loss and its gradient),
//   bwd.h.{L-1}, opt.h.{L-1}, … bwd.h.0, opt.h.0, bwd.embed, opt.embed, opt.ln_f
// so the reads of block i's optimizer state are in flight while block i+1's backward
// computes, and each update runs as soon as its gradients exist. With grad_clip > 0 the
// updates wait for the global gradient norm: every bwd step comes first (gradients parked on
// their tier), then every opt step. The scheduler prefetches by bytes within the budgets,
// evicts by Belady's rule and writes dirty state back to its home.
//
// Durability: the store is committed every `checkpoint_every` steps (and at the end) with
// the step counter in its metadata (run/run_store.h: what a store is, what a commit records,
// export); that commit is the checkpoint. `resume` continues from the last commit; the data
// order depends only on the step, so a resumed run is bit-identical to one that never stopped.
//
// Evaluation (`eval:`, docs/train.md "eval"): every `eval.every` updates (and after the last)
// the step commits, and the committed weights are measured on held-out rows (train_batches.h:
// eval.path or eval.split's share, every row once, the same masks): the training scheduler is
// closed, one over the forward-only plan (train_plan.h build_eval_plan: P and activations, no
// gradients, no optimizer state) reads P from the store within the same budgets, and the
// training scheduler comes back as after a resume. So an evaluation costs one read of P per
// held-out batch beyond what the pool keeps, plus a cold restart of read-ahead; it writes
// nothing to the store, and its time and bytes are kept apart from the steps'. With ZeRO each
// rank evaluates its rows of every held-out batch; at stage 3 the plan holds this rank's shares
// of P and each forward step gathers its units into the training run's gather buffers, as a
// training step does. The loss is the mean over every held-out trained token (over every rank
// with ZeRO); with `checkpoint.keep_best` (one rank) a new lowest eval loss exports the weights
// to <store>/best (an HF folder with best.json), swapped in whole. `strata eval` runs the same
// pass on the last commit (one process).
//
// Threads: one Trainer on one thread. Its compute fans out through TBB and OpenBLAS; the
// scheduler runs its own pump and I/O threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "run/train_config.h"
#include "train/progress.h"

namespace strata {


struct TrainOptions {
  int64_t steps = -1;          // < 0: the config's `steps` (a total, counting resumed ones)
  bool resume = false;         // continue from the store's last commit
  std::string trace_path;      // Chrome-trace timeline of copies, I/O, compute and stalls
  std::string metrics_path;    // JSON: per-step figures and the summary
  std::string export_path;     // the final fp32 weights: FILE.safetensors, or any other path an HF folder
  uint64_t export_shard_size_bytes = 5'000'000'000;  // an HF folder's shard limit (models/hf/hf.h)
  bool json = false;           // print the summary as one JSON object on stdout
  bool progress = true;        // one progress line per step on stderr
  bool use_mpi = false;        // comm::launched_by_mpirun(): one rank of a ZeRO job (docs/parallel.md)
  // Whoever watches the run (train/progress.h; the live metrics of apps/monitor are one): when
  // set, the run publishes its facts before the first step and one sample at the end of each
  // step. Must outlive the call to train().
  progress::StepObserver* monitor = nullptr;
};

// One evaluation of committed weights (see "Evaluation" above).
struct EvalFigures {
  uint64_t step = 0;           // the commit whose weights were measured
  double loss = 0.0;           // mean cross-entropy over every held-out trained token
  double perplexity = 0.0;     // exp(loss)
  uint64_t tokens = 0;         // trained tokens seen (over every rank)
  uint64_t batches = 0;
  double seconds = 0.0;
  uint64_t bytes_read_nvme = 0;
};
nlohmann::ordered_json eval_json(const EvalFigures& evaluation);

struct TrainSummary {
  uint64_t first_step = 0;
  uint64_t last_step = 0;       // steps completed in total (the committed step at the end)
  double first_loss = 0.0;
  double last_loss = 0.0;
  double seconds = 0.0;
  double tokens_per_s = 0.0;
  double stall_seconds = 0.0;
  uint64_t bytes_read_nvme = 0;
  uint64_t bytes_written_nvme = 0;
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
  uint64_t device_high_water_bytes = 0;
  uint64_t host_high_water_bytes = 0;
  uint64_t state_bytes = 0;      // the whole training state: compute copies, grads, optimizer
  uint64_t peak_rss_bytes = 0;   // the process's peak resident set (VmHWM)
  // What `strata plan` predicts for one step (run/step_model.h; 0 when the device budget
  // could not hold the kernels' timing) against what the steps took.
  double predicted_step_seconds = 0.0;
  double predicted_compute_seconds = 0.0;  // the kernels alone
  double predicted_io_seconds = 0.0;       // the I/O floor at the tuned bandwidths
  double median_step_seconds = 0.0;
  double compute_seconds = 0.0;            // time in the kernels, summed over the steps run
  // ZeRO (docs/parallel.md): this rank, the job's ranks, what this rank moved between ranks
  // over the steps run and the time it waited in collectives, against ZeRO's formula per step.
  int rank = 0;
  int ranks = 1;
  uint64_t comm_sent_bytes = 0;
  uint64_t comm_received_bytes = 0;
  double comm_seconds = 0.0;
  uint64_t comm_formula_bytes_per_step = 0;
  std::vector<EvalFigures> evaluations;  // eval: one per evaluation, in step order
  std::optional<double> best_eval_loss;  // checkpoint.keep_best: the lowest so far (a resume's too)
};

// The summary as the JSON object `--json` prints and `--metrics` embeds.
nlohmann::ordered_json summary_json(const TrainSummary& summary);

// Trains; returns the summary, or the first error (nothing committed is lost on error).
[[nodiscard]] Result<TrainSummary> train(const TrainConfig& config, const TrainOptions& options);

// `strata eval`: the held-out loss of the committed weights of config's store — eval_path (in
// data.format) when given, else the config's eval data. Reads the store, writes nothing.
[[nodiscard]] Result<EvalFigures> evaluate(const TrainConfig& config, const std::string& eval_path = {});

}  // namespace strata
