#include "common/status.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace strata {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::retryable: return "retryable";
    case ErrorKind::io: return "I/O error";
    case ErrorKind::no_space: return "no space";
    case ErrorKind::not_found: return "not found";
    case ErrorKind::corrupt: return "corrupt";
    case ErrorKind::invalid_argument: return "invalid argument";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::internal: return "internal";
  }
  return "unknown";
}

std::string Error::to_string() const {
  std::string line;
  if (!op.empty()) {
    line = op;
    if (has_range) line += fmt::format(" of {} bytes at offset {}", length_bytes, offset_bytes);
    if (!path.empty()) line += fmt::format(" in {}", path);
    if (!tensor.empty()) line += fmt::format(" (tensor {})", tensor);
  } else if (!tensor.empty()) {
    line = fmt::format("tensor {}", tensor);
  }
  std::string detail = message;
  if (errno_value != 0) {
    std::string why = std::strerror(errno_value);
    detail = detail.empty() ? why : detail + ": " + why;
  }
  if (line.empty()) return detail.empty() ? std::string(error_kind_name(kind)) : detail;
  return detail.empty() ? line : line + ": " + detail;
}

Error make_error(ErrorKind kind, std::string message) {
  Error error;
  error.kind = kind;
  error.message = std::move(message);
  return error;
}

ErrorKind error_kind_from_errno(int errno_value) {
  switch (errno_value) {
    case EINTR:
    case EAGAIN:
      return ErrorKind::retryable;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return ErrorKind::no_space;
    case ENOENT:
    case ENOTDIR:
      return ErrorKind::not_found;
    case EINVAL:
    case EBADF:
      return ErrorKind::invalid_argument;
    case EOPNOTSUPP:
    case ENOSYS:
      return ErrorKind::unsupported;
    default:
      return ErrorKind::io;
  }
}

Error make_errno_error(int errno_value, std::string op, std::string path, uint64_t offset_bytes,
                       uint64_t length_bytes) {
  Error error = make_errno_error(errno_value, std::move(op), std::move(path));
  error.offset_bytes = offset_bytes;
  error.length_bytes = length_bytes;
  error.has_range = true;
  return error;
}

Error make_errno_error(int errno_value, std::string op, std::string path) {
  Error error;
  error.kind = error_kind_from_errno(errno_value);
  error.errno_value = errno_value;
  error.op = std::move(op);
  error.path = std::move(path);
  return error;
}

}  // namespace strata
