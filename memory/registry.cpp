// strata/memory/registry.cpp — residency state machine, budgets, pins; the NVMe ↔ host mover.
#include "memory/registry.h"

#include <cassert>
#include <utility>

#include "common/size.h"

namespace strata::memory {

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

Result<Tier> parse_tier(std::string_view name) {
  if (name == "device") return Tier::device;
  if (name == "host") return Tier::host;
  if (name == "nvme") return Tier::nvme;
  return make_error(ErrorKind::invalid_argument,
                    "unknown tier '" + std::string(name) + "'; use device, host or nvme");
}

const char* residency_name(Residency residency) {
  switch (residency) {
    case Residency::absent: return "absent";
    case Residency::loading: return "loading";
    case Residency::clean: return "clean";
    case Residency::dirty: return "dirty";
    case Residency::writing: return "writing";
  }
  return "?";
}

uint64_t TensorSpec::size_bytes() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count * dtype_size_bytes(dtype);
}

namespace {
size_t index_of(Tier tier) { return static_cast<size_t>(tier); }
}  // namespace

Registry::Registry(const std::array<uint64_t, kTierCount>& budget_bytes) {
  for (size_t i = 0; i < kTierCount; ++i) usage_[i].budget_bytes = budget_bytes[i];
}

Registry::Entry& Registry::entry_locked(TensorId id) {
  assert(id < entries_.size() && "unknown tensor id");
  return entries_[id];
}
const Registry::Entry& Registry::entry_locked(TensorId id) const {
  assert(id < entries_.size() && "unknown tensor id");
  return entries_[id];
}

Status Registry::charge_locked(Tier tier, uint64_t size_bytes) {
  TierUsage& usage = usage_[index_of(tier)];
  if (size_bytes > usage.budget_bytes - usage.used_bytes) {
    ++usage.refused_count;
    return make_error(ErrorKind::no_space,
                      std::string(tier_name(tier)) + " tier budget: " + format_size(size_bytes) +
                          " asked, " + format_size(usage.budget_bytes - usage.used_bytes) + " of " +
                          format_size(usage.budget_bytes) + " free");
  }
  usage.used_bytes += size_bytes;
  if (usage.used_bytes > usage.peak_used_bytes) usage.peak_used_bytes = usage.used_bytes;
  return Status();
}

void Registry::release_locked(Tier tier, uint64_t size_bytes) {
  TierUsage& usage = usage_[index_of(tier)];
  assert(usage.used_bytes >= size_bytes);
  usage.used_bytes -= size_bytes;
}

Result<TensorId> Registry::add(TensorSpec spec, Residency home_state, Placement home_placement) {
  assert(home_state == Residency::absent || home_state == Residency::clean);
  std::lock_guard lock(mutex_);
  if (spec.name.empty() || spec.shape.empty()) {
    return make_error(ErrorKind::invalid_argument, "a tensor needs a name and a shape");
  }
  for (int64_t dim : spec.shape) {
    if (dim <= 0) {
      return make_error(ErrorKind::invalid_argument, "tensor '" + spec.name + "' has a dimension ≤ 0");
    }
  }
  if (by_name_.count(spec.name) != 0) {
    return make_error(ErrorKind::invalid_argument, "tensor '" + spec.name + "' is registered twice");
  }
  Entry entry;
  entry.size_bytes = spec.size_bytes();
  if (home_state == Residency::clean) {
    Status charged = charge_locked(spec.home, entry.size_bytes);
    if (!charged.ok()) {
      Error error = charged.error();
      error.tensor = spec.name;
      return error;
    }
    TierCopy& home = entry.copies[index_of(spec.home)];
    home.state = Residency::clean;
    home.placement = home_placement;
  }
  entry.spec = std::move(spec);
  const auto id = static_cast<TensorId>(entries_.size());
  by_name_.emplace(entry.spec.name, id);
  entries_.push_back(std::move(entry));
  return id;
}

std::optional<TensorId> Registry::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

size_t Registry::tensor_count() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

TensorSpec Registry::spec(TensorId id) const {
  std::lock_guard lock(mutex_);
  return entry_locked(id).spec;
}

