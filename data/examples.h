// strata/data/examples.h — fine-tuning examples: token ids plus which of them the loss sees,
// and the fixed, seeded order in which they reach the trainer (docs/data.md).
//
// Two halves:
//  - Examples: read once at start-up from a JSONL file (`completion`: {"prompt","completion"};
//    `chat`: {"messages":[{"role","content"}...]}) or from the files `strata tokenize` writes
//    (ids + `.mask` + `.examples`, format below). Each text piece is tokenized on its own and the
//    pieces concatenated; `trained[i]` says whether the loss sees token i as a target.
//    Completion: [BOS if the tokenizer adds one] prompt completion [EOS]; trained: completion
//    and EOS (all of it with train_on_input). Chat: the segments of the tokenizer's chat template
//    (data/chat_template.h), no BOS/EOS of ours (the template writes them); trained: the
//    assistant turns the template marks.
//  - Batches: examples become rows of seq_len tokens (packed greedily in file order, or one a
//    row), rows are shuffled per epoch with the run's seed, and step s's batch is a pure
//    function of (examples, options, seed, s): a resumed run reads what an uninterrupted one
//    would. Within a row, an example of n tokens fills n − 1 positions: inputs are its tokens
//    0..n−2, targets its tokens 1..n−1, −1 where the target token is not trained; padding (on
//    the right) has target −1. positions restart at 0 for every example; segments number the
//    examples of a row from 0 (padding is one more segment), so attention never crosses them.
// Bad input is refused with one line naming FILE:LINE and what is wrong (ErrorKind
// invalid_argument; the CLI exits 2), or, with skip_bad_lines, counted and skipped.
// Thread-safety: Examples is const after reading; Batches::fill keeps one epoch's permutation
// (built at start-up size, refilled when the epoch changes), so one thread calls it at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::data {

enum class ExampleFormat : uint8_t { completion, chat };

struct ExampleOptions {
  ExampleFormat format = ExampleFormat::completion;
  std::string tokenizer_path;   // a Hugging Face folder (tokenizer.json + tokenizer_config.json)
  bool train_on_input = false;  // every token trained (prompt and user turns too)
  bool skip_bad_lines = false;  // count and skip a bad line instead of refusing the file
};

// A text piece and whether its tokens are trained (chat_template.h's TextSegment has this shape;
// the chat glue converts).
struct Piece {
  std::string text;
  bool trained = false;
};

// Every example of a corpus, flat: example k is tokens[offsets[k] .. offsets[k+1]).
struct Examples {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> trained;       // 1: the loss sees this token as a target
  std::vector<uint64_t> offsets{0};   // example count + 1 entries
  std::vector<uint64_t> source_lines; // the JSONL line each example came from (1-based)
  std::string source_path;
  uint64_t bad_lines_skipped = 0;     // skip_bad_lines: lines refused and left out
  uint32_t vocab_size = 0;            // of the tokenizer that made them

  uint64_t count() const { return offsets.size() - 1; }
  uint64_t size(uint64_t example) const { return offsets[example + 1] - offsets[example]; }
};

// One JSONL line's text pieces, in order: completion's prompt (untrained) and completion
// (trained); refuses missing keys and non-string values with a message naming the key.
[[nodiscard]] Result<std::vector<Piece>> completion_pieces(const nlohmann::json& line);
// Checks a chat line's shape ({"messages": [{"role": system|user|assistant|tool, "content":
// string}...]} with at least one assistant turn; a top-level "system" string becomes a leading
// system message) and returns the messages array the template renders.
[[nodiscard]] Result<nlohmann::json> chat_messages(const nlohmann::json& line);

// Renders one conversation's messages into pieces. The real one (load_chat_renderer) is the
// tokenizer folder's chat_template through data/chat_template.h; tests give their own.
class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  [[nodiscard]] virtual Result<std::vector<Piece>> render(const nlohmann::json& messages) const = 0;
};
// The tokenizer folder's chat template (tokenizer_config.json's chat_template; a folder without
// one is refused by name). The only glue to data/chat_template.h (data/chat.cpp).
[[nodiscard]] Result<std::unique_ptr<ChatRenderer>> load_chat_renderer(const std::string& tokenizer_folder);

