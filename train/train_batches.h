// strata/train/train_batches.h — what the trainer feeds each step: the token stream
// (data/token_stream.h: text-bytes, tokens-u16/u32, text) or fine-tuning examples (data/examples.h:
// completion, chat, examples), behind one `fill`.
//
// Contract: `open` reads (and, for JSONL, tokenizes) everything at start-up and allocates every
// buffer; `fill` then writes step s's rows for this rank without allocating, as a pure function
// of (data, config, seed, s), so a resumed run reads exactly what an uninterrupted one would.
// Token streams keep TokenData's order bit for bit (targets are never −1 there); examples give
// targets −1 where the loss must not look, plus per-token positions and segment ids for
// StepBatch's packed attention (into the caller's arrays, so micro-batches filled ahead keep
// their own).
// Evaluation (`eval:`, train/trainer.h): the same formats, opened as Part::eval — eval.path, or
// the part eval.split holds out of data.path (examples: a seeded draw, data::split_examples; a
// token stream: its tail), while Part::train then leaves that part out. Held-out rows come in
// file order, every row once per evaluation: batch b's rows past the last are masked (targets
// −1), so the loss is over each held-out trained token exactly once.
// Threads: one thread calls fill at a time (the trainer's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "data/examples.h"
#include "data/token_stream.h"
#include "run/train_config.h"

namespace strata {

class TrainBatches {
 public:
  // `global_rows`: rows a step over every rank; `rank_rows`: this rank's share (its block of
  // the global batch starts at rank · rank_rows).
  enum class Part : uint8_t { train, eval };
  // `rank_rows`: this rank's share (its block of the global batch starts at rank · rank_rows).
  // Part::eval reads `eval_path` when given (`strata eval --data`), else the config's eval data.
  [[nodiscard]] static Result<std::unique_ptr<TrainBatches>> open(const TrainConfig& config, uint32_t global_rows,
                                                                  uint32_t rank_rows, int rank, Part part = Part::train,
                                                                  const std::string& eval_path = {});
  // Part::eval: the batches one evaluation reads — every held-out row once, at most eval.batches.
  uint64_t eval_batches() const { return eval_batches_; }
  // config.steps, or with config.epochs the updates (K micro-batches each) that show every row
  // that many times.
  uint64_t total_steps(const TrainConfig& config) const;
  // Batch `batch_index`'s rows of this rank (the step's index; with gradient accumulation the
  // micro-batch's, step · K + k) into rank_rows × seq_len values each. positions and segments
  // (StepBatch's packed-attention fields) are written for examples, where non-null; a token
  // stream leaves them alone (has_boundaries() is false: pass null to the backend).
  void fill(uint64_t batch_index, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr,
            int32_t* segments = nullptr);
  bool has_boundaries() const { return examples_ != nullptr; }
  // Null for a token stream.
  const data::BatchStats* example_stats() const { return examples_ ? &examples_->stats() : nullptr; }

 private:
  TrainBatches() = default;
  void fill_eval(uint64_t batch, int32_t* tokens, int32_t* targets, int32_t* positions, int32_t* segments);
  std::unique_ptr<TokenData> stream_;
  std::unique_ptr<data::Batches> examples_;
  uint32_t global_rows_ = 0;
  uint32_t rank_rows_ = 0;
  int rank_ = 0;
  uint32_t seq_len_ = 0;
  std::vector<int32_t> global_tokens_, global_targets_;  // a token stream over ranks: the whole batch first
  Part part_ = Part::train;
  uint64_t eval_rows_ = 0;     // Part::eval: held-out rows (windows of a token stream)
  uint64_t eval_batches_ = 0;
};

}  // namespace strata
