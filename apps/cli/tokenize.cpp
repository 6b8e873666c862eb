// `strata tokenize`: a text corpus (.txt, or .jsonl with one {"text": ...} object a line) →
// a token file that `data.format: tokens-u16 | tokens-u32` trains on; or, with --data-format
// completion | chat, fine-tuning examples → ids + OUT.mask + OUT.examples that `data.format:
// examples` trains on (data/examples.h has the format; docs/data.md).
//
// Each document (the whole .txt, or one .jsonl line) is framed as BOS ids EOS — BOS where the
// model's texts start with one (Tokenizer::add_bos), EOS where the tokenizer has one
// (--no-special leaves them out), so windows that cross a document
// boundary see the marker the model knows. The output is written to OUT.tmp and renamed when
// complete: a failed run never leaves a half-written file under the final name.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "data/examples.h"
#include "apps/cli/commands.h"
#include "text/tokenizer.h"

namespace strata::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer_path;
  std::string in_path;
  std::string out_path;
  std::string format = "auto";
  std::string text_key = "text";
  std::string data_format = "text";  // text | completion | chat
  bool train_on_input = false;
  bool skip_bad_lines = false;
  bool no_special = false;
  bool json = false;
};

struct TokenizeSummary {
  uint64_t documents = 0;
  uint64_t tokens = 0;
  uint64_t input_bytes = 0;
  double encode_seconds = 0;  // encoding alone: not loading, not writing
  double seconds = 0;
  uint32_t token_bytes = 0;
  uint32_t vocab_size = 0;
  uint64_t trained_tokens = 0;     // examples: tokens the loss sees
  uint64_t bad_lines_skipped = 0;  // examples with --skip-bad-lines
};

// A read-only mapping of the whole input (an empty file maps nothing).
class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return make_errno_error(errno, "open input", path);
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd);
      return make_error(ErrorKind::invalid_argument, fmt::format("{}: not a regular file", path));
    }
    MappedFile file;
    file.size_ = static_cast<size_t>(info.st_size);
    if (file.size_ > 0) {
      void* mapped = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      int saved = errno;
      ::close(fd);
      if (mapped == MAP_FAILED) return make_errno_error(saved, "mmap input", path);
      file.data_ = static_cast<const char*>(mapped);
    } else {
      ::close(fd);
    }
    return file;
  }
  MappedFile(MappedFile&& other) noexcept : data_(std::exchange(other.data_, nullptr)), size_(other.size_) {}
  MappedFile(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view view() const { return {data_ == nullptr ? "" : data_, size_}; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Buffered little-endian writer of u16 or u32 ids to OUT.tmp; `commit` renames it into place.
class TokenWriter {
 public:
  static Result<TokenWriter> create(const std::string& path, uint32_t token_bytes) {
    TokenWriter writer;
    writer.path_ = path;
    writer.tmp_path_ = path + ".tmp";
    writer.token_bytes_ = token_bytes;
    writer.file_ = std::fopen(writer.tmp_path_.c_str(), "wb");
    if (writer.file_ == nullptr) return make_errno_error(errno, "create", writer.tmp_path_);
    return writer;
  }
  TokenWriter(TokenWriter&& other) noexcept
      : path_(std::move(other.path_)), tmp_path_(std::move(other.tmp_path_)),
        file_(std::exchange(other.file_, nullptr)), token_bytes_(other.token_bytes_) {}
  TokenWriter(const TokenWriter&) = delete;
  ~TokenWriter() {
    if (file_ != nullptr) {  // not committed: leave nothing behind
      std::fclose(file_);
      std::remove(tmp_path_.c_str());
    }
  }
  Status write(const std::vector<uint32_t>& ids) {
    buffer_.clear();
    buffer_.resize(ids.size() * token_bytes_);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (token_bytes_ == 2) {
        auto value = static_cast<uint16_t>(ids[i]);
        std::memcpy(buffer_.data() + 2 * i, &value, 2);  // little-endian host (x86-64)
      } else {
        std::memcpy(buffer_.data() + 4 * i, &ids[i], 4);
      }
    }
    if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
      return make_errno_error(errno, "write", tmp_path_);
    return Status();
  }
  Status commit() {
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) return make_errno_error(errno, "write", tmp_path_);
    int closed = std::fclose(std::exchange(file_, nullptr));
    if (closed != 0) return make_errno_error(errno, "close", tmp_path_);
    if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) return make_errno_error(errno, "rename", path_);
    return Status();
  }

 private:
  TokenWriter() = default;
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  uint32_t token_bytes_ = 2;
  std::vector<char> buffer_;
};

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint32_t token_bytes_for(const std::string& format, uint32_t vocab_size) {
  if (format == "auto") return vocab_size > 65536 ? 4 : 2;
  return format == "tokens-u16" ? 2 : 4;
}

