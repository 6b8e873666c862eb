#include "models/safetensors.h"

#include <cerrno>
#include <cassert>
#include <cstdio>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace strata {

uint64_t SafetensorsEntry::element_count() const {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    // Saturates instead of wrapping: a shape whose product overflows can never match a
    // real byte range, so the reader's size check refuses it (a wrapped product could match).
    if (dim < 0) return UINT64_MAX;
    if (dim != 0 && count > UINT64_MAX / static_cast<uint64_t>(dim)) return UINT64_MAX;
    count *= static_cast<uint64_t>(dim);
  }
  return count;
}

static Status pread_all(int fd, void* out, uint64_t size_bytes, uint64_t offset_bytes,
                        const std::string& path) {
  auto* cursor = static_cast<char*>(out);
  while (size_bytes > 0) {
    ssize_t got = ::pread(fd, cursor, size_bytes, static_cast<off_t>(offset_bytes));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return make_errno_error(errno, "read", path, offset_bytes, size_bytes);
    if (got == 0) {
      Error error = make_errno_error(0, "read", path, offset_bytes, size_bytes);
      error.kind = ErrorKind::corrupt;
      error.message = "file ends early (truncated safetensors file?)";
      return error;
    }
    cursor += got;
    offset_bytes += static_cast<uint64_t>(got);
    size_bytes -= static_cast<uint64_t>(got);
  }
  return Status();
}

static Status write_all_fd(int fd, const void* data, uint64_t size_bytes, const std::string& path) {
  const auto* cursor = static_cast<const char*>(data);
  while (size_bytes > 0) {
    ssize_t put = ::write(fd, cursor, size_bytes);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return make_errno_error(errno, "write", path);
    cursor += put;
    size_bytes -= static_cast<uint64_t>(put);
  }
  return Status();
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      data_offset_bytes_(other.data_offset_bytes_),
      entries_(std::move(other.entries_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    data_offset_bytes_ = other.data_offset_bytes_;
    entries_ = std::move(other.entries_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  SafetensorsReader reader;
  reader.path_ = path;
  reader.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (reader.fd_ < 0) return make_errno_error(errno, "open", path);
  struct stat info {};
  if (::fstat(reader.fd_, &info) != 0) return make_errno_error(errno, "stat", path);
  auto file_size = static_cast<uint64_t>(info.st_size);
  auto corrupt = [&](const std::string& why) {
    return make_error(ErrorKind::corrupt, fmt::format("{}: not a safetensors file: {}", path, why));
  };
  if (file_size < 8) return corrupt("shorter than its 8-byte header length");
  uint64_t header_bytes = 0;
  STRATA_RETURN_IF_ERROR(pread_all(reader.fd_, &header_bytes, 8, 0, path));
  if (header_bytes > file_size - 8 || header_bytes > (100u << 20)) return corrupt("header length out of range");
  std::string header(header_bytes, '\0');
  STRATA_RETURN_IF_ERROR(pread_all(reader.fd_, header.data(), header_bytes, 8, path));
  reader.data_offset_bytes_ = 8 + header_bytes;
  uint64_t data_bytes = file_size - reader.data_offset_bytes_;
  nlohmann::json json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return corrupt("header is not a JSON object");
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") continue;
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      return corrupt(fmt::format("entry '{}' lacks dtype, shape or data_offsets", name));
    // Every field is checked for its JSON type before it is read: a header is untrusted
    // input, and a wrong type must be a refusal naming the entry, not an exception.
    const auto& dtype_json = value["dtype"];
    const auto& shape_json = value["shape"];
    const auto& offsets = value["data_offsets"];
    if (!dtype_json.is_string()) return corrupt(fmt::format("entry '{}': dtype is not a string", name));
    if (!shape_json.is_array() || shape_json.size() > 8)
      return corrupt(fmt::format("entry '{}': shape is not an array of at most 8 dimensions", name));
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      return corrupt(fmt::format("entry '{}': data_offsets is not two unsigned integers", name));
    SafetensorsEntry entry;
    entry.name = name;
    Result<DType> dtype = parse_dtype(dtype_json.get<std::string>());
    if (!dtype.ok()) return corrupt(fmt::format("entry '{}': {}", name, dtype.error().message));
    entry.dtype = *dtype;
    for (const auto& dim : shape_json) {
      // Unsigned and below 2^62: a negative or huge dimension is a corrupt header.
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t{1} << 62))
        return corrupt(fmt::format("entry '{}': shape holds a dimension that is not a non-negative integer", name));
      entry.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
    }
    entry.begin_bytes = offsets[0].get<uint64_t>();
    entry.end_bytes = offsets[1].get<uint64_t>();
    const uint64_t elements = entry.element_count();
    const uint64_t element_bytes = dtype_size_bytes(entry.dtype);
    if (entry.end_bytes < entry.begin_bytes || entry.end_bytes > data_bytes ||
        elements > data_bytes / element_bytes || entry.size_bytes() != elements * element_bytes)
      return corrupt(fmt::format("entry '{}': data_offsets disagree with shape and dtype or the file size", name));
    reader.entries_.emplace(name, std::move(entry));
  }
  return reader;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Status SafetensorsReader::read(const SafetensorsEntry& entry, void* out) const {
  return pread_all(fd_, out, entry.size_bytes(), data_offset_bytes_ + entry.begin_bytes, path_);
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      entries_(std::move(other.entries_)),
      next_index_(other.next_index_),
      finished_(std::exchange(other.finished_, true)) {}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept {
  if (this != &other) {
    this->~SafetensorsWriter();
    new (this) SafetensorsWriter(std::move(other));
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path,
                                                    const std::vector<TensorSpec>& tensors,
                                                    const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  writer.path_ = path;
  writer.temp_path_ = path + ".tmp";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t cursor_bytes = 0;
  for (const TensorSpec& spec : tensors) {
    SafetensorsEntry entry;
    entry.name = spec.name;
    entry.dtype = spec.dtype;
    entry.shape = spec.shape;
    entry.begin_bytes = cursor_bytes;
    entry.end_bytes = cursor_bytes + entry.element_count() * dtype_size_bytes(spec.dtype);
    cursor_bytes = entry.end_bytes;
    header[spec.name] = {{"dtype", dtype_safetensors_name(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {entry.begin_bytes, entry.end_bytes}}};
    writer.entries_.push_back(std::move(entry));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  writer.fd_ = ::open(writer.temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (writer.fd_ < 0) return make_errno_error(errno, "create", writer.temp_path_);
  uint64_t header_bytes = text.size();
  STRATA_RETURN_IF_ERROR(write_all_fd(writer.fd_, &header_bytes, 8, writer.temp_path_));
  STRATA_RETURN_IF_ERROR(write_all_fd(writer.fd_, text.data(), text.size(), writer.temp_path_));
  return writer;
}

Status SafetensorsWriter::write_next(const void* data, uint64_t size_bytes) {
  assert(next_index_ < entries_.size());
  const SafetensorsEntry& entry = entries_[next_index_];
  assert(size_bytes == entry.size_bytes());
  STRATA_RETURN_IF_ERROR(write_all_fd(fd_, data, size_bytes, temp_path_));
  ++next_index_;
  return Status();
}

Status SafetensorsWriter::finish() {
  assert(next_index_ == entries_.size());
  if (::fsync(fd_) != 0) return make_errno_error(errno, "fsync", temp_path_);
  ::close(std::exchange(fd_, -1));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return make_errno_error(errno, "rename", path_);
  finished_ = true;
  return Status();
}

}  // namespace strata
