// strata/io/backend.h — the interface for authors of I/O backends (uring, aio, psync, the
// fault injector). Users of the engine read io/io.h instead.
//
// Division of labour: the engine core (io/engine.cpp) owns everything that is the same for
// every backend — splitting requests at stripe and block boundaries, the head/tail bounce
// path, resubmitting short transfers, retrying EINTR/EAGAIN, turning a completion into an
// `Error`, request and piece slots. A backend only moves pieces that are already valid for
// the file (aligned when the file is direct) and reports each one's raw result.
//
// Contract:
//  - `capacity()` pieces may be outstanding at once (prepared, submitted or completed but
//    not yet reaped); the core never prepares more. A backend may still find its own queue
//    full (a uring SQ shared with resubmits) — then it submits and makes room itself, it
//    never fails for that reason.
//  - `prepare` queues one piece without necessarily telling the kernel; `submit_and_reap`
//    hands every prepared piece to the kernel (one syscall where the backend allows), then
//    returns up to `max_completions` finished pieces, blocking until at least
//    `min_completions` are available. `min_completions` never exceeds the pieces outstanding.
//  - A completion's `result` is what the syscall returned: bytes moved (possibly fewer than
//    asked: the core resubmits), or a negative errno (the core retries EINTR/EAGAIN).
//  - The piece's buffer and file stay valid until its completion is reaped.
//  - One thread calls a backend (the engine's owner); psync's pool threads are internal.
//  - Every resource (ring, aio context, threads, arrays) is allocated by the factory; nothing
//    is allocated per piece.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "io/io.h"

namespace strata::io {

struct BackendPiece {
  Op op = Op::read;
  const DirectFile* file = nullptr;  // fd, id (for registered-file tables), path
  void* buffer = nullptr;
  uint32_t length_bytes = 0;
  uint64_t file_offset_bytes = 0;
  uint64_t tag = 0;                  // returned unchanged in the completion
};

struct BackendCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred, or -errno
};

class BackendQueue {
 public:
  virtual ~BackendQueue() = default;
  virtual Backend kind() const = 0;
  virtual uint32_t capacity() const = 0;
  // Optional: a region the backend may use natively (uring fixed buffers). Returns
  // `unsupported` when the backend has no such notion; the core then ignores it. Called only
  // while no piece is outstanding.
  [[nodiscard]] virtual Status register_buffer(void* base, uint64_t length_bytes) = 0;
  [[nodiscard]] virtual Status prepare(const BackendPiece& piece) = 0;
  [[nodiscard]] virtual Result<uint32_t> submit_and_reap(BackendCompletion* completions,
                                                         uint32_t max_completions,
                                                         uint32_t min_completions) = 0;
  // Syscalls made to hand pieces to the kernel, and pieces that used fixed buffers.
  virtual uint64_t submit_calls() const = 0;
  virtual uint64_t fixed_buffer_ops() const { return 0; }
  virtual std::string describe() const = 0;
};

// Factories, one per backend; `unsupported` when this build or kernel lacks it.
[[nodiscard]] Result<std::unique_ptr<BackendQueue>> make_uring_backend(const EngineConfig& config);
[[nodiscard]] Result<std::unique_ptr<BackendQueue>> make_aio_backend(const EngineConfig& config);
[[nodiscard]] Result<std::unique_ptr<BackendQueue>> make_psync_backend(const EngineConfig& config);
[[nodiscard]] Result<std::unique_ptr<BackendQueue>> make_backend(const EngineConfig& config);

// The engine core over any backend: make_engine is `make_engine_over(make_backend(config))`;
// the fault injector wraps the backend before handing it here.
[[nodiscard]] Result<std::unique_ptr<Engine>> make_engine_over(
    const EngineConfig& config, std::unique_ptr<BackendQueue> backend);

}  // namespace strata::io
