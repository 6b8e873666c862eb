#include "data/examples.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "common/mix.h"
#include "text/tokenizer.h"

namespace strata::data {

namespace {

Error bad(const std::string& where, const std::string& what) {
  return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", where, what));
}

std::string describe(const nlohmann::json& value) {
  const std::string name = value.type_name();
  return (name == "object" || name == "array" ? "an " : "a ") + name;
}

}  // namespace

Result<std::vector<Piece>> completion_pieces(const nlohmann::json& line) {
  std::vector<Piece> pieces;
  for (const char* key : {"prompt", "completion"}) {
    auto field = line.find(key);
    if (field == line.end())
      return make_error(ErrorKind::invalid_argument, fmt::format("key '{}' is missing", key));
    if (!field->is_string())
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("key '{}' is {}, not a string", key, describe(*field)));
    pieces.push_back({field->get<std::string>(), std::string_view(key) == "completion"});
  }
  if (pieces[1].text.empty()) return make_error(ErrorKind::invalid_argument, "key 'completion' is empty");
  return pieces;
}

Result<nlohmann::json> chat_messages(const nlohmann::json& line) {
  auto messages = line.find("messages");
  if (messages == line.end()) return make_error(ErrorKind::invalid_argument, "key 'messages' is missing");
  if (!messages->is_array())
    return make_error(ErrorKind::invalid_argument, fmt::format("key 'messages' is {}, not an array", describe(*messages)));
  nlohmann::json out = nlohmann::json::array();
  if (auto system = line.find("system"); system != line.end()) {
    if (!system->is_string())
      return make_error(ErrorKind::invalid_argument, fmt::format("key 'system' is {}, not a string", describe(*system)));
    out.push_back({{"role", "system"}, {"content", *system}});
  }
  bool assistant = false;
  for (size_t index = 0; index < messages->size(); ++index) {
    const nlohmann::json& message = (*messages)[index];
    const std::string key = fmt::format("messages[{}]", index);
    if (!message.is_object())
      return make_error(ErrorKind::invalid_argument, fmt::format("key '{}' is {}, not an object", key, describe(message)));
    auto role = message.find("role");
    if (role == message.end() || !role->is_string())
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("key '{}.role' is {}", key, role == message.end() ? "missing" : describe(*role) + ", not a string"));
    const std::string name = role->get<std::string>();
    if (name != "system" && name != "user" && name != "assistant" && name != "tool" && name != "ipython" &&
        name != "developer" && name != "function")
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("key '{}.role' is '{}'; roles are system, user, assistant, tool, ipython, developer, function", key, name));
    auto content = message.find("content");
    if (content == message.end() || !content->is_string())
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("key '{}.content' is {}", key,
                                    content == message.end() ? "missing" : describe(*content) + ", not a string"));
    assistant = assistant || name == "assistant";
    out.push_back(message);
  }
  if (!assistant)
    return make_error(ErrorKind::invalid_argument, "the conversation has no assistant turn: nothing to train on");
  return out;
}

