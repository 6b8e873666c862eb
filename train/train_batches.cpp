#include "train/train_batches.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "text/tokenizer.h"

namespace strata {

namespace {

Result<data::Examples> read_examples(const TrainConfig& config, const std::string& path) {
  if (config.data_format == DataFormat::examples) return data::read_examples_file(path);
  data::ExampleOptions options;
  options.format = config.data_format == DataFormat::chat ? data::ExampleFormat::chat : data::ExampleFormat::completion;
  options.tokenizer_path = config.data_tokenizer;
  options.train_on_input = config.examples.train_on_input;
  options.skip_bad_lines = config.examples.skip_bad_lines;
  return data::read_jsonl_examples(path, options);
}

// The held-out tokens of a stream of `count` tokens (eval.split): its tail.
uint64_t held_out_tokens(uint64_t count, double split) {
  return static_cast<uint64_t>(static_cast<double>(count) * split);
}

}  // namespace

Result<std::unique_ptr<TrainBatches>> TrainBatches::open(const TrainConfig& config, uint32_t global_rows,
                                                         uint32_t rank_rows, int rank, Part part,
                                                         const std::string& eval_path) {
  std::unique_ptr<TrainBatches> batches(new TrainBatches());
  batches->global_rows_ = global_rows;
  batches->rank_rows_ = rank_rows;
  batches->rank_ = rank;
  batches->seq_len_ = config.model.seq_len;
  batches->part_ = part;
  const bool eval = part == Part::eval;
  const double split = eval_path.empty() ? config.eval.split : 0.0;  // --data replaces the split
  const std::string path = !eval ? config.data_path : !eval_path.empty() ? eval_path
                                                    : split > 0      ? config.data_path
                                                                     : config.eval.path;
  // Evaluation: every held-out row once, in batches of the global batch's rows.
  auto count_eval_batches = [&](uint64_t rows) {
    batches->eval_rows_ = rows;
    batches->eval_batches_ = (rows + global_rows - 1) / global_rows;
    if (config.eval.batches > 0) batches->eval_batches_ = std::min(batches->eval_batches_, config.eval.batches);
  };
  if (!is_example_format(config.data_format)) {
    STRATA_ASSIGN_OR_RETURN(TokenData stream, TokenData::open(path, config.data_format, config.model.vocab_size,
                                                              config.model.seq_len, config.data_tokenizer));
    if (split > 0) {
      const uint64_t held = held_out_tokens(stream.token_count(), split);
      const std::string what = fmt::format("{}: key 'eval.split': {} of {} ({} tokens)", config.source_path, split,
                                           path, stream.token_count());
      STRATA_RETURN_IF_ERROR(eval ? stream.keep_range(stream.token_count() - held, held, what)
                                  : stream.keep_range(0, stream.token_count() - held, what));
    }
    batches->stream_ = std::make_unique<TokenData>(std::move(stream));
    if (eval) {
      // Windows of seq_len inputs and their next tokens, side by side: (N − 1) / T of them.
      count_eval_batches((batches->stream_->token_count() - 1) / config.model.seq_len);
      spdlog::info("eval data {}: {} windows of {} tokens, {} batches an evaluation", path, batches->eval_rows_,
                   config.model.seq_len, batches->eval_batches_);
    }
    if (global_rows != rank_rows) {
      batches->global_tokens_.resize(uint64_t{global_rows} * config.model.seq_len);
      batches->global_targets_.resize(batches->global_tokens_.size());
    }
    return batches;
  }
  STRATA_ASSIGN_OR_RETURN(data::Examples examples, read_examples(config, path));
  if (examples.vocab_size > config.model.vocab_size)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data {}: its tokenizer has {} tokens but model.vocab_size is {}; the model needs at "
                                  "least {}",
                                  path, examples.vocab_size, config.model.vocab_size, examples.vocab_size));
  if (split > 0) {
    STRATA_ASSIGN_OR_RETURN(data::ExampleSplit parts,
                            data::split_examples(std::move(examples), split, config.model.seed,
                                                 config.source_path + ": key 'eval.split'"));
    examples = std::move(eval ? parts.held_out : parts.train);
  }
  data::BatchOptions options;
  options.seq_len = config.model.seq_len;
  options.batch_rows = global_rows;
  options.packing = config.examples.packing;
  options.truncate = config.examples.truncate;
  options.seed = config.model.seed;
  options.shuffle = !eval;  // held-out rows in file order: every evaluation sees the same batches
  // Padding's input id: any id the model knows does (its target is −1 and causal attention
  // keeps it out of every real token's context); the examples' EOS, as HF collators use.
  if (config.data_format != DataFormat::examples && !config.data_tokenizer.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::load_tokenizer(config.data_tokenizer));
    if (tok->eos_id()) options.pad_id = static_cast<int32_t>(*tok->eos_id());
  }
  STRATA_ASSIGN_OR_RETURN(data::Batches built, data::Batches::build(std::move(examples), options));
  batches->examples_ = std::make_unique<data::Batches>(std::move(built));
  const data::BatchStats& s = batches->examples_->stats();
  if (eval) count_eval_batches(s.rows);
  spdlog::info("{} {}: {} examples → {} rows of {} tokens ({}), {} trained targets an epoch ({:.1f}% of the row "
               "tokens); skipped: {} with nothing to train, {} bad lines; {} truncated",
               eval ? "eval data" : "data", path, s.examples, s.rows, config.model.seq_len, options.packing ? "packed" : "one a row",
               s.trained_tokens, 100.0 * static_cast<double>(s.trained_tokens) / static_cast<double>(s.row_tokens),
               s.skipped_untrained, s.bad_lines_skipped, s.truncated);
  return batches;
}

