// strata/memory/registry.h — what lives where: tensors, tier copies, residency, budgets, pins.
//
// What it owns: a table of tensors (name, dtype, shape, bytes, home tier) and, for each
// tensor and tier (device, host, nvme), the state of that tier's copy, its pin count and
// where it lives in that tier (a `Placement`: the arena offset/pointer the caller gave). It
// does NOT own the bytes: the host arena, the device arena and the store do; the registry
// keeps the books and the rules so a tier never holds more than its budget.
//
// The residency state machine of one tier copy (DESIGN.md "Residency"):
//
//     absent ──begin_load──▶ loading ──finish_load(ok)──▶ clean ──mark_dirty──▶ dirty
//        ▲                      │ finish_load(failed)       ▲                     │
//        │◀─────────────────────┘                          │              begin_write
//        │◀──evict (clean, unpinned, not home)── clean     └──finish_write(ok)── writing
//     absent ──create_resident──▶ clean | dirty            (finish_write(failed) → dirty)
//
// "dirty" means newer than the home copy; "writing" means being written back to the home
// tier (the copy stays readable and pinnable while it is written). The home copy itself is
// never evicted, and only one tier copy may be dirty at a time.
//
// Budgets: every transition that makes bytes resident (begin_load, create_resident, add with
// a resident home copy) charges the tier and returns `no_space` — changing nothing — when the
// tier's budget would be exceeded. The caller then evicts, waits (a counted stall) or fails;
// the registry never over-commits. Bytes are returned when a copy becomes absent.
//
// Pins: `pin` / `unpin` count users (a kernel, a copy) of a resident copy. A pinned copy is
// never evicted: evicting one is a programmer error and asserts; `is_evictable` says false.
// Transitions that violate the machine (finish_load of a copy that is not loading...) also
// assert: they are bugs in the scheduler, not operating errors.
//
// Moves: the registry does no I/O. `NvmeHostMover` below drives NVMe ↔ host moves through the
// store and the host arena and returns handles to wait on; host ↔ device moves are driven by
// the scheduler with the device's copy engine calling the same begin_/finish_ transitions.
//
// Threads: every Registry method takes an internal mutex — the scheduler thread and copy /
// I/O completion threads may call it concurrently. NvmeHostMover belongs to the store's thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "memory/host_arena.h"
#include "memory/store.h"

namespace strata::memory {

enum class Tier : uint8_t { device = 0, host = 1, nvme = 2 };
inline constexpr size_t kTierCount = 3;
const char* tier_name(Tier tier);
[[nodiscard]] Result<Tier> parse_tier(std::string_view name);  // "device" | "host" | "nvme"

enum class Residency : uint8_t { absent, loading, clean, dirty, writing };
const char* residency_name(Residency residency);
// clean, dirty or writing: the bytes are there and may be read.
constexpr bool is_resident(Residency r) {
  return r == Residency::clean || r == Residency::dirty || r == Residency::writing;
}

using TensorId = uint32_t;

struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  Tier home = Tier::nvme;
  uint64_t size_bytes() const;  // product of shape × dtype size
};

// Where a tier copy lives: an arena block (host: pointer and offset; device: arena offset and
// device pointer). NVMe copies live in the store and leave it empty.
struct Placement {
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  void* data = nullptr;
};

struct TierCopy {
  Residency state = Residency::absent;
  uint32_t pins = 0;
  Placement placement;
};

struct TierUsage {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;      // loading + resident copies
  uint64_t peak_used_bytes = 0;
  uint64_t refused_count = 0;   // no_space results (each one a wait or an eviction upstream)
};