TierCopy Registry::copy(TensorId id, Tier tier) const {
  std::lock_guard lock(mutex_);
  return entry_locked(id).copies[index_of(tier)];
}

Status Registry::begin_load(TensorId id, Tier tier, Placement placement) {
  std::lock_guard lock(mutex_);
  Entry& entry = entry_locked(id);
  TierCopy& copy = entry.copies[index_of(tier)];
  assert(copy.state == Residency::absent && "begin_load of a copy that is not absent");
  Status charged = charge_locked(tier, entry.size_bytes);
  if (!charged.ok()) {
    charged.error().tensor = entry.spec.name;
    return charged;
  }
  copy.state = Residency::loading;
  copy.placement = placement;
  return Status();
}

void Registry::finish_load(TensorId id, Tier tier, bool succeeded) {
  std::lock_guard lock(mutex_);
  Entry& entry = entry_locked(id);
  TierCopy& copy = entry.copies[index_of(tier)];
  assert(copy.state == Residency::loading && "finish_load of a copy that is not loading");
  assert(copy.pins == 0);
  if (succeeded) {
    copy.state = Residency::clean;
  } else {
    copy.state = Residency::absent;
    copy.placement = Placement{};
    release_locked(tier, entry.size_bytes);
  }
}

Status Registry::create_resident(TensorId id, Tier tier, Placement placement, bool dirty) {
  std::lock_guard lock(mutex_);
  Entry& entry = entry_locked(id);
  TierCopy& copy = entry.copies[index_of(tier)];
  assert(copy.state == Residency::absent && "create_resident of a copy that is not absent");
  if (dirty) {
    for (size_t i = 0; i < kTierCount; ++i) {
      assert(entry.copies[i].state != Residency::dirty && entry.copies[i].state != Residency::writing &&
             "a second dirty copy of one tensor");
    }
  }
  Status charged = charge_locked(tier, entry.size_bytes);
  if (!charged.ok()) {
    charged.error().tensor = entry.spec.name;
    return charged;
  }
  copy.state = dirty ? Residency::dirty : Residency::clean;
  copy.placement = placement;
  return Status();
}

void Registry::mark_dirty(TensorId id, Tier tier) {
  std::lock_guard lock(mutex_);
  Entry& entry = entry_locked(id);
  TierCopy& copy = entry.copies[index_of(tier)];
  assert((copy.state == Residency::clean || copy.state == Residency::dirty) &&
         "mark_dirty of a copy that is absent, loading or being written");
  for (size_t i = 0; i < kTierCount; ++i) {
    if (i == index_of(tier)) continue;
    assert(entry.copies[i].state != Residency::dirty && entry.copies[i].state != Residency::writing &&
           "a second dirty copy of one tensor");
  }
  copy.state = Residency::dirty;
}

void Registry::begin_write(TensorId id, Tier tier) {
  std::lock_guard lock(mutex_);
  TierCopy& copy = entry_locked(id).copies[index_of(tier)];
  assert(copy.state == Residency::dirty && "begin_write of a copy that is not dirty");
  copy.state = Residency::writing;
}

void Registry::finish_write(TensorId id, Tier tier, bool succeeded) {
  std::lock_guard lock(mutex_);
  TierCopy& copy = entry_locked(id).copies[index_of(tier)];
  assert(copy.state == Residency::writing && "finish_write of a copy that is not being written");
  copy.state = succeeded ? Residency::clean : Residency::dirty;
}

bool Registry::is_evictable(TensorId id, Tier tier) const {
  std::lock_guard lock(mutex_);
  const Entry& entry = entry_locked(id);
  const TierCopy& copy = entry.copies[index_of(tier)];
  return copy.state == Residency::clean && copy.pins == 0 && tier != entry.spec.home;
}

Placement Registry::evict(TensorId id, Tier tier) {
  std::lock_guard lock(mutex_);
  Entry& entry = entry_locked(id);
  TierCopy& copy = entry.copies[index_of(tier)];
  // The scheduler chooses victims with is_evictable; reaching here otherwise is its bug,
  // and going on would drop bytes a kernel or a copy is using (or the only good copy).
  assert(copy.pins == 0 && "evicting a pinned tensor");
  assert(copy.state == Residency::clean && "evicting a copy that is not clean");
  assert(tier != entry.spec.home && "evicting the home copy");
  const Placement placement = copy.placement;
  copy.state = Residency::absent;
  copy.placement = Placement{};
  release_locked(tier, entry.size_bytes);
  return placement;
}