Result<Examples> parse_jsonl_examples(std::string_view text, const std::string& source_path,
                                      const tokenizer::Tokenizer& tok, const ExampleOptions& options,
                                      const ChatRenderer* chat) {
  if (options.format == ExampleFormat::chat && chat == nullptr)
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: format chat needs a chat template", source_path));
  Examples examples;
  examples.source_path = source_path;
  examples.vocab_size = tok.vocab_size();
  std::vector<uint32_t> piece_ids;
  size_t at = 0;
  uint64_t line_number = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines: nothing
    const std::string where = fmt::format("{}:{}", source_path, line_number);
    // Everything wrong with one line lands here: refused, or counted and skipped.
    auto reject = [&](const std::string& what) -> Status {
      if (options.skip_bad_lines) {
        ++examples.bad_lines_skipped;
        return Status();
      }
      return bad(where, what);
    };
    nlohmann::json object = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded() || !object.is_object()) {
      STRATA_RETURN_IF_ERROR(reject(object.is_discarded() ? "not valid JSON" : "not a JSON object"));
      continue;
    }
    Result<std::vector<Piece>> pieces = make_error(ErrorKind::internal, "unset");
    if (options.format == ExampleFormat::completion) {
      pieces = completion_pieces(object);
    } else {
      Result<nlohmann::json> messages = chat_messages(object);
      pieces = messages.ok() ? chat->render(*messages) : Result<std::vector<Piece>>(messages.status().error());
    }
    if (!pieces.ok()) {
      STRATA_RETURN_IF_ERROR(reject(pieces.status().error().message));
      continue;
    }
    // Each piece tokenized on its own, so no token straddles a trained and an untrained piece.
    const size_t first = examples.tokens.size();
    bool encoded = true;
    auto append = [&](uint32_t id, bool trained) {
      examples.tokens.push_back(id);
      examples.trained.push_back(trained || options.train_on_input ? 1 : 0);
    };
    if (options.format == ExampleFormat::completion && tok.add_bos() && tok.bos_id()) append(*tok.bos_id(), false);
    for (const Piece& piece : *pieces) {
      piece_ids.clear();
      if (Status status = tok.encode_into(piece.text, piece_ids); !status.ok()) {
        examples.tokens.resize(first);
        examples.trained.resize(first);
        STRATA_RETURN_IF_ERROR(reject(status.error().message));
        encoded = false;
        break;
      }
      for (uint32_t id : piece_ids) append(id, piece.trained);
    }
    if (!encoded) continue;
    // EOS ends a completion and is trained with it: the model learns where to stop.
    if (options.format == ExampleFormat::completion && tok.eos_id()) append(*tok.eos_id(), true);
    if (examples.tokens.size() - first < 2) {
      examples.tokens.resize(first);
      examples.trained.resize(first);
      STRATA_RETURN_IF_ERROR(reject("the example has fewer than 2 tokens: nothing to predict"));
      continue;
    }
    examples.offsets.push_back(examples.tokens.size());
    examples.source_lines.push_back(line_number);
  }
  if (examples.count() == 0)
    return bad(source_path, examples.bad_lines_skipped > 0
                                ? fmt::format("no example left: all {} non-blank lines were bad", examples.bad_lines_skipped)
                                : std::string("holds no example"));
  return examples;
}

Result<Examples> read_jsonl_examples(const std::string& path, const ExampleOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::load_tokenizer(options.tokenizer_path));
  std::unique_ptr<ChatRenderer> chat;
  if (options.format == ExampleFormat::chat) {
    STRATA_ASSIGN_OR_RETURN(chat, load_chat_renderer(options.tokenizer_path));
  }
  std::ifstream input(path, std::ios::binary);
  if (!input) return make_errno_error(errno, "open data", path);
  std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
  if (input.bad()) return make_errno_error(errno, "read data", path);
  return parse_jsonl_examples(text, path, *tok, options, chat.get());
}

// --- the tokenized form ------------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'E', 'X'};
constexpr uint32_t kVersion = 1;

// Writes PATH.tmp and renames it into place once complete (never a half-written file under
// the final name); the destructor removes an uncommitted one.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {}
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (file_ != nullptr) {
      std::fclose(file_);
      std::remove(tmp_path_.c_str());
    }
  }
  Status open() {
    file_ = std::fopen(tmp_path_.c_str(), "wb");
    return file_ == nullptr ? Status(make_errno_error(errno, "create", tmp_path_)) : Status();
  }
  Status write(const void* bytes, size_t size_bytes) {
    if (size_bytes > 0 && std::fwrite(bytes, 1, size_bytes, file_) != size_bytes)
      return make_errno_error(errno, "write", tmp_path_);
    return Status();
  }
  Status commit() {
    if (std::fflush(file_) != 0) return make_errno_error(errno, "write", tmp_path_);
    if (std::fclose(std::exchange(file_, nullptr)) != 0) return make_errno_error(errno, "close", tmp_path_);
    if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) return make_errno_error(errno, "rename", path_);
    return Status();
  }

 private:
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
};

