// Fine-tuning examples (data/examples.h) with a real Hugging Face tokenizer folder
// (tests/data/bytes-tokenizer: byte-level BPE, id = byte, <s> 256, </s> 257, one merge a+b → 258,
// add_bos_token): the tokens and masks of completion and chat lines worked out by hand, rows
// with their shifted targets and padding, packing boundaries (positions restart, segments count,
// no target crosses an example), truncation and its refusal, the per-epoch shuffle (a
// permutation, seeded, different per epoch), resume (step s alone = step s after 0..s−1), a
// rank's block, bad lines (FILE:LINE and the fault; skipped and counted on request), and the
// tokenized file's round trip and its corruption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/examples.h"
#include "text/tokenizer.h"

namespace strata::data {
namespace {

constexpr uint32_t kBos = 256, kEos = 257, kAB = 258;

const tokenizer::Tokenizer& fixture_tokenizer() {
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    auto loaded = tokenizer::load_tokenizer(STRATA_DATA_FIXTURE);
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return std::move(*loaded);
  }();
  return *tok;
}

Result<Examples> parse(const std::string& text, ExampleOptions options = {}, const ChatRenderer* chat = nullptr) {
  return parse_jsonl_examples(text, "train.jsonl", fixture_tokenizer(), options, chat);
}

std::vector<uint32_t> ids_of(const Examples& examples, uint64_t k) {
  return {examples.tokens.begin() + static_cast<int64_t>(examples.offsets[k]),
          examples.tokens.begin() + static_cast<int64_t>(examples.offsets[k + 1])};
}
std::vector<uint8_t> mask_of(const Examples& examples, uint64_t k) {
  return {examples.trained.begin() + static_cast<int64_t>(examples.offsets[k]),
          examples.trained.begin() + static_cast<int64_t>(examples.offsets[k + 1])};
}

struct Batch {
  std::vector<int32_t> tokens, targets, positions, segments;
  explicit Batch(size_t size) : tokens(size), targets(size), positions(size), segments(size) {}
  bool operator==(const Batch&) const = default;
};

Batch fill(Batches& batches, uint64_t step, uint32_t first_row, uint32_t rows, uint32_t seq_len) {
  Batch batch(size_t{rows} * seq_len);
  batches.fill(step, first_row, rows, batch.tokens.data(), batch.targets.data(), batch.positions.data(),
               batch.segments.data());
  return batch;
}

TEST(Examples, CompletionFramesAndMasksEachPiece) {
  // "xa" + "by": the pieces are tokenized apart, so a|b does not merge across them; inside the
  // completion "ab" does. BOS (add_bos_token) untrained, completion and EOS trained.
  auto examples = parse(R"({"prompt": "xa", "completion": "bab"})" "\n");
  ASSERT_TRUE(examples.ok()) << examples.status().to_string();
  ASSERT_EQ(examples->count(), 1u);
  EXPECT_EQ(ids_of(*examples, 0), (std::vector<uint32_t>{kBos, 'x', 'a', 'b', kAB, kEos}));
  EXPECT_EQ(mask_of(*examples, 0), (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(examples->source_lines, (std::vector<uint64_t>{1}));

  ExampleOptions all;
  all.train_on_input = true;
  auto trained = parse(R"({"prompt": "xa", "completion": "bab"})", all);
  ASSERT_TRUE(trained.ok());
  EXPECT_EQ(mask_of(*trained, 0), (std::vector<uint8_t>{1, 1, 1, 1, 1, 1}));
}

class FakeChat final : public ChatRenderer {
 public:
  // "<|role|>content</s>" a message, trained for the assistant's: the fixture's own template.
  Result<std::vector<Piece>> render(const nlohmann::json& messages) const override {
    std::vector<Piece> pieces;
    for (const auto& m : messages)
      pieces.push_back({"<|" + m["role"].get<std::string>() + "|>" + m["content"].get<std::string>() + "</s>",
                        m["role"] == "assistant"});
    return pieces;
  }
};

TEST(Examples, ChatMasksFollowTheTemplateSegments) {
  FakeChat chat;
  ExampleOptions options;
  options.format = ExampleFormat::chat;
  auto examples = parse(R"({"system": "s", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "ab"}]})",
                        options, &chat);
  ASSERT_TRUE(examples.ok()) << examples.status().to_string();
  // No BOS/EOS of ours: the template writes them. "</s>" is the added token, matched in text.
  std::vector<uint32_t> want;
  std::vector<uint8_t> mask;
  auto add = [&](const std::string& text, bool trained) {
    for (unsigned char c : text) want.push_back(c), mask.push_back(trained);
    want.push_back(kEos), mask.push_back(trained);
  };
  add("<|system|>s", false);
  add("<|user|>u", false);
  want.insert(want.end(), {'<', '|', 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', '|', '>', kAB, kEos});
  mask.insert(mask.end(), 15, 1);
  EXPECT_EQ(ids_of(*examples, 0), want);
  EXPECT_EQ(mask_of(*examples, 0), mask);
}

TEST(Examples, BadLinesNameFileLineAndFault) {
  FakeChat chat;
  ExampleOptions chat_options;
  chat_options.format = ExampleFormat::chat;
  struct Case {
    std::string line;
    bool chat;
    std::string fault;
  };
  const std::vector<Case> cases = {
      {"{\"prompt\": \"a\"", false, "train.jsonl:2: not valid JSON"},
      {"[1, 2]", false, "train.jsonl:2: not a JSON object"},
      {R"({"prompt": "a"})", false, "train.jsonl:2: key 'completion' is missing"},
      {R"({"prompt": 3, "completion": "b"})", false, "train.jsonl:2: key 'prompt' is a number, not a string"},
      {R"({"prompt": "a", "completion": ""})", false, "train.jsonl:2: key 'completion' is empty"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", true,
       "train.jsonl:2: key 'messages[0].role' is 'robot'; roles are system, user, assistant, tool"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", true,
       "train.jsonl:2: the conversation has no assistant turn: nothing to train on"},
      {R"({"messages": [{"role": "assistant"}]})", true, "train.jsonl:2: key 'messages[0].content' is missing"},
      {R"({"messages": {}})", true, "train.jsonl:2: key 'messages' is an object, not an array"},
      {R"({"prompt": "a", "completion": "\u00ff\ud800"})", false, "train.jsonl:2:"},
  };
  for (const Case& c : cases) {
    const std::string good = c.chat ? R"({"messages": [{"role": "assistant", "content": "ok"}]})"
                                    : R"({"prompt": "a", "completion": "b"})";
    const std::string text = good + "\n" + c.line + "\n" + good + "\n";
    ExampleOptions options = c.chat ? chat_options : ExampleOptions{};
    auto refused = parse(text, options, &chat);
    ASSERT_FALSE(refused.ok()) << c.line;
    EXPECT_EQ(refused.status().error().message.rfind(c.fault, 0), 0u) << refused.status().error().message;
    EXPECT_EQ(refused.status().error().kind, ErrorKind::invalid_argument);
    options.skip_bad_lines = true;
    auto skipped = parse(text, options, &chat);
    ASSERT_TRUE(skipped.ok()) << c.line << ": " << skipped.status().to_string();
    EXPECT_EQ(skipped->count(), 2u);
    EXPECT_EQ(skipped->bad_lines_skipped, 1u);
    EXPECT_EQ(skipped->source_lines, (std::vector<uint64_t>{1, 3}));
  }
  auto none = parse("\n  \n");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().error().message, "train.jsonl: holds no example");
}

TEST(Examples, ChatNeedsATemplateInTheFolder) {
  const auto folder = std::filesystem::temp_directory_path() / "strata-data-no-template";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(std::string(STRATA_DATA_FIXTURE) + "/tokenizer.json", folder / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(folder / "tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>"})";
  auto renderer = load_chat_renderer(folder.string());
  ASSERT_FALSE(renderer.ok());
  EXPECT_NE(renderer.status().error().message.find("key 'chat_template' is missing"), std::string::npos)
      << renderer.status().error().message;
  std::filesystem::remove_all(folder);
}

// Examples of `count` tokens each: "p" prompt, a completion of count − 3 letters (BOS p ... EOS).
std::string completions(const std::vector<int>& sizes) {
  std::string text;
  for (int size : sizes) text += R"({"prompt": "p", "completion": ")" + std::string(size - 3, 'c') + "\"}\n";
  return text;
}

TEST(Batches, OneExampleARowShiftedAndPadded) {
  auto examples = parse(R"({"prompt": "xa", "completion": "by"})");
  ASSERT_TRUE(examples.ok());
  BatchOptions options;
  options.seq_len = 8;
  options.batch_rows = 1;
  options.pad_id = static_cast<int32_t>(kEos);
  auto batches = Batches::build(std::move(*examples), options);
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();
  Batch b = fill(*batches, 0, 0, 1, 8);
  // BOS x a b y EOS fills 5 positions; targets are the next token where it is trained.
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{256, 'x', 'a', 'b', 'y', 257, 257, 257}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{-1, -1, 'b', 'y', 257, -1, -1, -1}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(b.segments, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batches->stats().trained_tokens, 3u);
  EXPECT_EQ(batches->stats().rows, 1u);
}

TEST(Batches, PackingKeepsExamplesApart) {
  // 6, 5 and 7 tokens fill 5, 4 and 6 positions: with seq_len 10 the first two share a row
  // (9 positions), the third opens the next.
  auto examples = parse(completions({6, 5, 7}));
  ASSERT_TRUE(examples.ok());
  BatchOptions options;
  options.seq_len = 10;
  options.batch_rows = 2;
  options.packing = true;
  auto batches = Batches::build(std::move(*examples), options);
  ASSERT_TRUE(batches.ok()) << batches.status().to_string();
  ASSERT_EQ(batches->rows_per_epoch(), 2u);
  // Unshuffled view: find which row of the batch holds the pair.
  Batch b = fill(*batches, 0, 0, 2, 10);
  const bool pair_first = b.segments[5] == 1;
  const int32_t* pair = b.tokens.data() + (pair_first ? 0 : 10);
  const int32_t* pair_targets = b.targets.data() + (pair_first ? 0 : 10);
  const int32_t* pair_positions = b.positions.data() + (pair_first ? 0 : 10);
  const int32_t* pair_segments = b.segments.data() + (pair_first ? 0 : 10);
  const std::vector<int32_t> tokens(pair, pair + 10), targets(pair_targets, pair_targets + 10),
      positions(pair_positions, pair_positions + 10), segments(pair_segments, pair_segments + 10);
  EXPECT_EQ(tokens, (std::vector<int32_t>{256, 'p', 'c', 'c', 'c', 256, 'p', 'c', 'c', 0}));
  // The first example's last target is its own EOS, never the next example's BOS.
  EXPECT_EQ(targets, (std::vector<int32_t>{-1, 'c', 'c', 'c', 257, -1, 'c', 'c', 257, -1}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 0}));
  EXPECT_EQ(segments, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 2}));
  // Without packing: three rows.
  auto unpacked_examples = parse(completions({6, 5, 7}));
  options.packing = false;
  auto unpacked = Batches::build(std::move(*unpacked_examples), options);
  ASSERT_TRUE(unpacked.ok());
  EXPECT_EQ(unpacked->rows_per_epoch(), 3u);
}