// --data-format completion | chat: every line an example, tokenized piece by piece with its mask.
Result<TokenizeSummary> run_tokenize_examples(const TokenizeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!ends_with(options.in_path, ".jsonl"))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--in {}: --data-format {} reads a .jsonl (one example a line)", options.in_path,
                                  options.data_format));
  if (options.no_special)
    return make_error(ErrorKind::invalid_argument,
                      "--no-special: examples are framed as the model reads them (completion: BOS/EOS; chat: the template)");
  data::ExampleOptions example_options;
  example_options.format = options.data_format == "chat" ? data::ExampleFormat::chat : data::ExampleFormat::completion;
  example_options.tokenizer_path = options.tokenizer_path;
  example_options.train_on_input = options.train_on_input;
  example_options.skip_bad_lines = options.skip_bad_lines;
  const auto encode_start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(data::Examples examples, data::read_jsonl_examples(options.in_path, example_options));
  TokenizeSummary summary;
  summary.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
  summary.vocab_size = examples.vocab_size;
  summary.token_bytes = token_bytes_for(options.format, summary.vocab_size);
  if (summary.token_bytes == 2 && summary.vocab_size > 65536)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--format tokens-u16: {} holds {} tokens, more than 16-bit ids can name; use tokens-u32",
                                  options.tokenizer_path, summary.vocab_size));
  STRATA_RETURN_IF_ERROR(data::write_examples(examples, options.out_path, summary.token_bytes));
  summary.documents = examples.count();
  summary.tokens = examples.tokens.size();
  for (uint8_t flag : examples.trained) summary.trained_tokens += flag;
  summary.bad_lines_skipped = examples.bad_lines_skipped;
  struct stat info {};
  if (::stat(options.in_path.c_str(), &info) == 0) summary.input_bytes = static_cast<uint64_t>(info.st_size);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

Result<TokenizeSummary> run_tokenize(const TokenizeOptions& options) {
  if (options.data_format != "text") return run_tokenize_examples(options);
  const auto start = std::chrono::steady_clock::now();
  bool jsonl = ends_with(options.in_path, ".jsonl");
  if (!jsonl && !ends_with(options.in_path, ".txt"))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--in {}: name a .txt (one document) or a .jsonl (one JSON object a line)", options.in_path));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::load_tokenizer(options.tokenizer_path));
  TokenizeSummary summary;
  summary.vocab_size = tok->vocab_size();
  summary.token_bytes = token_bytes_for(options.format, summary.vocab_size);
  if (summary.token_bytes == 2 && summary.vocab_size > 65536)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--format tokens-u16: {} holds {} tokens, more than 16-bit ids can name; use tokens-u32",
                                  options.tokenizer_path, summary.vocab_size));
  STRATA_ASSIGN_OR_RETURN(MappedFile input, MappedFile::open(options.in_path));
  const std::string_view text = input.view();
  summary.input_bytes = text.size();
  STRATA_ASSIGN_OR_RETURN(TokenWriter writer, TokenWriter::create(options.out_path, summary.token_bytes));

  auto last_report = std::chrono::steady_clock::now();
  auto report = [&](uint64_t done_bytes) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_report < std::chrono::seconds(2)) return;
    last_report = now;
    double elapsed = std::chrono::duration<double>(now - start).count();
    spdlog::info("tokenize: {} of {} ({:.0f}%), {:.1f} MB/s", format_size(done_bytes), format_size(text.size()),
                 100.0 * static_cast<double>(done_bytes) / static_cast<double>(std::max<size_t>(text.size(), 1)),
                 static_cast<double>(done_bytes) / 1e6 / elapsed);
  };
  std::vector<uint32_t> ids;
  auto encode_document = [&](std::string_view document, uint64_t offset_bytes, const std::string& where) -> Status {
    ids.clear();
    if (!options.no_special && tok->add_bos() && tok->bos_id()) ids.push_back(*tok->bos_id());
    auto encode_start = std::chrono::steady_clock::now();
    Status status = tok->encode_into(document, ids, [&](uint64_t done) { report(offset_bytes + done); });
    summary.encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
    if (!status.ok()) {
      Error error = status.error();
      error.message = fmt::format("{}: {}", where, error.message);
      return error;
    }
    if (!options.no_special && tok->eos_id()) ids.push_back(*tok->eos_id());
    summary.tokens += ids.size();
    ++summary.documents;
    return writer.write(ids);
  };

  if (!jsonl) {
    STRATA_RETURN_IF_ERROR(encode_document(text, 0, options.in_path));
  } else {
    size_t at = 0;
    uint64_t line_number = 0;
    std::string document;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(at, end - at);
      ++line_number;
      const size_t line_start = at;
      at = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines: nothing
      const std::string where = fmt::format("{}:{}", options.in_path, line_number);
      nlohmann::json object = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
      if (object.is_discarded() || !object.is_object())
        return make_error(ErrorKind::invalid_argument, fmt::format("{}: not a JSON object", where));
      auto field = object.find(options.text_key);
      if (field == object.end() || !field->is_string())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: key '{}' is {}", where, options.text_key,
                                      field == object.end() ? "missing" : std::string("a ") + field->type_name() + ", not a string"));
      document = field->get<std::string>();
      STRATA_RETURN_IF_ERROR(encode_document(document, line_start, where));
    }
  }
  STRATA_RETURN_IF_ERROR(writer.commit());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

