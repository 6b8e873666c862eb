#include "engine/data.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

namespace strata {

TokenData::TokenData(TokenData&& other) noexcept
    : bytes_(std::exchange(other.bytes_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      token_count_(other.token_count_),
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
  if (bytes_ != nullptr) ::munmap(const_cast<uint8_t*>(bytes_), mapped_bytes_);
}

Result<TokenData> TokenData::open(const std::string& path, DataFormat format, uint32_t vocab_size,
                                  uint32_t window_tokens) {
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
  uint32_t token_bytes = format == DataFormat::text_bytes ? 1 : 2;
  if (format == DataFormat::tokens_u16 && data.mapped_bytes_ % 2 != 0) {
    ::close(fd);
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("data file {} has an odd size ({} bytes); tokens-u16 needs 2 bytes a token",
                                  path, data.mapped_bytes_));
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
  if (format == DataFormat::tokens_u16) {
    for (uint64_t index = 0; index < data.token_count_; ++index) {
      if (data.token(index) >= vocab_size)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("data file {}: token {} at index {} is outside the vocabulary [0, {})",
                                      path, data.token(index), index, vocab_size));
    }
  }
  return data;
}

uint32_t TokenData::token(uint64_t index) const {
  if (format_ == DataFormat::text_bytes) return bytes_[index];
  uint16_t value = 0;
  std::memcpy(&value, bytes_ + 2 * index, 2);  // little-endian host (x86-64)
  return value;
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