class Registry {
 public:
  // Hard byte budgets, indexed by Tier.
  explicit Registry(const std::array<uint64_t, kTierCount>& budget_bytes);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a tensor. `home_state` is absent (to be created or loaded) or clean (already
  // there, e.g. found in the store), which charges the home tier. `invalid_argument` for a
  // duplicate name or an empty shape; `no_space` when the home budget cannot hold it.
  [[nodiscard]] Result<TensorId> add(TensorSpec spec, Residency home_state,
                                     Placement home_placement = {});
  std::optional<TensorId> find(std::string_view name) const;
  size_t tensor_count() const;
  TensorSpec spec(TensorId id) const;
  TierCopy copy(TensorId id, Tier tier) const;

  // absent → loading; charges the tier. `no_space` (nothing changes) over budget.
  [[nodiscard]] Status begin_load(TensorId id, Tier tier, Placement placement);
  // loading → clean, or → absent (bytes returned) when the load failed.
  void finish_load(TensorId id, Tier tier, bool succeeded);
  // absent → clean or dirty without a load (a freshly initialized copy); charges the tier.
  [[nodiscard]] Status create_resident(TensorId id, Tier tier, Placement placement, bool dirty);
  // clean | dirty → dirty. Asserts no other tier copy is dirty or being written.
  void mark_dirty(TensorId id, Tier tier);
  // dirty → writing (being written back to the home tier).
  void begin_write(TensorId id, Tier tier);
  // writing → clean, or back → dirty when the write failed.
  void finish_write(TensorId id, Tier tier, bool succeeded);

  // clean, unpinned and not the home copy.
  bool is_evictable(TensorId id, Tier tier) const;
  // resident → absent; returns the placement so the caller frees the bytes. Asserts
  // is_evictable: a pinned, dirty, in-flight or home copy is never evicted.
  Placement evict(TensorId id, Tier tier);

  // Counts a user of a resident copy (clean, dirty or writing); asserts it is resident.
  void pin(TensorId id, Tier tier);
  void unpin(TensorId id, Tier tier);  // asserts pins > 0

  TierUsage usage(Tier tier) const;

 private:
  struct Entry {
    TensorSpec spec;
    uint64_t size_bytes = 0;
    std::array<TierCopy, kTierCount> copies;
  };
  Status charge_locked(Tier tier, uint64_t size_bytes);
  void release_locked(Tier tier, uint64_t size_bytes);
  Entry& entry_locked(TensorId id);
  const Entry& entry_locked(TensorId id) const;

  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, TensorId> by_name_;
  std::array<TierUsage, kTierCount> usage_{};
};

// Drives NVMe ↔ host moves of tensors whose home is NVMe: a host block from the arena, a
// store read or write, and the registry transitions around them. The registry, store and
// arena must outlive it. One thread (the store's) calls it. Write-backs stage a new version
// in the store; making it durable is the caller's `Store::commit`.
struct MoveHandle {
  uint64_t value = 0;
};

class NvmeHostMover {
 public:
  NvmeHostMover(Registry& registry, Store& store, HostArena& arena);
  NvmeHostMover(const NvmeHostMover&) = delete;
  NvmeHostMover& operator=(const NvmeHostMover&) = delete;

  // host: absent → loading, a block allocated, the store read submitted. `no_space` when the
  // host budget or the arena cannot hold it (nothing changes).
  [[nodiscard]] Result<MoveHandle> load_to_host(TensorId id);
  // host: dirty → writing, the store write of the host copy submitted.
  [[nodiscard]] Result<MoveHandle> write_back(TensorId id);
  // Completes a move: loading → clean (or → absent, block freed, on error); writing → clean
  // (or → dirty on error). Returns the I/O or checksum error.
  [[nodiscard]] Status wait(MoveHandle handle);
  // Evicts the host copy (asserts it is evictable) and frees its block.
  void evict_host(TensorId id);

 private:
  struct Pending {
    TensorId id = 0;
    bool is_load = true;
    StoreTicket ticket;
    HostBlock block;
  };
  Registry& registry_;
  Store& store_;
  HostArena& arena_;
  uint64_t next_handle_ = 1;
  std::unordered_map<uint64_t, Pending> pending_;
};

}  // namespace strata::memory