TEST(Batches, TruncateOrRefuseLongExamples) {
  // 8 tokens fill 7 positions: seq_len 4 holds 5 tokens of it.
  auto examples = parse(completions({5, 8}));
  ASSERT_TRUE(examples.ok());
  BatchOptions options;
  options.seq_len = 4;
  options.batch_rows = 1;
  auto refused = Batches::build(*examples, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().error().message,
            "train.jsonl:2: the example has 8 tokens, more than seq_len + 1 = 5; set data.truncate: true to cut it");
  options.truncate = true;
  auto batches = Batches::build(*examples, options);
  ASSERT_TRUE(batches.ok());
  EXPECT_EQ(batches->stats().truncated, 1u);
  EXPECT_EQ(batches->stats().trained_tokens, 3u + 3u);  // c c EOS | c c c (the cut one loses its EOS)

  // A prompt longer than the row: nothing trained survives the cut, so the example is skipped
  // and counted, and a corpus of only such examples is refused, never a row without targets.
  auto long_prompt = parse(R"({"prompt": "pppppppp", "completion": "c"})" "\n" + completions({5}));
  ASSERT_TRUE(long_prompt.ok());
  auto skipped = Batches::build(*long_prompt, options);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(skipped->stats().skipped_untrained, 1u);
  EXPECT_EQ(skipped->rows_per_epoch(), 1u);
  auto only = parse(R"({"prompt": "pppppppp", "completion": "c"})");
  ASSERT_TRUE(only.ok());
  EXPECT_FALSE(Batches::build(*only, options).ok());
}

