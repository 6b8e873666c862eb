// strata/io/engine.cpp — the engine core shared by every backend: request and piece slots,
// splitting at stripe and block boundaries, the head/tail bounce path, resubmitting short
// transfers, retrying EINTR/EAGAIN and turning completions into errors. Backends (uring,
// aio, psync, the fault injector) only move the aligned pieces this file hands them.
#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "io/backend.h"

namespace strata::io {
namespace {

// EINTR/EAGAIN in a row for one piece before it is reported: a device that keeps saying
// "try again" this long is not going to recover by itself.
constexpr uint32_t kMaxRetriesPerPiece = 10000;
// Bounce slots take unaligned heads/tails (one block) and whole pieces whose buffer is not
// aligned relative to the file offset; larger pieces go through in several slot-sized trips.
constexpr uint64_t kMaxBounceSlotBytes = 256 * kKiB;
constexpr uint64_t kMaxBlockBytes = 64 * kMiB;
constexpr uint32_t kGenerationShift = 20;  // RequestId = generation << 20 | slot index

// An anonymous mapping, page aligned; pages are only made resident when first touched, so
// a deep queue's bounce slots cost nothing until an unaligned request needs them.
class MappedRegion {
 public:
  MappedRegion() = default;
  explicit MappedRegion(uint64_t length_bytes) {
    void* base = ::mmap(nullptr, length_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      base_ = static_cast<char*>(base);
      length_bytes_ = length_bytes;
    }
  }
  MappedRegion(MappedRegion&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), length_bytes_(other.length_bytes_) {}
  MappedRegion& operator=(MappedRegion&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(length_bytes_, other.length_bytes_);
    return *this;
  }
  ~MappedRegion() {
    if (base_ != nullptr) ::munmap(base_, length_bytes_);
  }
  char* data() const { return base_; }

 private:
  char* base_ = nullptr;
  uint64_t length_bytes_ = 0;
};

enum class PieceKind : uint8_t { direct, bounce };
// A bounce write that covers only part of its aligned range first reads the range
// (prefill), patches in the caller's bytes, then writes it back (transfer).
enum class Phase : uint8_t { transfer, prefill };

struct RequestSlot {
  uint32_t generation = 0;
  bool in_use = false;
  bool finished = false;
  Op op = Op::read;
  Volume* volume = nullptr;
  char* buffer = nullptr;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
  uint64_t issued_bytes = 0;  // logical bytes handed to pieces so far
  uint32_t pieces_in_flight = 0;
  std::optional<Error> error;  // the first error; later pieces are not issued
};

struct PieceSlot {
  uint32_t request = 0;
  PieceKind kind = PieceKind::direct;
  Phase phase = Phase::transfer;
  Op op = Op::read;
  const DirectFile* file = nullptr;
  uint64_t logical_offset_bytes = 0;  // of the caller's part, for error messages
  uint64_t file_offset_bytes = 0;     // start of the range the backend moves
  uint32_t length_bytes = 0;          // the whole range
  uint32_t done_bytes = 0;            // moved so far in the current phase
  char* buffer = nullptr;             // direct: caller memory; bounce: this slot's bounce buffer
  char* user = nullptr;               // bounce: caller memory for the caller's part
  uint32_t user_skip_bytes = 0;       // bounce: the caller's part starts this far into the range
  uint32_t user_length_bytes = 0;
  uint32_t retries = 0;
  uint64_t last_unaligned_end = UINT64_MAX;
};

class CoreEngine final : public Engine {
 public:
  CoreEngine(const EngineConfig& config, std::unique_ptr<BackendQueue> backend,
             uint64_t bounce_slot_bytes, MappedRegion bounce)
      : config_(config),
        backend_(std::move(backend)),
        bounce_slot_bytes_(bounce_slot_bytes),
        bounce_(std::move(bounce)),
        requests_(config.max_requests),
        free_requests_(config.max_requests),
        issue_queue_(config.max_requests),
        finished_(2 * static_cast<size_t>(config.max_requests)),
        pieces_(backend_->capacity()),
        free_pieces_(backend_->capacity()),
        completions_(backend_->capacity()) {
    for (uint32_t i = 0; i < config.max_requests; ++i) free_requests_[i] = config.max_requests - 1 - i;
    free_request_count_ = config.max_requests;
    for (uint32_t i = 0; i < backend_->capacity(); ++i) free_pieces_[i] = backend_->capacity() - 1 - i;
    free_piece_count_ = backend_->capacity();
  }