void Registry::pin(TensorId id, Tier tier) {
  std::lock_guard lock(mutex_);
  TierCopy& copy = entry_locked(id).copies[index_of(tier)];
  assert(is_resident(copy.state) && "pinning a copy that is not resident");
  ++copy.pins;
}

void Registry::unpin(TensorId id, Tier tier) {
  std::lock_guard lock(mutex_);
  TierCopy& copy = entry_locked(id).copies[index_of(tier)];
  assert(copy.pins > 0 && "unpin without a pin");
  --copy.pins;
}

TierUsage Registry::usage(Tier tier) const {
  std::lock_guard lock(mutex_);
  return usage_[index_of(tier)];
}

// --- NvmeHostMover ---------------------------------------------------------------------------

NvmeHostMover::NvmeHostMover(Registry& registry, Store& store, HostArena& arena)
    : registry_(registry), store_(store), arena_(arena) {}

Result<MoveHandle> NvmeHostMover::load_to_host(TensorId id) {
  const TensorSpec spec = registry_.spec(id);
  assert(spec.home == Tier::nvme && "NvmeHostMover moves tensors whose home is NVMe");
  const uint64_t size_bytes = spec.size_bytes();
  // Two limits apply: the arena's real space (which may be fragmented even when the budget
  // allows) and the registry's hard host budget. The block is taken first so the registry
  // can record where the copy lives; either refusal leaves nothing changed.
  STRATA_ASSIGN_OR_RETURN(HostBlock block, arena_.allocate(size_bytes));
  Status begun = registry_.begin_load(id, Tier::host, Placement{block.offset_bytes, block.size_bytes, block.data});
  if (!begun.ok()) {
    arena_.free(block);
    return begun.error();
  }
  Result<StoreTicket> ticket = store_.read_tensor_async(spec.name, block.data, block.size_bytes);
  if (!ticket.ok()) {
    registry_.finish_load(id, Tier::host, false);
    arena_.free(block);
    return ticket.error();
  }
  const uint64_t handle = next_handle_++;
  pending_.emplace(handle, Pending{id, true, *ticket, block});
  return MoveHandle{handle};
}

Result<MoveHandle> NvmeHostMover::write_back(TensorId id) {
  const TensorSpec spec = registry_.spec(id);
  assert(spec.home == Tier::nvme);
  const TierCopy host = registry_.copy(id, Tier::host);
  assert(host.state == Residency::dirty && "write_back of a host copy that is not dirty");
  registry_.begin_write(id, Tier::host);
  Result<StoreTicket> ticket =
      store_.write_tensor_async(spec.name, spec.dtype, spec.shape, host.placement.data, spec.size_bytes());
  if (!ticket.ok()) {
    registry_.finish_write(id, Tier::host, false);
    return ticket.error();
  }
  const uint64_t handle = next_handle_++;
  HostBlock block{host.placement.offset_bytes, host.placement.size_bytes,
                  static_cast<std::byte*>(host.placement.data)};
  pending_.emplace(handle, Pending{id, false, *ticket, block});
  return MoveHandle{handle};
}

Status NvmeHostMover::wait(MoveHandle handle) {
  auto it = pending_.find(handle.value);
  assert(it != pending_.end() && "wait on an unknown or already waited move");
  const Pending pending = it->second;
  pending_.erase(it);
  Status status = store_.wait(pending.ticket);
  if (pending.is_load) {
    registry_.finish_load(pending.id, Tier::host, status.ok());
    if (!status.ok()) arena_.free(pending.block);
  } else {
    registry_.finish_write(pending.id, Tier::host, status.ok());
  }
  return status;
}

void NvmeHostMover::evict_host(TensorId id) {
  const Placement placement = registry_.evict(id, Tier::host);
  arena_.free(HostBlock{placement.offset_bytes, placement.size_bytes, static_cast<std::byte*>(placement.data)});
}

}  // namespace strata::memory