Result<std::string> read_whole(const std::string& path) {
  std::ifstream input(path, std::ios::binary);
  if (!input) return make_errno_error(errno, "open", path);
  std::string bytes((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
  if (input.bad()) return make_errno_error(errno, "read", path);
  return bytes;
}

template <typename T>
T load_le(const std::string& bytes, size_t at) {
  T value{};
  std::memcpy(&value, bytes.data() + at, sizeof(T));  // little-endian host (x86-64)
  return value;
}

}  // namespace

Status write_examples(const Examples& examples, const std::string& path, uint32_t token_bytes) {
  if (token_bytes != 2 && token_bytes != 4)
    return make_error(ErrorKind::invalid_argument, fmt::format("token bytes {} (2 or 4)", token_bytes));
  AtomicFile ids(path), mask(path + ".mask"), index(path + ".examples");
  STRATA_RETURN_IF_ERROR(ids.open());
  STRATA_RETURN_IF_ERROR(mask.open());
  STRATA_RETURN_IF_ERROR(index.open());
  std::vector<char> buffer(examples.tokens.size() * token_bytes);
  for (size_t i = 0; i < examples.tokens.size(); ++i) {
    if (token_bytes == 2) {
      if (examples.tokens[i] > UINT16_MAX)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("token id {} does not fit 16 bits; use tokens-u32", examples.tokens[i]));
      auto value = static_cast<uint16_t>(examples.tokens[i]);
      std::memcpy(buffer.data() + 2 * i, &value, 2);
    } else {
      std::memcpy(buffer.data() + 4 * i, &examples.tokens[i], 4);
    }
  }
  STRATA_RETURN_IF_ERROR(ids.write(buffer.data(), buffer.size()));
  STRATA_RETURN_IF_ERROR(mask.write(examples.trained.data(), examples.trained.size()));
  const uint64_t count = examples.count();
  const uint32_t zero = 0;
  STRATA_RETURN_IF_ERROR(index.write(kMagic, sizeof kMagic));
  STRATA_RETURN_IF_ERROR(index.write(&kVersion, 4));
  STRATA_RETURN_IF_ERROR(index.write(&token_bytes, 4));
  STRATA_RETURN_IF_ERROR(index.write(&count, 8));
  STRATA_RETURN_IF_ERROR(index.write(&examples.vocab_size, 4));
  STRATA_RETURN_IF_ERROR(index.write(&zero, 4));
  STRATA_RETURN_IF_ERROR(index.write(examples.offsets.data(), examples.offsets.size() * 8));
  STRATA_RETURN_IF_ERROR(index.write(examples.source_lines.data(), examples.source_lines.size() * 8));
  // The index goes last: a reader that finds it finds the ids and masks it describes.
  STRATA_RETURN_IF_ERROR(ids.commit());
  STRATA_RETURN_IF_ERROR(mask.commit());
  return index.commit();
}

Result<Examples> read_examples_file(const std::string& path) {
  const std::string index_path = path + ".examples";
  STRATA_ASSIGN_OR_RETURN(std::string index, read_whole(index_path));
  constexpr size_t kHeaderBytes = 32;
  if (index.size() < kHeaderBytes || std::memcmp(index.data(), kMagic, sizeof kMagic) != 0)
    return bad(index_path, "not a strata examples index (no STRATAEX header; write it with strata tokenize --data-format)");
  const auto version = load_le<uint32_t>(index, 8);
  const auto token_bytes = load_le<uint32_t>(index, 12);
  const auto count = load_le<uint64_t>(index, 16);
  if (version != kVersion) return bad(index_path, fmt::format("version {}, this build reads {}", version, kVersion));
  if (token_bytes != 2 && token_bytes != 4) return bad(index_path, fmt::format("token bytes {} (2 or 4)", token_bytes));
  if (count == 0 || count > (index.size() - kHeaderBytes) / 16 || index.size() != kHeaderBytes + (2 * count + 1) * 8)
    return bad(index_path, fmt::format("{} bytes do not hold the {} examples its header names", index.size(), count));
  Examples examples;
  examples.source_path = path;
  examples.vocab_size = load_le<uint32_t>(index, 24);
  examples.offsets.resize(count + 1);
  examples.source_lines.resize(count);
  std::memcpy(examples.offsets.data(), index.data() + kHeaderBytes, (count + 1) * 8);
  std::memcpy(examples.source_lines.data(), index.data() + kHeaderBytes + (count + 1) * 8, count * 8);
  for (uint64_t k = 0; k < count; ++k)
    if (examples.offsets[k + 1] < examples.offsets[k] + 2)
      return bad(index_path, fmt::format("example {} spans tokens {}..{}: offsets must grow by 2 or more", k,
                                         examples.offsets[k], examples.offsets[k + 1]));
  if (examples.offsets[0] != 0) return bad(index_path, "the first offset is not 0");
  const uint64_t token_count = examples.offsets[count];
  STRATA_ASSIGN_OR_RETURN(std::string ids, read_whole(path));
  if (ids.size() != token_count * token_bytes)
    return bad(path, fmt::format("{} bytes, but its index names {} tokens of {} bytes", ids.size(), token_count, token_bytes));
  STRATA_ASSIGN_OR_RETURN(std::string mask, read_whole(path + ".mask"));
  if (mask.size() != token_count)
    return bad(path + ".mask", fmt::format("{} bytes, but its index names {} tokens", mask.size(), token_count));
  examples.tokens.resize(token_count);
  examples.trained.resize(token_count);
  for (uint64_t i = 0; i < token_count; ++i) {
    examples.tokens[i] = token_bytes == 2 ? load_le<uint16_t>(ids, 2 * i) : load_le<uint32_t>(ids, 4 * i);
    // The ids index the embedding: one outside the vocabulary the index names is refused here.
    if (examples.tokens[i] >= examples.vocab_size)
      return bad(path, fmt::format("token {} at index {} is outside the vocabulary of {} its index names",
                                   examples.tokens[i], i, examples.vocab_size));
    const auto flag = static_cast<uint8_t>(mask[i]);
    if (flag > 1) return bad(path + ".mask", fmt::format("byte {} is {}; a mask byte is 0 or 1", i, flag));
    examples.trained[i] = flag;
  }
  return examples;
}