  ~CoreEngine() override {
    // The kernel may still be writing into caller buffers and our bounce slots: drain
    // before they go away. Errors here have no one left to report to.
    while (outstanding_pieces() > 0) {
      Result<uint32_t> reaped = backend_->submit_and_reap(completions_.data(),
                                                          backend_->capacity(), 1);
      if (!reaped.ok()) break;
      for (uint32_t i = 0; i < *reaped; ++i) release_piece_slot(completions_[i].tag);
    }
  }

  Backend backend() const override { return backend_->kind(); }
  const EngineConfig& config() const override { return config_; }

  Status register_buffer(void* base, uint64_t length_bytes) override {
    assert(outstanding_pieces() == 0 && "register buffers while the engine is idle");
    Status status = backend_->register_buffer(base, length_bytes);
    if (!status.ok() && status.error().kind == ErrorKind::unsupported &&
        backend_->kind() != Backend::uring)
      return Status();  // only uring has fixed buffers; elsewhere any buffer is as good
    return status;
  }

  Result<RequestId> submit(Op op, Volume& volume, void* buffer, uint64_t length_bytes,
                           uint64_t offset_bytes) override {
    Result<RequestId> id = queue(op, volume, buffer, length_bytes, offset_bytes);
    if (!id.ok()) return id;
    STRATA_RETURN_IF_ERROR(flush());
    return id;
  }

  Status flush() override {
    STRATA_RETURN_IF_ERROR(progress(0));
    return flush_prepared();
  }

  Result<RequestId> queue(Op op, Volume& volume, void* buffer, uint64_t length_bytes,
                          uint64_t offset_bytes) override {
    assert((buffer != nullptr || length_bytes == 0) && "submit needs a buffer");
    assert(volume.file_count() > 0);
    if (free_request_count_ == 0)
      return make_error(ErrorKind::internal,
                        fmt::format("all {} request slots hold requests nobody has waited for; "
                                    "wait for some first (EngineConfig::max_requests)",
                                    config_.max_requests));
    const uint32_t index = free_requests_[--free_request_count_];
    RequestSlot& request = requests_[index];
    ++request.generation;  // 32 bits above the 20-bit index: ids do not repeat in practice
    request.in_use = true;
    request.finished = length_bytes == 0;
    request.op = op;
    request.volume = &volume;
    request.buffer = static_cast<char*>(buffer);
    request.offset_bytes = offset_bytes;
    request.length_bytes = length_bytes;
    request.issued_bytes = 0;
    request.pieces_in_flight = 0;
    request.error.reset();
    ++stats_.requests_submitted;
    if (length_bytes == 0) {
      ++stats_.requests_completed;
      note_finished(index);
    } else {
      issue_queue_[(issue_head_ + issue_count_) % issue_queue_.size()] = index;
      ++issue_count_;
    }
    issue_pending();  // fills SQEs / staging only; no system call
    return (static_cast<RequestId>(request.generation) << kGenerationShift) | index;
  }

  Status wait(RequestId id) override {
    RequestSlot& request = slot_of(id);
    while (!request.finished) STRATA_RETURN_IF_ERROR(progress(1));
    // Pieces of other requests prepared while we reaped should start now, not at the
    // caller's next call: it may go off computing for a while.
    STRATA_RETURN_IF_ERROR(flush_prepared());
    return release_request(id);
  }