uint64_t TrainBatches::total_steps(const TrainConfig& config) const {
  // Batches of B rows for E epochs, then K of them an update: ceil(ceil(a / B) / K) is
  // ceil(a / (B·K)), so the last update may hold fewer than K batches' worth of new rows
  // (the order wraps into the next epoch, as a short last batch does).
  if (examples_ && config.epochs > 0) {
    const uint64_t k = config.gradient_accumulation_steps;
    return (examples_->steps_for_epochs(config.epochs) + k - 1) / k;
  }
  return config.steps;
}

void TrainBatches::fill(uint64_t batch_index, int32_t* tokens, int32_t* targets, int32_t* positions,
                        int32_t* segments) {
  const uint64_t step = batch_index;
  if (part_ == Part::eval) {
    fill_eval(batch_index, tokens, targets, positions, segments);
    return;
  }
  if (examples_) {
    examples_->fill(step, static_cast<uint32_t>(rank_) * rank_rows_, rank_rows_, tokens, targets, positions, segments);
    return;
  }
  if (global_rows_ == rank_rows_) {
    stream_->fill_batch(step, rank_rows_, tokens, targets);
    return;
  }
  // The batch a single rank would read; this rank trains on its block of rows.
  stream_->fill_batch(step, global_rows_, global_tokens_.data(), global_targets_.data());
  const uint64_t count = uint64_t{rank_rows_} * seq_len_;
  const uint64_t first = count * static_cast<uint64_t>(rank_);
  std::copy_n(global_tokens_.begin() + static_cast<int64_t>(first), count, tokens);
  std::copy_n(global_targets_.begin() + static_cast<int64_t>(first), count, targets);
}

// Held-out batch b: global row g = b · global_rows + rank · rank_rows + r is held-out row g, or,
// past the last one, a row that trains nothing (its targets −1: the head adds exactly 0 for it).
void TrainBatches::fill_eval(uint64_t batch, int32_t* tokens, int32_t* targets, int32_t* positions,
                             int32_t* segments) {
  const uint64_t first = batch * global_rows_ + static_cast<uint64_t>(rank_) * rank_rows_;
  if (examples_) examples_->fill(batch, static_cast<uint32_t>(rank_) * rank_rows_, rank_rows_, tokens, targets,
                                 positions, segments);
  for (uint32_t r = 0; r < rank_rows_; ++r) {
    const uint64_t row = first + r;
    int32_t* row_tokens = tokens + TokenData::row_offset(r, seq_len_);
    int32_t* row_targets = targets + TokenData::row_offset(r, seq_len_);
    if (row >= eval_rows_) {
      std::fill_n(row_targets, seq_len_, -1);
      if (!examples_) std::fill_n(row_tokens, seq_len_, 0);
      continue;
    }
    if (examples_) continue;
    for (uint32_t t = 0; t < seq_len_; ++t) {
      row_tokens[t] = static_cast<int32_t>(stream_->token(row * seq_len_ + t));
      row_targets[t] = static_cast<int32_t>(stream_->token(row * seq_len_ + t + 1));
    }
  }
}

}  // namespace strata