Result<Batches> ten_rows(uint64_t seed, uint32_t batch_rows) {
  auto examples = parse(completions({4, 5, 6, 7, 8, 4, 5, 6, 7, 8}));
  if (!examples.ok()) return examples.status().error();
  BatchOptions options;
  options.seq_len = 8;
  options.batch_rows = batch_rows;
  options.seed = seed;
  return Batches::build(std::move(*examples), options);
}

TEST(Batches, EpochsAreSeededPermutations) {
  auto a = ten_rows(7, 3);
  auto b = ten_rows(7, 3);
  auto other = ten_rows(8, 3);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  EXPECT_EQ(a->steps_for_epochs(1), 4u);   // ceil(10 / 3)
  EXPECT_EQ(a->steps_for_epochs(3), 10u);  // ceil(30 / 3)
  std::vector<uint64_t> orders[3];
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    for (uint64_t i = 0; i < 10; ++i) orders[epoch].push_back(a->row_at(epoch, i));
    std::set<uint64_t> rows(orders[epoch].begin(), orders[epoch].end());
    EXPECT_EQ(rows.size(), 10u);  // every row once an epoch
    EXPECT_EQ(*rows.rbegin(), 9u);
    std::vector<uint64_t> same, different;
    for (uint64_t i = 0; i < 10; ++i) same.push_back(b->row_at(epoch, i)), different.push_back(other->row_at(epoch, i));
    EXPECT_EQ(same, orders[epoch]);
    EXPECT_NE(different, orders[epoch]);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  std::vector<uint64_t> identity(10);
  for (uint64_t i = 0; i < 10; ++i) identity[i] = i;
  EXPECT_NE(orders[0], identity);
}