  Result<Finished> wait_any() override {
    assert(free_request_count_ < requests_.size() && "wait_any with no request outstanding");
    while (true) {
      if (std::optional<Finished> finished = take_finished()) {
        STRATA_RETURN_IF_ERROR(flush_prepared());
        return *finished;
      }
      STRATA_RETURN_IF_ERROR(progress(1));
    }
  }

  std::optional<Finished> take_finished() override {
    // Finished requests in the order they finished; entries already consumed by wait(id)
    // are stale (their generation moved on or the slot is free) and skipped.
    while (finished_count_ > 0) {
      const auto [index, generation] = finished_[finished_head_];
      finished_head_ = (finished_head_ + 1) % finished_.size();
      --finished_count_;
      const RequestSlot& request = requests_[index];
      if (!request.in_use || request.generation != generation || !request.finished) continue;
      const RequestId id = (static_cast<RequestId>(generation) << kGenerationShift) | index;
      return Finished{id, release_request(id)};
    }
    return std::nullopt;
  }

  bool is_done(RequestId id) override {
    RequestSlot& request = slot_of(id);
    if (!request.finished) {
      // An engine-level failure here also shows up from the next wait, which must report it.
      if (progress(0).ok()) (void)flush_prepared();
    }
    return request.finished;
  }

  Status wait_all() override {
    Status first;
    for (uint32_t index = 0; index < requests_.size(); ++index) {
      if (!requests_[index].in_use) continue;
      const RequestId id =
          (static_cast<RequestId>(requests_[index].generation) << kGenerationShift) | index;
      Status status = wait(id);
      if (!status.ok() && first.ok()) first = status;
    }
    return first;
  }

  EngineStats stats() const override {
    EngineStats out = stats_;
    out.submit_calls = backend_->submit_calls();
    out.fixed_buffer_ops = backend_->fixed_buffer_ops();
    return out;
  }

  std::string describe() const override {
    return fmt::format("{} (queue depth {}, block {}, {})", backend_name(backend_->kind()),
                       config_.queue_depth, format_size(config_.block_size_bytes),
                       backend_->describe());
  }

 private:
  uint32_t outstanding_pieces() const {
    return static_cast<uint32_t>(pieces_.size()) - free_piece_count_;
  }

  RequestSlot& slot_of(RequestId id) {
    const uint32_t index = static_cast<uint32_t>(id & ((1u << kGenerationShift) - 1));
    assert(index < requests_.size() && "not a request id of this engine");
    RequestSlot& request = requests_[index];
    assert(request.in_use && request.generation == (id >> kGenerationShift) &&
           "request id already waited for, or not from this engine");
    return request;
  }

  Status release_request(RequestId id) {
    const uint32_t index = static_cast<uint32_t>(id & ((1u << kGenerationShift) - 1));
    RequestSlot& request = requests_[index];
    Status result = request.error ? Status(*request.error) : Status();
    request.in_use = false;
    request.error.reset();
    request.volume = nullptr;
    free_requests_[free_request_count_++] = index;
    return result;
  }

  // One tick: hand queued work to free piece slots, submit everything prepared with one
  // call, reap what completed (blocking for `min_completions`), and act on each result.
  Status progress(uint32_t min_completions) {
    issue_pending();
    const uint32_t wait_for = std::min(min_completions, outstanding_pieces());
    Result<uint32_t> reaped =
        backend_->submit_and_reap(completions_.data(), static_cast<uint32_t>(completions_.size()),
                                  wait_for);
    prepared_unsubmitted_ = 0;
    if (!reaped.ok()) return reaped.error();  // the backend itself failed (a broken ring)
    for (uint32_t i = 0; i < *reaped; ++i) on_completion(completions_[i]);
    issue_pending();
    return Status();
  }

  Status flush_prepared() {
    if (prepared_unsubmitted_ == 0) return Status();
    Result<uint32_t> reaped = backend_->submit_and_reap(nullptr, 0, 0);
    prepared_unsubmitted_ = 0;
    return reaped.status();
  }