void add_tokenize_command(CLI::App& app, CliState& state) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand(
      "tokenize",
      "Turn a text corpus (.txt: one document; .jsonl: one JSON object a line with a text field) into a token file "
      "for data.format tokens-u16 or tokens-u32, with a Hugging Face tokenizer.json (BPE) or a SentencePiece "
      "tokenizer.model (and the tokenizer_config.json beside it). Each document is framed by BOS (where the model "
      "adds one) and EOS.");
  command->add_option("--tokenizer", options->tokenizer_path, "tokenizer.json, tokenizer.model, or a folder holding one")
      ->required();
  command->add_option("--in", options->in_path, "the corpus: FILE.txt or FILE.jsonl")->required();
  command->add_option("--out", options->out_path, "the token file to write")->required();
  command->add_option("--format", options->format,
                      "tokens-u16 | tokens-u32 | auto (u32 when the vocabulary holds more than 65,536 tokens)")
      ->check(CLI::IsMember({"auto", "tokens-u16", "tokens-u32"}))
      ->capture_default_str();
  command->add_option("--text-key", options->text_key, "the .jsonl field holding the text")->capture_default_str();
  command->add_option("--data-format", options->data_format,
                      "text: documents into one token stream; completion | chat: fine-tuning examples (.jsonl) into "
                      "ids + OUT.mask + OUT.examples for data.format: examples (docs/data.md)")
      ->check(CLI::IsMember({"text", "completion", "chat"}))
      ->capture_default_str();
  command->add_flag("--train-on-input", options->train_on_input, "examples: train on prompts and user turns too");
  command->add_flag("--skip-bad-lines", options->skip_bad_lines, "examples: count and skip bad lines instead of stopping");
  command->add_flag("--no-special", options->no_special, "no BOS/EOS around documents");
  command->add_flag("--json", options->json, "print the summary as one JSON object on stdout");
  command->callback([options, &state] {
    Result<TokenizeSummary> summary = run_tokenize(*options);
    if (failed(summary, state)) return;
    const TokenizeSummary& s = *summary;
    const char* format = s.token_bytes == 2 ? "tokens-u16" : "tokens-u32";
    double encode_mb_per_s = s.encode_seconds > 0 ? static_cast<double>(s.input_bytes) / 1e6 / s.encode_seconds : 0.0;
    if (options->json) {
      nlohmann::ordered_json json = {{"out", options->out_path},   {"format", format},
                                     {"documents", s.documents},   {"tokens", s.tokens},
                                     {"input_bytes", s.input_bytes}, {"vocab_size", s.vocab_size},
                                     {"encode_seconds", s.encode_seconds}, {"seconds", s.seconds},
                                     {"encode_mb_per_s", encode_mb_per_s}};
      if (options->data_format != "text") {
        json["data_format"] = options->data_format;
        json["trained_tokens"] = s.trained_tokens;
        json["bad_lines_skipped"] = s.bad_lines_skipped;
      }
      fmt::print("{}\n", json.dump());
    } else {
      spdlog::info("wrote {} tokens ({}, vocab {}) from {} documents, {} of text, to {} in {:.2f} s ({:.1f} MB/s encoding)",
                   s.tokens, format, s.vocab_size, s.documents, format_size(s.input_bytes), options->out_path, s.seconds,
                   encode_mb_per_s);
      if (options->data_format != "text")
        spdlog::info("{} examples, {} trained tokens, {} bad lines skipped; masks in {}.mask, boundaries in {}.examples",
                     s.documents, s.trained_tokens, s.bad_lines_skipped, options->out_path, options->out_path);
    }
  });
}

}  // namespace strata::cli
