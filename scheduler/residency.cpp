// strata/scheduler/residency.cpp — the books and the decisions (see residency.h). Every rule
// here is the scheduler's policy; the drivers only carry out and time what it decides.
#include "scheduler/residency.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "common/size.h"

namespace strata::scheduler {

Residency::Residency(const AccessPlan& plan, const SchedulerOptions& options, ResidencyMemory& memory,
                     uint64_t alignment_bytes)
    : plan_(plan), options_(options), memory_(memory) {
  books_.resize(plan_.tensors().size());
  seen_epoch_.assign(books_.size(), 0);
  for (auto& victims : victims_by_tier_) victims.reserve(books_.size());
  for (size_t id = 0; id < books_.size(); ++id) {
    books_[id].home = plan_.tensors()[id].home;
    books_[id].aligned_bytes = align_up(plan_.tensors()[id].size_bytes, alignment_bytes);
    if (books_[id].home == Home::host) host_home_bytes_ += books_[id].aligned_bytes;
  }
  step_tensors_.resize(n());
  for (size_t step = 0; step < n(); ++step) {
    const PlanStep& spec = plan_.steps()[step];
    for (TensorId id : plan_.step_tensors(step)) {
      const bool reads = std::find(spec.reads.begin(), spec.reads.end(), id) != spec.reads.end();
      const bool writes = std::find(spec.writes.begin(), spec.writes.end(), id) != spec.writes.end();
      step_tensors_[step].push_back(StepTensor{id, reads, writes});
      books_[id].uses.push_back(static_cast<uint32_t>(step));
      books_[id].use_writes.push_back(writes ? 1 : 0);
    }
    // Largest first: the walk allocates in this order, which packs a step's tensors tightly.
    std::stable_sort(step_tensors_[step].begin(), step_tensors_[step].end(),
                     [&](const StepTensor& a, const StepTensor& b) {
                       return plan_.tensors()[a.tensor].size_bytes > plan_.tensors()[b.tensor].size_bytes;
                     });
  }
  external_device_bytes_ = memory_.device_used_bytes();
  uint64_t largest_written_bytes = 0;
  for (const PlanStep& step : plan_.steps())
    for (TensorId id : step.writes)
      if (books_[id].home == Home::nvme) largest_written_bytes = std::max(largest_written_bytes, books_[id].aligned_bytes);
  const uint64_t staging_bytes = options_.host_budget_bytes - std::min(options_.host_budget_bytes, host_home_bytes_);
  // In place a write-back needs no block of its own: the step's block goes to NVMe as it is.
  if (!options_.compute_in_place && 2 * largest_written_bytes <= staging_bytes / 4)
    write_back_reserve_bytes_ = 2 * largest_written_bytes;
  commands_.reserve(2 * static_cast<size_t>(options_.copies_in_flight) + options_.io_queue_tensors);
  choose_resident_subset();
}

// The plan repeats (a training step, a generated token). With a pool smaller than the plan's
// tensors, evicting by next use from *now* keeps only what the next steps use: every tensor
// leaves once per repetition and is read again (generation measured 1.03× the weights read
// per token with 59 % of them fitting). The optimum keeps a fixed subset across repetitions
// and streams the rest; the subset is chosen here once: read-only NVMe-homed tensors (a
// written one has to go down anyway), most uses per repetition first, then in plan order or
// largest first (whichever keeps more), while the subset and the read-ahead ring the streamed
// rest needs fit the host room left by the host-homed tensors and the write-back reserve.
void Residency::choose_resident_subset() {
  std::vector<TensorId> candidates;
  for (size_t id = 0; id < books_.size(); ++id) {
    const Book& book = books_[id];
    if (book.home != Home::nvme || book.uses.empty()) continue;
    if (std::any_of(book.use_writes.begin(), book.use_writes.end(), [](uint8_t w) { return w != 0; })) continue;
    candidates.push_back(static_cast<TensorId>(id));
  }
  if (candidates.empty()) return;
  const uint64_t host_room = options_.host_budget_bytes - std::min(options_.host_budget_bytes, host_home_bytes_);
  const uint64_t room_bytes = host_room - std::min(host_room, write_back_reserve_bytes_);
  // The ring double-buffers the streamed tensors: the step computing and the next one loading
  // must fit at once, so it is the largest streamed bytes of two steps in a row (the plan
  // wraps), each tensor counted once. Sized as twice the largest step instead, one large
  // streamed step (an untied head or embedding) doubled the ring and crowded out the subset.
  auto ring_bytes = [&]() {
    uint64_t largest_bytes = 0;
    std::vector<TensorId> pair;
    for (size_t step = 0; step < n(); ++step) {
      pair.clear();
      for (const size_t s : {step, (step + 1) % n()})
        for (const StepTensor& entry : step_tensors_[s])
          if (books_[entry.tensor].home == Home::nvme && !books_[entry.tensor].keep) pair.push_back(entry.tensor);
      std::sort(pair.begin(), pair.end());
      pair.erase(std::unique(pair.begin(), pair.end()), pair.end());
      uint64_t pair_bytes = 0;
      for (const TensorId id : pair) pair_bytes += books_[id].aligned_bytes;
      largest_bytes = std::max(largest_bytes, pair_bytes);
    }
    return largest_bytes;
  };
  // Greedy in `order`: a candidate joins while the subset and the ring it leaves fit.
  auto fill = [&](const std::vector<TensorId>& order) {
    for (TensorId id : candidates) books_[id].keep = false;
    uint64_t kept_bytes = 0;
    for (TensorId id : order) {
      Book& book = books_[id];
      book.keep = true;
      if (kept_bytes + book.aligned_bytes + ring_bytes() <= room_bytes)
        kept_bytes += book.aligned_bytes;
      else
        book.keep = false;
    }
    return kept_bytes;
  };
  // Two orders, most uses per repetition first in both: then plan order, or then largest
  // first. Keeping a large tensor also shrinks the ring it would stream through — an untied
  // head (49 MB of a 125M Llama's 200 MB of streamed blocks) kept leaves a ring of two blocks,
  // where streaming it needs a ring of head + block.
  auto by_uses_then = [&](auto&& tie_break) {
    std::vector<TensorId> order = candidates;
    std::stable_sort(order.begin(), order.end(), [&](TensorId a, TensorId b) {
      if (books_[a].uses.size() != books_[b].uses.size()) return books_[a].uses.size() > books_[b].uses.size();
      return tie_break(a, b);
    });
    return order;
  };
  const std::vector<TensorId> plan_order =
      by_uses_then([&](TensorId a, TensorId b) { return books_[a].uses.front() < books_[b].uses.front(); });
  const std::vector<TensorId> largest_first =
      by_uses_then([&](TensorId a, TensorId b) { return books_[a].aligned_bytes > books_[b].aligned_bytes; });
  // Each order also spread over the plan: kept as the greedy fill leaves them, the subset is
  // one run of steps, and while they compute the ring is full and the drive idles (the overlap
  // bench's 5 kept layers of 16: ~130 ms of a 500 ms pass with no read). Spread evenly, every
  // kept step sits between streamed ones whose reads go on while it computes. The order keeping
  // the most bytes wins; on a tie a spread one, then plan order.
  const uint64_t plan_order_bytes = fill(plan_order);
  const std::vector<TensorId> plan_spread = spread_order(plan_order);  // reads those keep marks
  const uint64_t largest_first_bytes = fill(largest_first);
  const std::vector<TensorId> largest_spread = spread_order(largest_first);
  const std::pair<const std::vector<TensorId>*, uint64_t> tried[] = {{&plan_spread, fill(plan_spread)},
                                                                     {&largest_spread, fill(largest_spread)},
                                                                     {&plan_order, plan_order_bytes},
                                                                     {&largest_first, largest_first_bytes}};
  const auto* best = &tried[0];
  for (const auto& entry : tried)
    if (entry.second > best->second) best = &entry;
  resident_subset_bytes_ = fill(*best->first);
}

// `order` after a fill of it (reads the `keep` marks): in the use-count class the fill kept only
// in part, the members it kept of each size are swapped for as many of that size spread evenly
// over the plan — K of the M members of one size, by first use, → those at ⌊i·M/K⌋, i < K — and
// go first in the class, the rest after (each part in `order`'s order). Same sizes, same count:
// the fill keeps the same bytes unless the ring it leaves grows. The classes before it are kept
// whole and those after not at all, so they stay as they are.
std::vector<TensorId> Residency::spread_order(const std::vector<TensorId>& order) const {
  std::vector<TensorId> spread = order;
  size_t begin = 0;
  while (begin < spread.size()) {
    size_t end = begin;
    const size_t uses = books_[spread[begin]].uses.size();
    while (end < spread.size() && books_[spread[end]].uses.size() == uses) ++end;
    const auto first = spread.begin() + static_cast<std::ptrdiff_t>(begin);
    const auto last = spread.begin() + static_cast<std::ptrdiff_t>(end);
    const auto kept = static_cast<size_t>(std::count_if(first, last, [&](TensorId id) { return books_[id].keep; }));
    if (kept > 0 && kept < end - begin) {
      std::map<uint64_t, std::vector<TensorId>> by_size;  // members of each size, by first use
      std::map<uint64_t, size_t> kept_of_size;
      for (auto it = first; it != last; ++it) {
        by_size[books_[*it].aligned_bytes].push_back(*it);
        if (books_[*it].keep) ++kept_of_size[books_[*it].aligned_bytes];
      }
      std::vector<bool> chosen(books_.size(), false);
      for (auto& [size_bytes, members] : by_size) {
        std::sort(members.begin(), members.end(),
                  [&](TensorId a, TensorId b) { return books_[a].uses.front() < books_[b].uses.front(); });
        const size_t count = kept_of_size[size_bytes];
        for (size_t i = 0; i < count; ++i) chosen[members[i * members.size() / count]] = true;
      }
      std::stable_partition(first, last, [&](TensorId id) { return chosen[id]; });
      break;
    }
    begin = end;
  }
  return spread;
}

Status Residency::place_host_homed() {
  for (size_t id = 0; id < books_.size(); ++id) {
    Book& book = books_[id];
    if (book.home == Home::nvme) {
      book.nvme_version = 0;
      continue;
    }
    const uint64_t taken = memory_.allocate(Tier::host, static_cast<TensorId>(id), book.aligned_bytes);
    if (taken == 0)
      return make_error(ErrorKind::no_space,
                        fmt::format("host-homed tensor '{}' ({}) does not fit in the pinned host arena",
                                    plan_.tensors()[id].name, format_size(book.aligned_bytes)));
    book.host_allocated = true;
    book.host_bytes = taken;
    book.host_version = 0;
    host_used_bytes_ += taken;
  }
  counters_.host_high_water_bytes = host_used_bytes_;
  return Status();
}

void Residency::free_all_host() {
  for (size_t id = 0; id < books_.size(); ++id)
    if (books_[id].host_allocated) {
      memory_.free(Tier::host, static_cast<TensorId>(id));
      books_[id].host_allocated = false;
      host_used_bytes_ -= books_[id].host_bytes;
    }
}

// --- the rules ---------------------------------------------------------------------------

// Steps from `from_abs` to the next use of the tensor (0: the step at from_abs uses it).
uint64_t Residency::distance(const Book& book, uint64_t from_abs) const {
  // A host-only tensor (PlanTensor::host_only) is used by no step: its next use never comes.
  // Far, but not so far that the ranks' `d += n()` could wrap.
  if (book.uses.empty()) return std::numeric_limits<uint64_t>::max() / 4;
  const uint32_t position = static_cast<uint32_t>(from_abs % n());
  auto it = std::lower_bound(book.uses.begin(), book.uses.end(), position);
  if (it != book.uses.end()) return *it - position;
  return n() - position + book.uses.front();
}

// Whether the next use at or after `from_abs` writes the tensor.
bool Residency::next_use_writes(const Book& book, uint64_t from_abs) const {
  if (book.uses.empty()) return false;  // host-only: no step writes it
  const uint32_t position = static_cast<uint32_t>(from_abs % n());
  auto it = std::lower_bound(book.uses.begin(), book.uses.end(), position);
  const size_t index = it != book.uses.end() ? static_cast<size_t>(it - book.uses.begin()) : 0;
  return book.use_writes[index] != 0;
}

bool Residency::device_current(const Book& book, bool for_read) const {
  // In place the host block is the compute copy; a block still being read from NVMe is not
  // current yet (its host_version moves only when the read completes).
  if (options_.compute_in_place)
    return book.host_allocated && (!for_read || book.host_version == book.version) && book.host_op != HostOp::reading;
  return book.device_allocated && book.device_version == book.version && book.device_op != DeviceOp::loading &&
         !(for_read && book.device_placeholder);
}

bool Residency::device_dirty(const Book& book) const {
  if (options_.compute_in_place) return false;  // there is no device copy
  if (!book.device_allocated || book.device_placeholder || book.device_op == DeviceOp::loading) return false;
  int64_t below = book.host_version;
  if (book.home == Home::nvme) below = std::max(below, book.nvme_version);
  return book.device_version > below;
}

// Dropping the device copy loses nothing.
bool Residency::device_droppable(const Book& book) const {
  if (book.device_placeholder) return true;
  if (book.host_version >= book.device_version) return true;
  return book.home == Home::nvme && book.nvme_version >= book.device_version;
}

bool Residency::host_droppable(const Book& book) const {
  if (book.home != Home::nvme) return false;  // the home copy stays
  if (book.host_version < book.version) return true;  // stale: the device holds newer
  if (book.nvme_version >= book.host_version) return true;
  return book.device_allocated && !book.device_placeholder && book.device_version >= book.host_version;
}

void Residency::note_allocation(Tier tier, uint64_t used_bytes, uint64_t budget_bytes) {
  if (tier == Tier::device)
    counters_.device_high_water_bytes = std::max(counters_.device_high_water_bytes, used_bytes);
  else
    counters_.host_high_water_bytes = std::max(counters_.host_high_water_bytes, used_bytes);
  if (options_.on_allocate) options_.on_allocate(tier, used_bytes, budget_bytes);
}

// Candidates for eviction from one tier, furthest next use first (Belady): copies used
// after `need_distance`. When the need is the cursor step itself, the step's own idle copies
// rank last behind them: the arenas do not move live buffers, and a step's data can be
// stuck behind a dirty copy that needs staging space to leave — dropping (and reloading) a
// copy the step needs is then the only way forward, so the cursor step always completes.
void Residency::rank_victims(Tier tier, TensorId id, uint64_t need_distance) {
  auto& victims = victims_by_tier_[static_cast<size_t>(tier)];
  victims.clear();
  for (size_t other = 0; other < books_.size(); ++other) {
    const Book& c = books_[other];
    if (other == id) continue;
    uint64_t d = distance(c, cursor_abs_);
    if (tier == Tier::device) {
      if (!c.device_allocated || c.pins > 0 || c.device_op != DeviceOp::none) continue;
    } else {
      if (!c.host_allocated || c.home != Home::nvme || c.host_op != HostOp::none) continue;
      if (options_.compute_in_place && c.pins > 0) continue;  // a held step computes on it
      // A copy on its way to NVMe (written back from the device, its write not yet issued)
      // stays until that write is done: dropping it because the device still holds the same
      // version only means copying it down again — at small host budgets that churned ~15×
      // the state through device → host per step. Its write frees it soon enough.
      if (c.host_version > c.nvme_version) continue;
      // A kept copy is never read-ahead's victim: read-ahead waits for the ring instead.
      if (c.keep && need_distance > 0) continue;
      // A host copy whose tensor is already on the device is not needed for its next use:
      // it ranks behind every copy that is — unless that use writes the tensor. Then its
      // write-back needs a host block at that very use, and giving this one away first
      // would take one from a copy prefetched for a later step (which is then read twice):
      // it ranks by its next use like any other copy.
      if (!options_.compute_in_place && device_current(c, true) &&
          !(c.home == Home::nvme && next_use_writes(c, cursor_abs_)))
        d += n();
    }
    // In place the cursor step's own blocks are never victims for it (see compact_for_cursor_step).
    // While a held step pins space, its release is the way forward: the cursor step then drops
    // its own copies at most once each per acquire. Without that bound its copies displaced
    // each other for as long as the step was held — one reload per copy time (the replay of a
    // 4-layer plan under 512 KiB moved 4× the real host→device bytes through it).
    const bool own_as_last_resort = need_distance == 0 && d == 0 && !options_.compute_in_place &&
                                    (pinned_tensors_ == 0 || own_evictions_at_cursor_ < step_tensors_[next_step()].size());
    if (d > need_distance || own_as_last_resort) victims.emplace_back(d, static_cast<TensorId>(other));
  }
  // The cursor step takes kept copies only after every other (it always completes).
  std::stable_sort(victims.begin(), victims.end(), [&](const auto& a, const auto& b) {
    const bool a_kept = tier == Tier::host && books_[a.second].keep;
    const bool b_kept = tier == Tier::host && books_[b.second].keep;
    if (a_kept != b_kept) return b_kept;
    return a.first > b.first;
  });
}

// Gives `id` space in `tier`, evicting in Belady order. Evicts nothing unless the free space
// plus the droppable victims ahead of the first one still holding the only copy of its data
// add up to the need (so a failed attempt does not throw away prefetched data). When that
// first victim is dirty, its write-back is started at the priority of this need. False:
// nothing more can go now; the driver runs a pass again at the next completion.
bool Residency::allocate_in(Tier tier, TensorId id, uint64_t need_distance, bool write_back) {
  Book& book = books_[id];
  const bool on_device = tier == Tier::device;
  // Read-ahead stays out of the write-back reserve; write-backs and the cursor step's own
  // reads may use the whole budget.
  const uint64_t host_budget_bytes =
      options_.host_budget_bytes - (write_back || need_distance == 0 ? 0 : write_back_reserve_bytes_);
  auto try_allocate = [&]() -> bool {
    if (on_device) {
      if (memory_.allocate(Tier::device, id, book.aligned_bytes) == 0) return false;
      book.device_allocated = true;
      note_allocation(Tier::device, memory_.device_used_bytes(), memory_.device_budget_bytes());
      return true;
    }
    if (host_used_bytes_ + book.aligned_bytes > host_budget_bytes) return false;
    const uint64_t taken = memory_.allocate(Tier::host, id, book.aligned_bytes);
    if (taken == 0) return false;
    book.host_allocated = true;
    book.host_bytes = taken;
    host_used_bytes_ += taken;
    note_allocation(Tier::host, host_used_bytes_, options_.host_budget_bytes);
    return true;
  };
  if (try_allocate()) return true;
  rank_victims(tier, id, need_distance);
  // Per tier: a device allocation may start a write-back that ranks host victims meanwhile.
  auto& victims = victims_by_tier_[static_cast<size_t>(tier)];
  const uint64_t used_bytes = on_device ? memory_.device_used_bytes() : host_used_bytes_;
  const uint64_t budget_bytes = on_device ? memory_.device_budget_bytes() : host_budget_bytes;
  uint64_t reachable_bytes = budget_bytes - std::min(budget_bytes, used_bytes);
  size_t droppable_count = 0;
  int64_t blocker = -1;  // the first victim whose data lives only here
  for (const auto& [d, victim] : victims) {
    const Book& v = books_[victim];
    if (!(on_device ? device_droppable(v) : host_droppable(v))) {
      blocker = victim;
      break;
    }
    reachable_bytes += on_device ? v.aligned_bytes : v.host_bytes;
    ++droppable_count;
  }
  if (reachable_bytes >= book.aligned_bytes) {
    for (size_t i = 0; i < droppable_count; ++i) {
      evict(tier, victims[i].second);
      if (try_allocate()) return true;
    }
  }
  // The dirty copy stands in the way: start its write-back at the priority of this need.
  if (on_device && blocker >= 0) start_write_back(static_cast<TensorId>(blocker), need_distance);
  return false;
}

void Residency::evict(Tier tier, TensorId victim) {
  Book& out = books_[victim];
  memory_.free(tier, victim);
  if (tier == Tier::device) {
    if (distance(out, cursor_abs_) == 0) ++own_evictions_at_cursor_;
    out.device_allocated = false;
    out.device_version = kNoVersion;
    out.device_placeholder = false;
    ++counters_.device_evictions;
  } else {
    host_used_bytes_ -= out.host_bytes;
    out.host_allocated = false;
    out.host_bytes = 0;
    out.host_version = kNoVersion;
    ++counters_.host_evictions;
  }
  if (options_.record_evictions) eviction_log_.push_back(Eviction{tier, victim, cursor_abs_});
}

// Device → host copy of a dirty tensor, its host block taken at the priority `need_distance`.
void Residency::start_write_back(TensorId id, uint64_t need_distance) {
  Book& book = books_[id];
  if (!device_dirty(book) || book.device_op != DeviceOp::none || book.write_pins > 0 ||
      d2h_in_flight_ >= options_.copies_in_flight)
    return;
  if (book.host_allocated && book.host_op != HostOp::none) return;  // e.g. an older version going to NVMe
  if (!book.host_allocated && !allocate_in(Tier::host, id, need_distance, /*write_back=*/true)) return;
  issue(CommandKind::d2h, id);
}

void Residency::issue(CommandKind kind, TensorId id) {
  Book& book = books_[id];
  int64_t version = 0;
  switch (kind) {
    case CommandKind::h2d:
      book.device_op = DeviceOp::loading;
      book.host_op = HostOp::h2d_source;
      ++h2d_in_flight_;
      version = book.host_version;
      break;
    case CommandKind::d2h:
      book.device_op = DeviceOp::saving;
      book.host_op = HostOp::d2h_target;
      ++d2h_in_flight_;
      version = book.device_version;
      break;
    case CommandKind::nvme_read:
      book.host_op = HostOp::reading;
      ++io_in_flight_;
      version = book.nvme_version;
      break;
    case CommandKind::nvme_write:
      book.host_op = HostOp::writing;
      ++io_in_flight_;
      version = book.host_version;
      break;
  }
  commands_.push_back(ResidencyCommand{kind, id, version});
}

// --- a pass --------------------------------------------------------------------------------

// Eager write-back: dirty device copies go down as soon as their step lets go of them (host
// space taken only from copies used later than the tensor itself), dirty host copies of
// NVMe-homed tensors go to NVMe.
void Residency::write_back() {
  for (size_t i = 0; i < books_.size(); ++i) {
    const TensorId id = static_cast<TensorId>(i);
    Book& book = books_[i];
    // A copy the very next step rewrites does not go down yet: that version would be superseded
    // before anything read it. (The update of a unit cut into optimizer chunks rewrites the
    // unit's P once per chunk: sent down after each, P crossed PCIe and reached NVMe once per
    // chunk, and in place each chunk's step waited for the write of the one before.) It goes
    // down after its last rewrite — its next use is then further away — or when flushing. It is
    // never a victim meanwhile: its next use is the nearest there is.
    if (!flushing_ && distance(book, cursor_abs_) == 0 && next_use_writes(book, cursor_abs_)) continue;
    // While flushing, write-backs are the only need, so they may take any idle host block.
    if (device_dirty(book)) start_write_back(id, flushing_ ? 0 : distance(book, cursor_abs_));
    // In place, a block a held step may still be writing waits for the release.
    if (book.home == Home::nvme && book.host_allocated && book.host_op == HostOp::none &&
        book.host_version > book.nvme_version && io_in_flight_ < options_.io_queue_tensors &&
        !(options_.compute_in_place && book.write_pins > 0))
      issue(CommandKind::nvme_write, id);
  }
}

void Residency::prefetch() {
  const uint64_t device_budget = memory_.device_budget_bytes();
  const uint64_t device_room = device_budget - std::min(device_budget, external_device_bytes_);
  const uint64_t device_limit =
      options_.device_lookahead_bytes ? std::min(options_.device_lookahead_bytes, device_room) : device_room;
  const uint64_t host_room = options_.host_budget_bytes - host_home_bytes_;
  const uint64_t host_limit =
      options_.host_lookahead_bytes ? std::min(options_.host_lookahead_bytes, host_room) : host_room;
  uint64_t device_horizon_bytes = 0, host_horizon_bytes = 0;
  bool device_blocked = false, host_blocked = false;
  ++epoch_;
  for (uint64_t k = cursor_abs_; k < cursor_abs_ + n() && !(device_blocked && host_blocked); ++k) {
    const uint64_t d = k - cursor_abs_;
    for (const StepTensor& entry : step_tensors_[k % n()]) {
      if (seen_epoch_[entry.tensor] == epoch_) continue;
      seen_epoch_[entry.tensor] = epoch_;
      Book& book = books_[entry.tensor];
      device_horizon_bytes += book.aligned_bytes;
      if (device_horizon_bytes > device_limit && d > 0) device_blocked = true;
      if (book.read_error) continue;  // reported by acquire; never retried behind its back
      if (device_current(book, entry.reads) || book.device_op == DeviceOp::loading) continue;
      if (!entry.reads) {
        // Fully overwritten by its step: space, no load.
        if (book.device_allocated) {
          // Allocated but not current: a copy the caller made stale (end_host_access bumps
          // the version past a placeholder or loaded copy, e.g. a host-homed tensor filled
          // right after create, while the pump's first pass had already placed it). Its
          // space is all the step needs, so it becomes a placeholder at the current version.
          // Skipped as "allocated", it was never current again and nothing else would touch
          // it: the step's acquire waited for ever (the random-plans test's seed 34 stall).
          // The pump wakes the waiter after the pass.
          if (book.device_op == DeviceOp::none) {
            book.device_version = book.version;
            book.device_placeholder = true;
          }
          continue;
        }
        if (device_blocked) continue;
        if (allocate_in(Tier::device, entry.tensor, d)) {
          book.device_version = book.version;
          book.device_placeholder = true;
        } else {
          device_blocked = true;
        }
        continue;
      }
      const bool host_current = book.host_allocated && book.host_version == book.version;
      if (host_current) {
        if (device_blocked || book.host_op != HostOp::none || h2d_in_flight_ >= options_.copies_in_flight) continue;
        if (book.device_allocated || allocate_in(Tier::device, entry.tensor, d))
          issue(CommandKind::h2d, entry.tensor);
        else
          device_blocked = true;
        continue;
      }
      if (book.home != Home::nvme || book.host_op != HostOp::none) continue;  // in flight
      host_horizon_bytes += book.aligned_bytes;
      if (host_horizon_bytes > host_limit && d > 0) host_blocked = true;
      if (host_blocked) continue;
      if (io_in_flight_ >= options_.io_queue_tensors) {
        host_blocked = true;
        continue;
      }
      if (book.host_allocated || allocate_in(Tier::host, entry.tensor, d))
        issue(CommandKind::nvme_read, entry.tensor);
      else
        host_blocked = true;
    }
  }
}

// In place there is one tier to fill: NVMe → host reads, walked in plan order as far as the
// host budget (less the host-homed tensors) reaches. The host block is what the step uses.
// True: the pool was compacted and another pass should run at once.
bool Residency::prefetch_in_place() {
  const uint64_t host_room = options_.host_budget_bytes - host_home_bytes_;
  const uint64_t host_limit =
      options_.host_lookahead_bytes ? std::min(options_.host_lookahead_bytes, host_room) : host_room;
  uint64_t horizon_bytes = 0;
  ++epoch_;
  for (uint64_t k = cursor_abs_; k < cursor_abs_ + n(); ++k) {
    const uint64_t d = k - cursor_abs_;
    for (const StepTensor& entry : step_tensors_[k % n()]) {
      if (seen_epoch_[entry.tensor] == epoch_) continue;
      seen_epoch_[entry.tensor] = epoch_;
      Book& book = books_[entry.tensor];
      if (book.home != Home::nvme) continue;  // always resident
      horizon_bytes += book.aligned_bytes;
      if (horizon_bytes > host_limit && d > 0) return false;
      if (book.read_error || book.host_op != HostOp::none) continue;  // reported by acquire / in flight
      if (!entry.reads) {
        // Fully overwritten by its step: a block, no read. Its version stays "none" until
        // the step is acquired, so nothing writes it back or reads from it before then.
        if (book.host_allocated) continue;
        if (!allocate_in(Tier::host, entry.tensor, d)) return compact_for_cursor_step(d);
        book.host_version = kNoVersion;
        continue;
      }
      if (book.host_allocated && book.host_version == book.version) continue;
      if (io_in_flight_ >= options_.io_queue_tensors) return false;
      if (!book.host_allocated && !allocate_in(Tier::host, entry.tensor, d)) return compact_for_cursor_step(d);
      issue(CommandKind::nvme_read, entry.tensor);
    }
  }
  return false;
}

// In place the cursor step needs all its blocks at once. When the arena (which does not move
// live blocks) is too fragmented to place one although the budget has room, and nothing in
// flight or pinned will free space by itself, every idle clean NVMe-homed block goes and the
// pass runs again: what is left are the host-homed blocks taken at create, so the step's
// blocks, allocated largest first, fit. Evicting the step's own blocks one at a time
// instead only moved the hole around (each pass took the block the previous one placed).
bool Residency::compact_for_cursor_step(uint64_t need_distance) {
  if (need_distance != 0 || io_in_flight_ > 0) return false;
  for (const Book& book : books_)
    if (book.pins > 0) return false;
  bool evicted = false;
  for (size_t i = 0; i < books_.size(); ++i) {
    const Book& book = books_[i];
    if (book.home == Home::nvme && book.host_allocated && book.host_op == HostOp::none && host_droppable(book)) {
      evict(Tier::host, static_cast<TensorId>(i));
      evicted = true;
    }
  }
  return evicted;
}

bool Residency::pass() {
  write_back();
  if (options_.compute_in_place) return prefetch_in_place();
  prefetch();
  return false;
}

// --- completions -----------------------------------------------------------------------------

void Residency::h2d_done(TensorId tensor, int64_t version) {
  Book& done = books_[tensor];
  done.device_op = DeviceOp::none;
  done.host_op = HostOp::none;
  done.device_version = version;
  done.device_placeholder = false;
  --h2d_in_flight_;
}

void Residency::d2h_done(TensorId tensor, int64_t version) {
  Book& done = books_[tensor];
  done.device_op = DeviceOp::none;
  done.host_op = HostOp::none;
  done.host_version = version;
  --d2h_in_flight_;
}

void Residency::io_done(TensorId tensor, bool is_write, int64_t version, std::optional<Error> error) {
  Book& book = books_[tensor];
  book.host_op = HostOp::none;
  --io_in_flight_;
  if (error) {
    // A failed read stays with its tensor; a failed write leaves the NVMe copy where it was.
    if (!is_write) book.read_error = std::move(error);
    return;
  }
  if (is_write)
    book.nvme_version = std::max(book.nvme_version, version);
  else
    book.host_version = version;
}

void Residency::io_dropped(TensorId tensor) {
  books_[tensor].host_op = HostOp::none;
  --io_in_flight_;
}

void Residency::fail(Error error) {
  if (!sticky_error_) sticky_error_ = std::move(error);
}

// --- the caller's side -----------------------------------------------------------------------

bool Residency::step_ready(size_t step) const {
  for (const StepTensor& entry : step_tensors_[step]) {
    const Book& book = books_[entry.tensor];
    if (!device_current(book, entry.reads)) return false;
    if (entry.writes && book.device_op != DeviceOp::none) return false;  // a d2h still reads it
    // In place: a block on its way to NVMe is not written under the write (crash safety).
    if (entry.writes && options_.compute_in_place && book.host_op != HostOp::none) return false;
  }
  return true;
}

std::optional<Error> Residency::step_error(size_t step) const {
  for (const StepTensor& entry : step_tensors_[step]) {
    const Book& book = books_[entry.tensor];
    if (book.read_error && !device_current(book, entry.reads)) {
      Error error = *book.read_error;
      error.message = fmt::format("step '{}' needs tensor '{}', whose prefetch from NVMe failed: {}",
                                  plan_.steps()[step].name, plan_.tensors()[entry.tensor].name, error.message);
      return error;
    }
  }
  if (sticky_error_) return *sticky_error_;
  return std::nullopt;
}

std::optional<Error> Residency::over_pinned(size_t step, size_t held_count, bool release_pending) const {
  if (release_pending) return std::nullopt;
  // In place, pinned NVMe-homed blocks share the host budget with the host-homed tensors.
  const bool in_place = options_.compute_in_place;
  uint64_t pinned_bytes = in_place ? host_home_bytes_ : 0;
  for (size_t id = 0; id < books_.size(); ++id) {
    if (in_place && books_[id].home != Home::nvme) continue;
    const bool in_step = std::any_of(step_tensors_[step].begin(), step_tensors_[step].end(),
                                     [&](const StepTensor& e) { return e.tensor == id; });
    if (in_step || books_[id].pins > 0) pinned_bytes += books_[id].aligned_bytes;
  }
  const uint64_t budget_bytes = in_place ? options_.host_budget_bytes : memory_.device_budget_bytes();
  if (pinned_bytes <= budget_bytes) return std::nullopt;
  return make_error(ErrorKind::no_space,
                    fmt::format("step '{}' cannot be acquired while {} step(s) are held: together they need {} "
                                "{}, whose budget is {}",
                                plan_.steps()[step].name, held_count, format_size(pinned_bytes),
                                in_place ? "in host memory" : "on the device", format_size(budget_bytes)));
}

void Residency::acquire(size_t step) {
  assert(step == next_step());
  for (const StepTensor& entry : step_tensors_[step]) {
    Book& book = books_[entry.tensor];
    if (book.pins++ == 0) ++pinned_tensors_;
    if (!entry.writes) continue;
    ++book.write_pins;
    ++book.version;  // the copies below are now stale; the compute copy is the newest
    if (options_.compute_in_place) {
      book.host_version = book.version;  // the host block is the compute copy
    } else {
      book.device_version = book.version;
      book.device_placeholder = false;
    }
  }
  ++cursor_abs_;
  own_evictions_at_cursor_ = 0;
}

void Residency::release(size_t step) {
  for (const StepTensor& entry : step_tensors_[step]) {
    Book& book = books_[entry.tensor];
    assert(book.pins > 0);
    if (--book.pins == 0) --pinned_tensors_;
    if (entry.writes) --book.write_pins;
  }
}

bool Residency::flushed() const {
  for (const Book& book : books_) {
    if (book.device_op != DeviceOp::none || book.host_op != HostOp::none) return false;
    if (book.home == Home::nvme ? book.nvme_version != book.version : book.host_version != book.version) return false;
  }
  return true;
}

bool Residency::host_idle(TensorId tensor) const {
  const Book& book = books_[tensor];
  return book.host_op == HostOp::none && book.device_op == DeviceOp::none;
}

void Residency::begin_host_access(TensorId tensor) {
  Book& book = books_[tensor];
  assert(book.home == Home::host && book.pins == 0);
  book.host_op = HostOp::caller;
}

void Residency::end_host_access(TensorId tensor) {
  Book& book = books_[tensor];
  assert(book.host_op == HostOp::caller);
  book.host_op = HostOp::none;
  // The caller may have changed the bytes: the host copy becomes the newest, a device copy stale.
  book.version = std::max(book.version, book.device_version) + 1;
  book.host_version = book.version;
}

}  // namespace strata::scheduler