  void issue_pending() {
    while (free_piece_count_ > 0 && issue_count_ > 0) {
      const uint32_t index = issue_queue_[issue_head_];
      RequestSlot& request = requests_[index];
      if (request.error || request.issued_bytes == request.length_bytes) {
        issue_head_ = (issue_head_ + 1) % issue_queue_.size();
        --issue_count_;
        maybe_finish(request);
        continue;
      }
      const uint32_t piece_index = free_pieces_[--free_piece_count_];
      ++request.pieces_in_flight;
      if (Status status = plan_piece(index, piece_index); !status.ok()) {
        fail_piece(piece_index, status.error());
        continue;
      }
      send(piece_index);
    }
  }

  // Cuts the next piece of `request` at its cursor: at most one stripe, at most one block,
  // and — on a direct file — either an aligned span of the caller's buffer or a bounce range.
  Status plan_piece(uint32_t request_index, uint32_t piece_index) {
    RequestSlot& request = requests_[request_index];
    PieceSlot& piece = pieces_[piece_index];
    const uint64_t logical = request.offset_bytes + request.issued_bytes;
    const Volume::Piece where =
        request.volume->piece_at(logical, request.length_bytes - request.issued_bytes);
    const DirectFile& file = request.volume->file(where.file_index);
    const uint64_t chunk_bytes = std::min(where.length_bytes, config_.block_size_bytes);
    char* caller = request.buffer + request.issued_bytes;
    const uint64_t file_offset = where.file_offset_bytes;

    piece = PieceSlot{};
    piece.request = request_index;
    piece.op = request.op;
    piece.file = &file;
    piece.logical_offset_bytes = logical;

    const uint64_t alignment = file.is_direct() ? file.alignment_bytes() : 1;
    if (alignment > bounce_slot_bytes_)
      return make_error(ErrorKind::unsupported,
                        fmt::format("{} needs {}-byte direct-I/O alignment, more than this "
                                    "engine's {}-byte bounce slots",
                                    file.path(), alignment, bounce_slot_bytes_));
    const uint64_t head_skew = file_offset % alignment;
    const bool buffer_in_step = reinterpret_cast<uintptr_t>(caller) % alignment == head_skew;
    uint64_t user_bytes;
    if (alignment == 1 || (buffer_in_step && head_skew == 0 && chunk_bytes >= alignment)) {
      // The aligned middle goes straight between the device and the caller's memory.
      user_bytes = alignment == 1 ? chunk_bytes : align_down(chunk_bytes, alignment);
      piece.kind = PieceKind::direct;
      piece.buffer = caller;
      piece.file_offset_bytes = file_offset;
      piece.length_bytes = static_cast<uint32_t>(user_bytes);
    } else {
      // Head, tail, or a buffer out of step with the file: an aligned range in the bounce slot.
      user_bytes = buffer_in_step
                       ? std::min(chunk_bytes, alignment - head_skew)
                       : std::min(chunk_bytes, bounce_slot_bytes_ - head_skew);
      piece.kind = PieceKind::bounce;
      piece.buffer = bounce_.data() + piece_index * bounce_slot_bytes_;
      piece.user = caller;
      piece.user_skip_bytes = static_cast<uint32_t>(head_skew);
      piece.user_length_bytes = static_cast<uint32_t>(user_bytes);
      piece.file_offset_bytes = file_offset - head_skew;
      piece.length_bytes = static_cast<uint32_t>(align_up(head_skew + user_bytes, alignment));
      stats_.bounce_bytes += user_bytes;
      if (request.op == Op::write) {
        if (piece.user_skip_bytes != 0 || piece.user_length_bytes != piece.length_bytes) {
          piece.phase = Phase::prefill;
        } else {
          std::memcpy(piece.buffer, caller, user_bytes);
        }
      }
    }
    request.issued_bytes += user_bytes;
    return Status();
  }

