// strata/common/status.h — errors as values.
//
// Contract: operating errors (I/O failures, bad configuration, a full disk, a checksum
// mismatch) travel as `Status` / `Result<T>` and are never thrown across the I/O loop.
// Programmer errors (misaligned buffers, broken invariants) assert instead.
// An `Error` names what failed precisely enough that one line tells a user what to do:
// the operation, the file, the byte offset and length, the errno and — when the layer above
// knows it — the tensor.  Thread-safety: plain values, copy freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace strata {

// How the caller should react. The I/O loop retries `retryable` itself; everything else
// reaches the user.
enum class ErrorKind : uint8_t {
  retryable,         // EINTR/EAGAIN-like: try again
  io,                // EIO and friends: the device failed
  no_space,          // ENOSPC / EDQUOT / a budget that cannot be met
  not_found,         // a missing file or tensor
  corrupt,           // checksum mismatch, garbled manifest, wrong format version
  invalid_argument,  // bad configuration or input, rejected before work starts
  unsupported,       // the kernel or the device refuses a feature
  internal,          // anything else
};

const char* error_kind_name(ErrorKind kind);

struct Error {
  ErrorKind kind = ErrorKind::internal;
  std::string message;   // what happened, in words
  std::string op;        // "read", "write", "fsync", "open", "config", ...
  std::string path;      // file the operation touched, if any
  std::string tensor;    // tensor the bytes belong to, filled in by memory/ when known
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
  int errno_value = 0;
  bool has_range = false;  // offset/length are meaningful

  // One line: "read of 1048576 bytes at offset 4096 in /nvme/a.strata (tensor h.3.attn.w): Input/output error".
  std::string to_string() const;
};

// Builders for the common shapes, so call sites stay one line.
Error make_error(ErrorKind kind, std::string message);
Error make_errno_error(int errno_value, std::string op, std::string path, uint64_t offset_bytes,
                       uint64_t length_bytes);
Error make_errno_error(int errno_value, std::string op, std::string path);
// Maps an errno to the kind a caller acts on (EINTR/EAGAIN → retryable, ENOSPC → no_space, ...).
ErrorKind error_kind_from_errno(int errno_value);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT: implicit on purpose
  static Status ok_status() { return Status(); }

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }
  Error& error() { return *error_; }
  std::string to_string() const { return ok() ? std::string("ok") : error_->to_string(); }

 private:
  std::optional<Error> error_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}       // NOLINT: implicit on purpose
  Result(Error error) : state_(std::move(error)) {}   // NOLINT
  Result(Status status) : state_(std::move(status.error())) {}  // status must be an error

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<Error>(state_); }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> state_;
};

}  // namespace strata

// Propagate an error from an expression returning Status.
#define STRATA_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::strata::Status strata_status_ = (expr);   \
    if (!strata_status_.ok()) return strata_status_.error(); \
  } while (0)

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)
// Assign the value of a Result<T> expression to `lhs`, or return its error.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto STRATA_CONCAT(strata_result_, __LINE__) = (expr);                     \
  if (!STRATA_CONCAT(strata_result_, __LINE__).ok())                         \
    return STRATA_CONCAT(strata_result_, __LINE__).error();                  \
  lhs = std::move(STRATA_CONCAT(strata_result_, __LINE__)).value()