// --- batches -------------------------------------------------------------------------------

Result<Batches> Batches::build(Examples examples, const BatchOptions& options) {
  if (options.seq_len == 0 || options.batch_rows == 0)
    return make_error(ErrorKind::invalid_argument, "seq_len and batch rows must be positive");
  Batches batches;
  batches.options_ = options;
  BatchStats& stats = batches.stats_;
  stats.examples = examples.count();
  stats.bad_lines_skipped = examples.bad_lines_skipped;
  // An example of n tokens fills n − 1 positions (its last token is only a target).
  const uint64_t max_tokens = uint64_t{options.seq_len} + 1;
  for (uint64_t k = 0; k < examples.count(); ++k) {
    uint64_t size = examples.size(k);
    if (size > max_tokens) {
      if (!options.truncate)
        return bad(fmt::format("{}:{}", examples.source_path, examples.source_lines[k]),
                   fmt::format("the example has {} tokens, more than seq_len + 1 = {}; set data.truncate: true to cut it",
                               size, max_tokens));
      size = max_tokens;
      ++stats.truncated;
    }
    // Targets are tokens 1..size−1: a row that would train nothing is left out, never a 0/0 loss.
    uint64_t trained = 0;
    for (uint64_t i = 1; i < size; ++i) trained += examples.trained[examples.offsets[k] + i];
    if (trained == 0) {
      ++stats.skipped_untrained;
      continue;
    }
    stats.trained_tokens += trained;
    batches.used_.push_back(k);
    batches.used_size_.push_back(static_cast<uint32_t>(size));
  }
  stats.examples_used = batches.used_.size();
  if (batches.used_.empty())
    return bad(examples.source_path,
               fmt::format("none of its {} examples has a trained token within seq_len + 1 = {} tokens", stats.examples, max_tokens));
  // Rows: greedy in file order — an example joins the current row when its positions fit,
  // else it opens the next row.
  batches.row_begin_.push_back(0);
  uint64_t filled = 0;
  for (uint64_t u = 0; u < batches.used_.size(); ++u) {
    const uint64_t positions = batches.used_size_[u] - 1;
    if (u > 0 && (!options.packing || filled + positions > options.seq_len)) {
      batches.row_begin_.push_back(u);
      filled = 0;
    }
    filled += positions;
  }
  batches.row_begin_.push_back(batches.used_.size());
  stats.rows = batches.rows_per_epoch();
  stats.row_tokens = stats.rows * options.seq_len;
  batches.permutation_.resize(stats.rows);
  batches.examples_ = std::move(examples);
  return batches;
}

uint64_t Batches::steps_for_epochs(uint64_t epochs) const {
  const uint64_t rows = rows_per_epoch() * epochs;
  return (rows + options_.batch_rows - 1) / options_.batch_rows;
}

// Epoch e's order: Fisher–Yates driven by mt19937_64 seeded from (seed, e), with our own
// bounded draw (std::uniform_int_distribution differs between standard libraries, and the
// order must not change with the toolchain).
namespace {

// Appends example k of `from` to `to`.
void append_example(const Examples& from, uint64_t k, Examples& to) {
  const auto first = static_cast<std::ptrdiff_t>(from.offsets[k]);
  const auto last = static_cast<std::ptrdiff_t>(from.offsets[k + 1]);
  to.tokens.insert(to.tokens.end(), from.tokens.begin() + first, from.tokens.begin() + last);
  to.trained.insert(to.trained.end(), from.trained.begin() + first, from.trained.begin() + last);
  to.offsets.push_back(to.tokens.size());
  if (k < from.source_lines.size()) to.source_lines.push_back(from.source_lines[k]);
}

}  // namespace