  Op backend_op(const PieceSlot& piece) const {
    return piece.phase == Phase::prefill ? Op::read : piece.op;
  }

  void send(uint32_t piece_index) {
    PieceSlot& piece = pieces_[piece_index];
    BackendPiece out;
    out.op = backend_op(piece);
    out.file = piece.file;
    out.buffer = piece.buffer + piece.done_bytes;
    out.length_bytes = piece.length_bytes - piece.done_bytes;
    out.file_offset_bytes = piece.file_offset_bytes + piece.done_bytes;
    out.tag = piece_index;
    if (Status status = backend_->prepare(out); !status.ok()) {
      fail_piece(piece_index, status.error());
      return;
    }
    ++prepared_unsubmitted_;
    ++stats_.pieces_submitted;
  }

  Error piece_error(const PieceSlot& piece, int errno_value, const std::string& what) const {
    const RequestSlot& request = requests_[piece.request];
    Error error = make_errno_error(errno_value, op_name(backend_op(piece)), piece.file->path(),
                                   piece.file_offset_bytes + piece.done_bytes,
                                   piece.length_bytes - piece.done_bytes);
    if (errno_value == 0) error.kind = ErrorKind::io;
    std::string context = fmt::format("part of a {}-byte {} at logical offset {} of {}",
                                      request.length_bytes, op_name(request.op),
                                      request.offset_bytes, request.volume->describe());
    if (piece.phase == Phase::prefill)
      context += "; reading the block around an unaligned write";
    if (errno_value == EOPNOTSUPP && config_.iopoll)
      context += "; the device refuses polled I/O: run without iopoll";
    error.message = what.empty() ? context : what + " (" + context + ")";
    return error;
  }

  // One function decides what a completion means: done, resubmit the rest, retry, end of
  // file, or an error for the caller.
  void on_completion(const BackendCompletion& completion) {
    const uint32_t piece_index = static_cast<uint32_t>(completion.tag);
    assert(piece_index < pieces_.size());
    PieceSlot& piece = pieces_[piece_index];
    const bool reading = backend_op(piece) == Op::read;
    const uint32_t wanted = piece.length_bytes - piece.done_bytes;

    if (completion.result < 0) {
      const int errno_value = static_cast<int>(-completion.result);
      if (error_kind_from_errno(errno_value) == ErrorKind::retryable &&
          piece.retries < kMaxRetriesPerPiece) {
        ++piece.retries;
        ++stats_.retries;
        send(piece_index);
        return;
      }
      fail_piece(piece_index, piece_error(piece, errno_value, ""));
      return;
    }
    assert(static_cast<uint64_t>(completion.result) <= wanted && "backend moved more than asked");
    const uint32_t moved = static_cast<uint32_t>(std::min<int64_t>(completion.result, wanted));
    if (moved == 0) {
      if (reading) {
        on_end_of_file(piece_index);
      } else if (piece.retries < kMaxRetriesPerPiece) {
        ++piece.retries;  // a write that moved nothing: the kernel may make progress later
        ++stats_.retries;
        send(piece_index);
      } else {
        fail_piece(piece_index, piece_error(piece, EIO, "writes keep moving 0 bytes"));
      }
      return;
    }
    piece.done_bytes += moved;
    piece.retries = 0;
    if (piece.done_bytes == piece.length_bytes || bounce_read_covered(piece)) {
      on_phase_done(piece_index);
      return;
    }
    // A short transfer: resubmit the rest. Direct I/O can only resume on a block boundary,
    // so step back to one (moving a few bytes twice is harmless for reads and writes alike).
    ++stats_.short_transfers_resubmitted;
    const uint64_t alignment = piece.file->is_direct() ? piece.file->alignment_bytes() : 1;
    const uint64_t end = piece.file_offset_bytes + piece.done_bytes;
    if (end % alignment != 0) {
      // The same unaligned end twice on a read: the file ends there.
      if (reading && end == piece.last_unaligned_end) {
        on_end_of_file(piece_index);
        return;
      }
      piece.last_unaligned_end = end;
      piece.done_bytes = static_cast<uint32_t>(align_down(piece.done_bytes, alignment));
    }
    send(piece_index);
  }

