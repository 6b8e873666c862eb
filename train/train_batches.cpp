#include "train/train_batches.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "text/tokenizer.h"

namespace strata {

namespace {

Result<data::Examples> read_examples(const TrainConfig& config) {
  if (config.data_format == DataFormat::examples) return data::read_examples_file(config.data_path);
  data::ExampleOptions options;
  options.format = config.data_format == DataFormat::chat ? data::ExampleFormat::chat : data::ExampleFormat::completion;
  options.tokenizer_path = config.data_tokenizer;
  options.train_on_input = config.examples.train_on_input;
  options.skip_bad_lines = config.examples.skip_bad_lines;
  return data::read_jsonl_examples(config.data_path, options);
}

}  // namespace

Result<std::unique_ptr<TrainBatches>> TrainBatches::open(const TrainConfig& config, uint32_t global_rows,
                                                         uint32_t rank_rows, int rank) {
  std::unique_ptr<TrainBatches> batches(new TrainBatches());
  batches->global_rows_ = global_rows;
  batches->rank_rows_ = rank_rows;
  batches->rank_ = rank;
  batches->seq_len_ = config.model.seq_len;
  if (!is_example_format(config.data_format)) {
    STRATA_ASSIGN_OR_RETURN(TokenData stream, TokenData::open(config.data_path, config.data_format,
                                                              config.model.vocab_size, config.model.seq_len,
                                                              config.data_tokenizer));
    batches->stream_ = std::make_unique<TokenData>(std::move(stream));
    if (global_rows != rank_rows) {
      batches->global_tokens_.resize(uint64_t{global_rows} * config.model.seq_len);
      batches->global_targets_.resize(batches->global_tokens_.size());
    }
    return batches;
  }
  STRATA_ASSIGN_OR_RETURN(data::Examples examples, read_examples(config));
  if (examples.vocab_size > config.model.vocab_size)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data {}: its tokenizer has {} tokens but model.vocab_size is {}; the model needs at "
                                  "least {}",
                                  config.data_path, examples.vocab_size, config.model.vocab_size, examples.vocab_size));
  data::BatchOptions options;
  options.seq_len = config.model.seq_len;
  options.batch_rows = global_rows;
  options.packing = config.examples.packing;
  options.truncate = config.examples.truncate;
  options.seed = config.model.seed;
  // Padding's input id: any id the model knows does (its target is −1 and causal attention
  // keeps it out of every real token's context); the examples' EOS, as HF collators use.
  if (config.data_format != DataFormat::examples && !config.data_tokenizer.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::load_tokenizer(config.data_tokenizer));
    if (tok->eos_id()) options.pad_id = static_cast<int32_t>(*tok->eos_id());
  }
  STRATA_ASSIGN_OR_RETURN(data::Batches built, data::Batches::build(std::move(examples), options));
  batches->examples_ = std::make_unique<data::Batches>(std::move(built));
  const data::BatchStats& s = batches->examples_->stats();
  spdlog::info("data {}: {} examples → {} rows of {} tokens ({}), {} trained targets an epoch ({:.1f}% of the row "
               "tokens); skipped: {} with nothing to train, {} bad lines; {} truncated",
               config.data_path, s.examples, s.rows, config.model.seq_len, options.packing ? "packed" : "one a row",
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

}  // namespace strata