Result<ExampleSplit> split_examples(Examples all, double fraction, uint64_t seed, const std::string& what) {
  const uint64_t count = all.count();
  const auto held = static_cast<uint64_t>(std::llround(static_cast<double>(count) * fraction));
  if (count < 2 || held == 0 || held >= count)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: {} of {} examples in {} holds out {} — it must leave at least one example on each "
                                  "side",
                                  what, fraction, count, all.source_path, held));
  // The `held` examples with the smallest keys are held out.
  std::vector<std::pair<uint64_t, uint64_t>> keys(count);
  for (uint64_t k = 0; k < count; ++k) keys[k] = {splitmix64(splitmix64(seed) ^ k), k};
  std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(held - 1), keys.end());
  std::vector<uint8_t> is_held(count, 0);
  for (uint64_t i = 0; i < held; ++i) is_held[keys[i].second] = 1;
  ExampleSplit split;
  for (Examples* part : {&split.train, &split.held_out}) {
    part->source_path = all.source_path;
    part->vocab_size = all.vocab_size;
  }
  split.train.bad_lines_skipped = all.bad_lines_skipped;
  for (uint64_t k = 0; k < count; ++k) append_example(all, k, is_held[k] ? split.held_out : split.train);
  return split;
}

void Batches::permute(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  const uint64_t rows = permutation_.size();
  for (uint64_t i = 0; i < rows; ++i) permutation_[i] = i;
  permutation_epoch_ = epoch;
  if (!options_.shuffle) return;
  std::seed_seq seeds{static_cast<uint32_t>(options_.seed), static_cast<uint32_t>(options_.seed >> 32),
                      static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32), 0x64617461u};
  std::mt19937_64 random(seeds);
  for (uint64_t i = rows; i > 1; --i) {
    // Uniform in [0, i): reject the top sliver of 2^64 that i does not divide.
    const uint64_t limit = UINT64_MAX - UINT64_MAX % i;
    uint64_t draw = random();
    while (draw >= limit) draw = random();
    std::swap(permutation_[i - 1], permutation_[draw % i]);
  }
}

uint64_t Batches::row_at(uint64_t epoch, uint64_t index) {
  permute(epoch);
  return permutation_[index];
}

void Batches::fill_row(uint64_t row, int32_t* tokens, int32_t* targets, int32_t* positions, int32_t* segments) const {
  const uint32_t seq_len = options_.seq_len;
  uint32_t at = 0;
  int32_t segment = 0;
  for (uint64_t u = row_begin_[row]; u < row_begin_[row + 1]; ++u, ++segment) {
    const uint64_t first = examples_.offsets[used_[u]];
    const uint32_t size = used_size_[u];
    for (uint32_t i = 0; i + 1 < size; ++i, ++at) {
      tokens[at] = static_cast<int32_t>(examples_.tokens[first + i]);
      targets[at] = examples_.trained[first + i + 1] ? static_cast<int32_t>(examples_.tokens[first + i + 1]) : -1;
      if (positions != nullptr) positions[at] = static_cast<int32_t>(i);
      if (segments != nullptr) segments[at] = segment;
    }
  }
  for (uint32_t pad = 0; at < seq_len; ++at, ++pad) {
    tokens[at] = options_.pad_id;
    targets[at] = -1;
    if (positions != nullptr) positions[at] = static_cast<int32_t>(pad);
    if (segments != nullptr) segments[at] = segment;
  }
}

void Batches::fill(uint64_t step, uint32_t first_row, uint32_t row_count, int32_t* tokens, int32_t* targets,
                   int32_t* positions, int32_t* segments) {
  const uint64_t rows = rows_per_epoch();
  const uint64_t seq_len = options_.seq_len;
  for (uint32_t r = 0; r < row_count; ++r) {
    const uint64_t global = step * options_.batch_rows + first_row + r;
    permute(global / rows);
    const uint64_t offset = uint64_t{r} * seq_len;
    fill_row(permutation_[global % rows], tokens + offset, targets + offset,
             positions == nullptr ? nullptr : positions + offset, segments == nullptr ? nullptr : segments + offset);
  }
}

}  // namespace strata::data