TEST(Batches, StepIsAPureFunctionOfItsIndex) {
  // An uninterrupted run's steps 0..9 (three epochs and a bit; step 3 straddles epochs 0 and 1)
  // against a resumed run that starts cold at each step, and against a run read backwards.
  auto run = ten_rows(11, 3);
  ASSERT_TRUE(run.ok());
  std::vector<Batch> steps;
  for (uint64_t step = 0; step < 10; ++step) steps.push_back(fill(*run, step, 0, 3, 8));
  for (uint64_t step = 0; step < 10; ++step) {
    auto resumed = ten_rows(11, 3);
    ASSERT_TRUE(resumed.ok());
    EXPECT_EQ(fill(*resumed, step, 0, 3, 8), steps[step]) << "step " << step;
  }
  auto backwards = ten_rows(11, 3);
  ASSERT_TRUE(backwards.ok());
  for (uint64_t step = 10; step-- > 0;) EXPECT_EQ(fill(*backwards, step, 0, 3, 8), steps[step]) << "step " << step;
  // Step 3 = global rows 9, 10, 11: the last of epoch 0, then the first two of epoch 1.
  Batch straddle = steps[3];
  Batch row9 = fill(*run, 0, 9, 1, 8);  // global row 9 read as step 0's tenth row
  EXPECT_TRUE(std::equal(row9.tokens.begin(), row9.tokens.end(), straddle.tokens.begin()));
  // A rank's block is the same rows as the whole batch's.
  Batch block = fill(*run, 5, 1, 2, 8);
  EXPECT_TRUE(std::equal(block.tokens.begin(), block.tokens.end(), steps[5].tokens.begin() + 8));
  EXPECT_TRUE(std::equal(block.targets.begin(), block.targets.end(), steps[5].targets.begin() + 8));
}

TEST(ExamplesFile, RoundTripAndCorruption) {
  auto examples = parse(completions({4, 9}) + R"({"prompt": "xa", "completion": "bab"})" "\n");
  ASSERT_TRUE(examples.ok());
  const std::string path = (std::filesystem::temp_directory_path() / "strata-data-examples.bin").string();
  for (uint32_t token_bytes : {2u, 4u}) {
    ASSERT_TRUE(write_examples(*examples, path, token_bytes).ok());
    EXPECT_EQ(std::filesystem::file_size(path), examples->tokens.size() * token_bytes);
    auto back = read_examples_file(path);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->tokens, examples->tokens);
    EXPECT_EQ(back->trained, examples->trained);
    EXPECT_EQ(back->offsets, examples->offsets);
    EXPECT_EQ(back->source_lines, examples->source_lines);
    EXPECT_EQ(back->vocab_size, 259u);
  }
  // A mask byte that is not 0/1, a truncated index, an id file of the wrong length.
  {
    std::fstream mask(path + ".mask", std::ios::in | std::ios::out | std::ios::binary);
    mask.seekp(2);
    mask.put(7);
  }
  auto bad_mask = read_examples_file(path);
  ASSERT_FALSE(bad_mask.ok());
  EXPECT_EQ(bad_mask.status().error().message, path + ".mask: byte 2 is 7; a mask byte is 0 or 1");
  ASSERT_TRUE(write_examples(*examples, path, 2).ok());
  std::filesystem::resize_file(path + ".examples", std::filesystem::file_size(path + ".examples") - 8);
  EXPECT_FALSE(read_examples_file(path).ok());
  ASSERT_TRUE(write_examples(*examples, path, 2).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 2);
  auto short_ids = read_examples_file(path);
  ASSERT_FALSE(short_ids.ok());
  EXPECT_NE(short_ids.status().error().message.find("but its index names 19 tokens"), std::string::npos)
      << short_ids.status().error().message;
  // An id past the vocabulary the index names (it would index past the embedding).
  ASSERT_TRUE(write_examples(*examples, path, 2).ok());
  {
    std::fstream ids(path, std::ios::in | std::ios::out | std::ios::binary);
    ids.seekp(6);
    const char big[2] = {static_cast<char>(0x03), static_cast<char>(0x01)};  // 0x0103 = 259
    ids.write(big, 2);
  }
  auto bad_id = read_examples_file(path);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_EQ(bad_id.status().error().message, path + ": token 259 at index 3 is outside the vocabulary of 259 its index names");
  for (const char* suffix : {"", ".mask", ".examples"}) std::filesystem::remove(path + suffix);
}

}  // namespace
}  // namespace strata::data