  bool bounce_read_covered(const PieceSlot& piece) const {
    // A bounce read needs only the caller's part of its aligned range; the rest may lie
    // past end of file.
    return piece.kind == PieceKind::bounce && piece.op == Op::read &&
           piece.done_bytes >= piece.user_skip_bytes + piece.user_length_bytes;
  }

  void on_end_of_file(uint32_t piece_index) {
    PieceSlot& piece = pieces_[piece_index];
    if (piece.phase == Phase::prefill) {
      // The block around an unaligned write reaches past end of file: those bytes are zero.
      std::memset(piece.buffer + piece.done_bytes, 0, piece.length_bytes - piece.done_bytes);
      piece.done_bytes = piece.length_bytes;
      on_phase_done(piece_index);
      return;
    }
    if (bounce_read_covered(piece)) {
      on_phase_done(piece_index);
      return;
    }
    fail_piece(piece_index,
               piece_error(piece, 0, fmt::format("end of file at byte {} of {}",
                                                 piece.file_offset_bytes + piece.done_bytes,
                                                 piece.file->path())));
  }

  void on_phase_done(uint32_t piece_index) {
    PieceSlot& piece = pieces_[piece_index];
    if (piece.phase == Phase::prefill) {
      std::memcpy(piece.buffer + piece.user_skip_bytes, piece.user, piece.user_length_bytes);
      piece.phase = Phase::transfer;
      piece.done_bytes = 0;
      piece.last_unaligned_end = UINT64_MAX;
      send(piece_index);
      return;
    }
    uint64_t caller_bytes = piece.length_bytes;
    if (piece.kind == PieceKind::bounce) {
      caller_bytes = piece.user_length_bytes;
      if (piece.op == Op::read)
        std::memcpy(piece.user, piece.buffer + piece.user_skip_bytes, piece.user_length_bytes);
    }
    (piece.op == Op::read ? stats_.bytes_read : stats_.bytes_written) += caller_bytes;
    finish_piece(piece_index);
  }

  void fail_piece(uint32_t piece_index, Error error) {
    RequestSlot& request = requests_[pieces_[piece_index].request];
    if (!request.error) request.error = std::move(error);
    finish_piece(piece_index);
  }

  void finish_piece(uint32_t piece_index) {
    RequestSlot& request = requests_[pieces_[piece_index].request];
    release_piece_slot(piece_index);
    --request.pieces_in_flight;
    maybe_finish(request);
  }

  void release_piece_slot(uint64_t piece_index) {
    free_pieces_[free_piece_count_++] = static_cast<uint32_t>(piece_index);
  }

  void maybe_finish(RequestSlot& request) {
    if (request.finished || request.pieces_in_flight > 0) return;
    if (!request.error && request.issued_bytes < request.length_bytes) return;
    request.finished = true;
    ++stats_.requests_completed;
    note_finished(static_cast<uint32_t>(&request - requests_.data()));
  }

  // Remembers the order requests finish in, for wait_any. Entries of requests consumed by
  // wait(id) go stale; when the ring (twice max_requests) fills, stale entries are dropped —
  // live ones are at most max_requests, so they always fit.
  void note_finished(uint32_t index) {
    if (finished_count_ == finished_.size()) {
      std::rotate(finished_.begin(), finished_.begin() + finished_head_, finished_.end());
      uint32_t kept = 0;
      for (uint32_t i = 0; i < finished_count_; ++i) {
        const auto entry = finished_[i];
        const RequestSlot& r = requests_[entry.first];
        if (r.in_use && r.finished && r.generation == entry.second) finished_[kept++] = entry;
      }
      finished_head_ = 0;
      finished_count_ = kept;
    }
    finished_[(finished_head_ + finished_count_) % finished_.size()] = {index, requests_[index].generation};
    ++finished_count_;
  }

