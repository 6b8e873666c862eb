// strata/io/fault_engine.cpp — the fault layer: a BackendQueue that wraps a real one and
// alters piece results as io/fault_engine.h describes.
#include "io/fault_engine.h"

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "io/backend.h"

namespace strata::io {
namespace {

class FaultBackend final : public BackendQueue {
 public:
  FaultBackend(std::unique_ptr<BackendQueue> inner, std::shared_ptr<FaultPlan> plan)
      : inner_(std::move(inner)),
        plan_(std::move(plan)),
        slots_(inner_->capacity()),
        free_slots_(inner_->capacity()),
        injected_(inner_->capacity()),
        inner_completions_(inner_->capacity()) {
    for (uint32_t i = 0; i < inner_->capacity(); ++i) free_slots_[i] = inner_->capacity() - 1 - i;
    free_count_ = inner_->capacity();
  }

  Backend kind() const override { return inner_->kind(); }
  uint32_t capacity() const override { return inner_->capacity(); }
  Status register_buffer(void* base, uint64_t length_bytes) override {
    return inner_->register_buffer(base, length_bytes);
  }

  Status prepare(const BackendPiece& piece) override {
    // Decide this piece's fate up front; a synthesized failure never reaches the disk.
    int64_t injected_result = 0;
    bool inject = false;
    plan_->with_state([&](const FaultRules& rules, FaultCounters& counters) {
      ++pieces_seen_;
      if (rules.eio && (piece.op == Op::read ? rules.eio->on_reads : rules.eio->on_writes) &&
          rules.eio->file_offset_bytes >= piece.file_offset_bytes &&
          rules.eio->file_offset_bytes < piece.file_offset_bytes + piece.length_bytes &&
          piece.file->path().find(rules.eio->path_contains) != std::string::npos) {
        inject = true;
        injected_result = -(rules.eio->errno_value != 0 ? rules.eio->errno_value : EIO);
        ++counters.eio_injected;
      } else if (rules.eagain_every_n_pieces != 0 && pieces_seen_ % rules.eagain_every_n_pieces == 0) {
        inject = true;
        injected_result = -EAGAIN;
        ++counters.eagain_injected;
      } else if (piece.op == Op::write && rules.write_budget_bytes &&
                 counters.bytes_written >= *rules.write_budget_bytes) {
        inject = true;
        injected_result = -ENOSPC;
        ++counters.enospc_injected;
      }
    });
    if (inject) {
      injected_[injected_count_++] = BackendCompletion{piece.tag, injected_result};
      return Status();
    }
    const uint32_t slot = free_slots_[--free_count_];
    slots_[slot] = piece;
    BackendPiece inner_piece = piece;
    inner_piece.tag = slot;
    Status status = inner_->prepare(inner_piece);
    if (!status.ok()) free_slots_[free_count_++] = slot;
    return status;
  }

  Result<uint32_t> submit_and_reap(BackendCompletion* completions, uint32_t max_completions,
                                   uint32_t min_completions) override {
    uint32_t count = 0;
    // Synthesized completions first: they are already "done".
    while (count < max_completions && injected_count_ > 0) {
      completions[count++] = injected_[0];
      for (uint32_t i = 1; i < injected_count_; ++i) injected_[i - 1] = injected_[i];
      --injected_count_;
    }
    const uint32_t inner_outstanding = inner_->capacity() - free_count_;
    const uint32_t inner_min =
        std::min(min_completions > count ? min_completions - count : 0, inner_outstanding);
    Result<uint32_t> reaped = inner_->submit_and_reap(
        inner_completions_.data(), std::min(max_completions - count, inner_outstanding), inner_min);
    if (!reaped.ok()) return reaped;
    uint32_t delay_us = 0;
    plan_->with_state([&](const FaultRules& rules, FaultCounters& counters) {
      delay_us = rules.delay_us;
      for (uint32_t i = 0; i < *reaped; ++i) {
        const uint32_t slot = static_cast<uint32_t>(inner_completions_[i].tag);
        const BackendPiece& piece = slots_[slot];
        int64_t result = inner_completions_[i].result;
        if (result > 0 && rules.short_transfer_max_bytes != 0 &&
            result > rules.short_transfer_max_bytes) {
          result = rules.short_transfer_max_bytes;
          ++counters.short_transfers_injected;
        }
        if (result > 0 && piece.op == Op::write && rules.write_budget_bytes) {
          const uint64_t room = *rules.write_budget_bytes > counters.bytes_written
                                    ? *rules.write_budget_bytes - counters.bytes_written
                                    : 0;
          if (static_cast<uint64_t>(result) > room) {
            result = room == 0 ? -ENOSPC : static_cast<int64_t>(room);
            ++counters.enospc_injected;
          }
        }
        if (result > 0 && piece.op == Op::write) counters.bytes_written += result;
        completions[count++] = BackendCompletion{piece.tag, result};
        free_slots_[free_count_++] = slot;
      }
    });
    if (delay_us != 0 && count > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    return count;
  }

  uint64_t submit_calls() const override { return inner_->submit_calls(); }
  uint64_t fixed_buffer_ops() const override { return inner_->fixed_buffer_ops(); }
  std::string describe() const override { return inner_->describe() + ", with injected faults"; }

 private:
  std::unique_ptr<BackendQueue> inner_;
  std::shared_ptr<FaultPlan> plan_;
  std::vector<BackendPiece> slots_;  // what each inner tag stands for
  std::vector<uint32_t> free_slots_;
  uint32_t free_count_ = 0;
  std::vector<BackendCompletion> injected_;  // synthesized, not yet reaped
  uint32_t injected_count_ = 0;
  std::vector<BackendCompletion> inner_completions_;
  uint64_t pieces_seen_ = 0;
};

}  // namespace

Result<std::unique_ptr<Engine>> make_fault_engine(const EngineConfig& config,
                                                 std::shared_ptr<FaultPlan> plan) {
  Result<std::unique_ptr<BackendQueue>> inner = make_backend(config);
  if (!inner.ok()) return inner.error();
  return make_engine_over(config, std::unique_ptr<BackendQueue>(
                                      new FaultBackend(std::move(inner).value(), std::move(plan))));
}

}  // namespace strata::io
