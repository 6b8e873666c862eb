#include "data/token_stream.h"

#include <cassert>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <fstream>
#include <iterator>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "text/tokenizer.h"

namespace strata {

TokenData::TokenData(TokenData&& other) noexcept
    : bytes_(std::exchange(other.bytes_, nullptr)),
      owned_ids_(std::move(other.owned_ids_)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      token_count_(other.token_count_),
      first_token_(other.first_token_),
      format_(other.format_),
      window_tokens_(other.window_tokens_) {}

TokenData& TokenData::operator=(TokenData&& other) noexcept {
  if (this != &other) {
    this->~TokenData();
    new (this) TokenData(std::move(other));
  }
  return *this;
}

TokenData::~TokenData() {
  if (bytes_ != nullptr && format_ != DataFormat::text) ::munmap(const_cast<uint8_t*>(bytes_), mapped_bytes_);
}

namespace {

// `data.format: text`: the whole file encoded once, with a progress line for a long one.
Result<std::vector<uint32_t>> tokenize_text_file(const std::string& path, const std::string& tokenizer_path,
                                                 uint32_t vocab_size) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, tokenizer::load_tokenizer(tokenizer_path));
  if (tok->vocab_size() > vocab_size)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data.tokenizer {} has {} tokens but model.vocab_size is {}; the model needs at least {}",
                                  tokenizer_path, tok->vocab_size(), vocab_size, tok->vocab_size()));
  std::ifstream input(path, std::ios::binary);
  if (!input) return make_errno_error(errno, "open data", path);
  std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
  if (input.bad()) return make_errno_error(errno, "read data", path);
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  // The file is one document, framed as `strata tokenize` frames a .txt: BOS (where the model's
  // texts start with one) ids EOS.
  std::vector<uint32_t> ids;
  if (tok->add_bos() && tok->bos_id()) ids.push_back(*tok->bos_id());
  Status status = tok->encode_into(text, ids, [&](uint64_t done_bytes) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_report < std::chrono::seconds(2)) return;
    last_report = now;
    spdlog::info("tokenizing {}: {} of {} bytes ({:.0f}%)", path, done_bytes, text.size(),
                 100.0 * static_cast<double>(done_bytes) / static_cast<double>(text.size()));
  });
  if (!status.ok()) {
    Error error = status.error();
    error.message = fmt::format("data file {}: {}", path, error.message);
    return error;
  }
  if (tok->eos_id()) ids.push_back(*tok->eos_id());
  spdlog::info("tokenized {} ({} bytes) into {} tokens with {} in {:.1f} s", path, text.size(), ids.size(),
               tokenizer_path, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ids;
}

}  // namespace

Result<TokenData> TokenData::open(const std::string& path, DataFormat format, uint32_t vocab_size,
                                  uint32_t window_tokens, const std::string& tokenizer_path) {
  if (is_example_format(format))
    return make_error(ErrorKind::internal, "TokenData::open: an example format is read by data::Batches");
  if (format == DataFormat::text) {
    TokenData data;
    data.format_ = format;
    data.window_tokens_ = window_tokens;
    STRATA_ASSIGN_OR_RETURN(data.owned_ids_, tokenize_text_file(path, tokenizer_path, vocab_size));
    data.token_count_ = data.owned_ids_.size();
    if (data.token_count_ < uint64_t{window_tokens} + 2)
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("data file {} holds {} tokens, shorter than one window of seq_len + 2 = {}",
                                    path, data.token_count_, window_tokens + 2));
    data.bytes_ = reinterpret_cast<const uint8_t*>(data.owned_ids_.data());
    data.mapped_bytes_ = data.token_count_ * 4;
    return data;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_errno_error(errno, "open data", path);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int saved = errno;
    ::close(fd);
    return make_errno_error(saved, "stat data", path);
  }
  TokenData data;
  data.format_ = format;
  data.window_tokens_ = window_tokens;
  data.mapped_bytes_ = static_cast<uint64_t>(info.st_size);
  uint32_t token_bytes = format == DataFormat::text_bytes ? 1 : format == DataFormat::tokens_u16 ? 2 : 4;
  if (data.mapped_bytes_ % token_bytes != 0) {
    ::close(fd);
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data file {} has a size ({} bytes) that is not a whole number of {}-byte tokens",
                                  path, data.mapped_bytes_, token_bytes));
  }
  data.token_count_ = data.mapped_bytes_ / token_bytes;
  if (data.token_count_ < uint64_t{window_tokens} + 2) {
    ::close(fd);
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data file {} holds {} tokens, shorter than one window of seq_len + 2 = {}",
                                  path, data.token_count_, window_tokens + 2));
  }
  void* mapped = ::mmap(nullptr, data.mapped_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  int saved = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    data.mapped_bytes_ = 0;
    return make_errno_error(saved, "mmap data", path);
  }
  data.bytes_ = static_cast<const uint8_t*>(mapped);
  if (format == DataFormat::text_bytes && vocab_size < 256)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data.format text-bytes needs model.vocab_size >= 256 (it is {})", vocab_size));
  if (format != DataFormat::text_bytes) {
    for (uint64_t index = 0; index < data.token_count_; ++index) {
      if (data.token(index) >= vocab_size)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("data file {}: token {} at index {} is outside the vocabulary [0, {})",
                                      path, data.token(index), index, vocab_size));
    }
  }
  return data;
}

Status TokenData::keep_range(uint64_t first, uint64_t count, const std::string& what) {
  assert(first + count <= token_count_);
  if (count < uint64_t{window_tokens_} + 2)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{} leaves {} tokens on one side; each side needs at least {} (one window of seq_len "
                                  "+ 2)",
                                  what, count, window_tokens_ + 2));
  first_token_ += first;
  token_count_ = count;
  return Status();
}

uint32_t TokenData::token(uint64_t index) const {
  index += first_token_;
  switch (format_) {
    case DataFormat::text_bytes:
      return bytes_[index];
    case DataFormat::tokens_u16: {
      uint16_t value = 0;
      std::memcpy(&value, bytes_ + 2 * index, 2);  // little-endian host (x86-64)
      return value;
    }
    case DataFormat::tokens_u32:
    case DataFormat::text:
    case DataFormat::completion:  // never opened (open refuses them)
    case DataFormat::chat:
    case DataFormat::examples: {
      uint32_t value = 0;
      std::memcpy(&value, bytes_ + 4 * index, 4);
      return value;
    }
  }
  return 0;
}

void TokenData::fill_batch(uint64_t step, uint32_t batch_size, int32_t* inputs,
                           int32_t* targets) const {
  const uint64_t window_count = token_count_ - window_tokens_ - 1;
  for (uint32_t row = 0; row < batch_size; ++row) {
    uint64_t start = ((step * batch_size + row) * window_tokens_) % window_count;
    int32_t* row_inputs = inputs + row_offset(row, window_tokens_);
    int32_t* row_targets = targets + row_offset(row, window_tokens_);
    for (uint32_t t = 0; t < window_tokens_; ++t) {
      row_inputs[t] = static_cast<int32_t>(token(start + t));
      row_targets[t] = static_cast<int32_t>(token(start + t + 1));
    }
  }
}

}  // namespace strata