  EngineConfig config_;
  std::unique_ptr<BackendQueue> backend_;
  uint64_t bounce_slot_bytes_;
  MappedRegion bounce_;
  std::vector<RequestSlot> requests_;
  std::vector<uint32_t> free_requests_;
  uint32_t free_request_count_ = 0;
  std::vector<uint32_t> issue_queue_;  // ring of request indices with bytes left to issue
  uint32_t issue_head_ = 0;
  uint32_t issue_count_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> finished_;  // ring: (request index, generation)
  uint32_t finished_head_ = 0;
  uint32_t finished_count_ = 0;
  std::vector<PieceSlot> pieces_;
  std::vector<uint32_t> free_pieces_;
  uint32_t free_piece_count_ = 0;
  std::vector<BackendCompletion> completions_;
  uint32_t prepared_unsubmitted_ = 0;
  EngineStats stats_;
};

Status validate(const EngineConfig& config) {
  const uint32_t max_depth = config.backend == Backend::psync ? 256 : 1024;
  if (config.queue_depth < 1 || config.queue_depth > max_depth)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("queue depth {} is out of range for the {} engine; accepted: 1 to {}",
                                  config.queue_depth, backend_name(config.backend), max_depth));
  if (config.block_size_bytes < 4 * kKiB || config.block_size_bytes > kMaxBlockBytes ||
      config.block_size_bytes % (4 * kKiB) != 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("block size {} is not accepted; accepted: a multiple of 4 KiB "
                                  "from 4 KiB to 64 MiB",
                                  config.block_size_bytes));
  if (config.max_requests < 1 || config.max_requests > (1u << kGenerationShift))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("max_requests {} is out of range; accepted: 1 to {}",
                                  config.max_requests, 1u << kGenerationShift));
  return Status();
}

}  // namespace

Result<std::unique_ptr<Engine>> make_engine_over(const EngineConfig& config,
                                                 std::unique_ptr<BackendQueue> backend) {
  STRATA_RETURN_IF_ERROR(validate(config));
  assert(backend != nullptr && backend->capacity() > 0);
  const uint64_t bounce_slot_bytes =
      std::clamp<uint64_t>(align_up(config.block_size_bytes, 4 * kKiB), 4 * kKiB, kMaxBounceSlotBytes);
  MappedRegion bounce(bounce_slot_bytes * backend->capacity());
  if (bounce.data() == nullptr)
    return make_errno_error(errno, "allocate bounce buffers", "",
                            0, bounce_slot_bytes * backend->capacity());
  return std::unique_ptr<Engine>(
      new CoreEngine(config, std::move(backend), bounce_slot_bytes, std::move(bounce)));
}

Result<std::unique_ptr<BackendQueue>> make_backend(const EngineConfig& config) {
  STRATA_RETURN_IF_ERROR(validate(config));
  switch (config.backend) {
    case Backend::uring: return make_uring_backend(config);
    case Backend::aio: return make_aio_backend(config);
    case Backend::psync: return make_psync_backend(config);
  }
  return make_error(ErrorKind::invalid_argument, "unknown backend");
}

Result<std::unique_ptr<Engine>> make_engine(const EngineConfig& config) {
  Result<std::unique_ptr<BackendQueue>> backend = make_backend(config);
  if (!backend.ok()) return backend.error();
  return make_engine_over(config, std::move(backend).value());
}

std::vector<Backend> available_backends() {
  std::vector<Backend> out;
  for (Backend backend : {Backend::uring, Backend::aio, Backend::psync}) {
    EngineConfig probe;
    probe.backend = backend;
    probe.queue_depth = 2;
    if (make_backend(probe).ok()) out.push_back(backend);
  }
  return out;
}

}  // namespace strata::io