// Reads a JSONL corpus and tokenizes it. The tokenizer folder must hold a chat_template for
// `chat` (refused by name otherwise).
[[nodiscard]] Result<Examples> read_jsonl_examples(const std::string& path, const ExampleOptions& options);
// The same from text already in memory (tests); `source_path` is what errors call it.
[[nodiscard]] Result<Examples> parse_jsonl_examples(std::string_view text, const std::string& source_path,
                                                    const tokenizer::Tokenizer& tok, const ExampleOptions& options,
                                                    const ChatRenderer* chat = nullptr);

// The tokenized form `strata tokenize --data-format completion|chat` writes and `data.format:
// examples` reads (docs/data.md): PATH holds the ids (little-endian u16 or u32, as tokens-u16/u32),
// PATH.mask one byte a token (1: trained), PATH.examples a header and the boundaries:
//   8 bytes "STRATAEX", u32 version (1), u32 token bytes (2|4), u64 example count K,
//   u32 vocab size, u32 zero, then K+1 u64 offsets (in tokens; the first 0, the last the id
//   count) and K u64 source lines — all little-endian.
[[nodiscard]] Status write_examples(const Examples& examples, const std::string& path, uint32_t token_bytes);
[[nodiscard]] Result<Examples> read_examples_file(const std::string& path);

// Holds out `fraction` of the examples (at least one, fewer than all): a seeded draw that depends
// only on (seed, example count), each part kept in file order — so a run and `strata eval` on
// the same file and seed hold out the same examples. Refuses a fraction that leaves either
// part empty, naming `what` (the config key).
struct ExampleSplit {
  Examples train;
  Examples held_out;
};
[[nodiscard]] Result<ExampleSplit> split_examples(Examples all, double fraction, uint64_t seed, const std::string& what);

struct BatchOptions {
  uint32_t seq_len = 0;        // tokens a row
  uint32_t batch_rows = 0;     // rows a step, over every rank (the global batch)
  bool packing = false;        // several examples a row, else one a row padded
  bool truncate = false;       // cut examples longer than seq_len + 1 tokens, else refuse them
  uint64_t seed = 1;           // the run's seed (model.seed): the per-epoch permutations
  int32_t pad_id = 0;          // the input id of padding (its target is always −1)
  bool shuffle = true;         // false: every epoch in file order (held-out evaluation)
};

// What start-up made of the examples, for the log and the metrics.
struct BatchStats {
  uint64_t examples = 0;         // read
  uint64_t examples_used = 0;    // in some row
  uint64_t skipped_untrained = 0;  // no trained target left (after truncation): never in a row
  uint64_t truncated = 0;
  uint64_t bad_lines_skipped = 0;
  uint64_t rows = 0;             // rows an epoch
  uint64_t trained_tokens = 0;   // targets the loss sees, an epoch
  uint64_t row_tokens = 0;       // rows × seq_len
};

class Batches {
 public:
  [[nodiscard]] static Result<Batches> build(Examples examples, const BatchOptions& options);

  uint64_t rows_per_epoch() const { return row_begin_.size() - 1; }
  const BatchStats& stats() const { return stats_; }
  // Steps that show every row `epochs` times: ceil(rows_per_epoch · epochs / batch_rows). The
  // last step's rows past the final epoch come from the next epoch's permutation (every step
  // is a full batch).
  uint64_t steps_for_epochs(uint64_t epochs) const;

  // Rows [first_row, first_row + row_count) of step `step`'s batch (a rank's block; the whole
  // batch is first_row 0, row_count batch_rows). Each array holds row_count × seq_len values,
  // row-major; positions and segments may be null (a backend without packed attention).
  // Global row g = step · batch_rows + r is row perm_e[g mod R] of epoch e = g div R.
  void fill(uint64_t step, uint32_t first_row, uint32_t row_count, int32_t* tokens, int32_t* targets,
            int32_t* positions, int32_t* segments);
  // The row of the epoch's permutation (for tests: the shuffle itself).
  uint64_t row_at(uint64_t epoch, uint64_t index);

 private:
  Batches() = default;
  void permute(uint64_t epoch);
  void fill_row(uint64_t row, int32_t* tokens, int32_t* targets, int32_t* positions, int32_t* segments) const;

  Examples examples_;
  BatchOptions options_;
  BatchStats stats_;
  std::vector<uint64_t> used_;       // the examples that train, in file order, with their lengths
  std::vector<uint32_t> used_size_;  // tokens each keeps (truncation applied)
  std::vector<uint64_t> row_begin_;  // row r holds used_[row_begin_[r] .. row_begin_[r+1])
  std::vector<uint64_t> permutation_;
  uint64_t permutation_epoch_ = UINT64_MAX;
};

}  // namespace strata::data
