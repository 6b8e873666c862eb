// Proves the tensor registry's rules: the residency state machine moves only along its
// edges, per-tier byte budgets are never exceeded (a refused transition changes nothing),
// pinned / dirty / in-flight / home copies are never evicted (a pinned eviction asserts), and
// that the NVMe ↔ host mover drives real store reads and write-backs into pinned arena blocks
// with the registry transitions around them, bit-exact, within the host budget.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "memory/host_arena.h"
#include "memory/registry.h"
#include "memory/store.h"
#include "store_test_util.h"
#include "tests/support/temp_dir.h"

namespace strata::memory {
namespace {

using testing::AlignedBuffer;
using testing::fill_pattern;
using testing::matches_pattern;
using testing::test_store_options;

constexpr uint64_t kMiB = 1 << 20;

// Broken rules are programmer errors that assert; where asserts are compiled out the death
// checks cannot run, and the test says so instead of passing.
#ifdef NDEBUG
#define EXPECT_ASSERTS(statement, message) GTEST_SKIP() << "asserts are compiled out (NDEBUG)"
#else
#define EXPECT_ASSERTS(statement, message) EXPECT_DEATH(statement, message)
#endif

TensorSpec spec_of(const std::string& name, int64_t elements, Tier home) {
  return TensorSpec{name, DType::f32, {elements}, home};
}

TEST(Registry, StateMachineWalksItsEdges) {
  Registry registry({8 * kMiB, 8 * kMiB, 64 * kMiB});
  const TensorId id = registry.add(spec_of("w", 1024, Tier::nvme), Residency::clean).value();
  EXPECT_EQ(registry.copy(id, Tier::nvme).state, Residency::clean);
  EXPECT_EQ(registry.usage(Tier::nvme).used_bytes, 4096u);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::absent);

  int host_bytes = 0;
  ASSERT_TRUE(registry.begin_load(id, Tier::host, Placement{0, 4096, &host_bytes}).ok());
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::loading);
  EXPECT_EQ(registry.usage(Tier::host).used_bytes, 4096u);  // charged from the start of the load
  EXPECT_FALSE(registry.is_evictable(id, Tier::host));     // in flight
  registry.finish_load(id, Tier::host, true);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::clean);
  EXPECT_EQ(registry.copy(id, Tier::host).placement.data, &host_bytes);

  registry.mark_dirty(id, Tier::host);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::dirty);
  EXPECT_FALSE(registry.is_evictable(id, Tier::host));  // dirty: must be written back first
  registry.begin_write(id, Tier::host);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::writing);
  registry.pin(id, Tier::host);  // readable while being written
  registry.unpin(id, Tier::host);
  registry.finish_write(id, Tier::host, false);  // a failed write leaves it dirty
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::dirty);
  registry.begin_write(id, Tier::host);
  registry.finish_write(id, Tier::host, true);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::clean);

  EXPECT_TRUE(registry.is_evictable(id, Tier::host));
  const Placement placement = registry.evict(id, Tier::host);
  EXPECT_EQ(placement.data, &host_bytes);
  EXPECT_EQ(registry.copy(id, Tier::host).state, Residency::absent);
  EXPECT_EQ(registry.usage(Tier::host).used_bytes, 0u);
  EXPECT_EQ(registry.usage(Tier::host).peak_used_bytes, 4096u);

  // A failed load returns the bytes.
  ASSERT_TRUE(registry.begin_load(id, Tier::device, Placement{}).ok());
  registry.finish_load(id, Tier::device, false);
  EXPECT_EQ(registry.copy(id, Tier::device).state, Residency::absent);
  EXPECT_EQ(registry.usage(Tier::device).used_bytes, 0u);
  // The home copy is never evictable.
  EXPECT_FALSE(registry.is_evictable(id, Tier::nvme));
}

TEST(Registry, BudgetsAreHardAndARefusalChangesNothing) {
  Registry registry({10 * kMiB, 3 * kMiB, 64 * kMiB});
  std::vector<TensorId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(registry.add(spec_of("t" + std::to_string(i), 256 * 1024, Tier::nvme), Residency::clean).value());
  }
  // Each tensor is 1 MiB; the host holds three.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(registry.begin_load(ids[i], Tier::host, {}).ok());
  Status refused = registry.begin_load(ids[3], Tier::host, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::no_space);
  EXPECT_EQ(refused.error().tensor, "t3");
  EXPECT_EQ(registry.copy(ids[3], Tier::host).state, Residency::absent);
  EXPECT_EQ(registry.usage(Tier::host).used_bytes, 3 * kMiB);
  EXPECT_EQ(registry.usage(Tier::host).refused_count, 1u);
  EXPECT_FALSE(registry.create_resident(ids[3], Tier::host, {}, true).ok());

  // Evict one (after its load completed), then the fourth fits.
  registry.finish_load(ids[0], Tier::host, true);
  registry.evict(ids[0], Tier::host);
  ASSERT_TRUE(registry.begin_load(ids[3], Tier::host, {}).ok());
  EXPECT_LE(registry.usage(Tier::host).peak_used_bytes, 3 * kMiB);

  // A home tier without room refuses the registration itself.
  Registry tiny({kMiB, kMiB, kMiB});
  EXPECT_TRUE(tiny.add(spec_of("a", 200000, Tier::nvme), Residency::clean).ok());
  Result<TensorId> too_many = tiny.add(spec_of("b", 200000, Tier::nvme), Residency::clean);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().kind, ErrorKind::no_space);
  EXPECT_FALSE(tiny.find("b").has_value());
  // Duplicates and empty shapes are refused.
  EXPECT_EQ(tiny.add(spec_of("a", 1, Tier::nvme), Residency::absent).error().kind, ErrorKind::invalid_argument);
  EXPECT_EQ(tiny.add(TensorSpec{"e", DType::f32, {}, Tier::nvme}, Residency::absent).error().kind,
            ErrorKind::invalid_argument);
}

TEST(Registry, PinnedCopiesAreNeverEvicted) {
  Registry registry({8 * kMiB, 8 * kMiB, 64 * kMiB});
  const TensorId id = registry.add(spec_of("p", 1000, Tier::host), Residency::clean).value();
  ASSERT_TRUE(registry.create_resident(id, Tier::device, Placement{4096, 4096, nullptr}, false).ok());
  EXPECT_TRUE(registry.is_evictable(id, Tier::device));
  registry.pin(id, Tier::device);
  registry.pin(id, Tier::device);
  EXPECT_EQ(registry.copy(id, Tier::device).pins, 2u);
  EXPECT_FALSE(registry.is_evictable(id, Tier::device));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_ASSERTS(registry.evict(id, Tier::device), "pinned");
  registry.unpin(id, Tier::device);
  EXPECT_FALSE(registry.is_evictable(id, Tier::device));  // still one user
  EXPECT_ASSERTS(registry.evict(id, Tier::device), "pinned");
  registry.unpin(id, Tier::device);
  EXPECT_TRUE(registry.is_evictable(id, Tier::device));
  EXPECT_EQ(registry.evict(id, Tier::device).offset_bytes, 4096u);
  // The home copy and dirty copies are never evicted either.
  EXPECT_ASSERTS(registry.evict(id, Tier::host), "home");
  ASSERT_TRUE(registry.create_resident(id, Tier::device, Placement{}, true).ok());
  EXPECT_ASSERTS(registry.evict(id, Tier::device), "not clean");
  // Wrong transitions are programmer errors.
  EXPECT_ASSERTS(registry.finish_load(id, Tier::device, true), "not loading");
  EXPECT_ASSERTS(registry.unpin(id, Tier::host), "unpin without a pin");
}

TEST(Registry, OnlyOneDirtyCopyAtATime) {
  Registry registry({8 * kMiB, 8 * kMiB, 64 * kMiB});
  const TensorId id = registry.add(spec_of("d", 10, Tier::nvme), Residency::clean).value();
  ASSERT_TRUE(registry.create_resident(id, Tier::host, {}, false).ok());
  ASSERT_TRUE(registry.create_resident(id, Tier::device, {}, false).ok());
  registry.mark_dirty(id, Tier::device);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_ASSERTS(registry.mark_dirty(id, Tier::host), "second dirty copy");
}

// End to end through real files: NVMe-homed tensors are loaded into pinned arena blocks,
// one is changed and written back, committed, and read by a fresh store.
TEST(NvmeHostMover, LoadsWritesBackAndRespectsTheHostBudget) {
  strata::testing::TempDir temp;
  const std::string dir = temp.file("store");
  Store store = std::move(Store::create(dir, {}, 64 * kMiB, test_store_options())).value();
  constexpr int kTensors = 4;
  constexpr int64_t kElements = 300000;  // 1.14 MiB each, not a multiple of 4 KiB
  const uint64_t size = kElements * 4;
  for (int i = 0; i < kTensors; ++i) {
    AlignedBuffer data(size);
    fill_pattern(data.data, size, i, 1);
    ASSERT_TRUE(testing::write_and_wait(store, "t" + std::to_string(i), DType::f32, std::vector<int64_t>{kElements},
                                        data.data, size).ok());
  }
  ASSERT_TRUE(store.commit(1, {}).ok());

  HostArenaOptions arena_options;
  arena_options.capacity_bytes = 8 * kMiB;
  HostArena arena = std::move(HostArena::create(arena_options)).value();
  ASSERT_TRUE(arena.register_with(store.engine()).ok());
  // The host budget holds two tensors, though the arena could hold more.
  Registry registry({0, 2 * size + 100, 64 * kMiB});
  std::vector<TensorId> ids;
  for (int i = 0; i < kTensors; ++i) {
    ids.push_back(registry.add(spec_of("t" + std::to_string(i), kElements, Tier::nvme), Residency::clean).value());
  }
  NvmeHostMover mover(registry, store, arena);

  Result<MoveHandle> a = mover.load_to_host(ids[0]);
  Result<MoveHandle> b = mover.load_to_host(ids[1]);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(registry.copy(ids[0], Tier::host).state, Residency::loading);
  Result<MoveHandle> c = mover.load_to_host(ids[2]);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().kind, ErrorKind::no_space);
  EXPECT_EQ(registry.copy(ids[2], Tier::host).state, Residency::absent);
  ASSERT_TRUE(mover.wait(*a).ok());
  ASSERT_TRUE(mover.wait(*b).ok());
  for (int i = 0; i < 2; ++i) {
    const TierCopy copy = registry.copy(ids[i], Tier::host);
    EXPECT_EQ(copy.state, Residency::clean);
    EXPECT_TRUE(arena.contains(copy.placement.data, size));
    EXPECT_TRUE(matches_pattern(copy.placement.data, size, i, 1));
  }

  // Change t1 on the host, write it back, evict t0 to make room for t2.
  registry.pin(ids[1], Tier::host);
  fill_pattern(registry.copy(ids[1], Tier::host).placement.data, size, 1, 2);
  registry.mark_dirty(ids[1], Tier::host);
  registry.unpin(ids[1], Tier::host);
  Result<MoveHandle> back = mover.write_back(ids[1]);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(registry.copy(ids[1], Tier::host).state, Residency::writing);
  EXPECT_FALSE(registry.is_evictable(ids[1], Tier::host));
  mover.evict_host(ids[0]);
  Result<MoveHandle> c2 = mover.load_to_host(ids[2]);
  ASSERT_TRUE(c2.ok()) << c2.error().to_string();
  ASSERT_TRUE(mover.wait(*back).ok());
  ASSERT_TRUE(mover.wait(*c2).ok());
  EXPECT_EQ(registry.copy(ids[1], Tier::host).state, Residency::clean);
  EXPECT_TRUE(matches_pattern(registry.copy(ids[2], Tier::host).placement.data, size, 2, 1));
  EXPECT_LE(registry.usage(Tier::host).peak_used_bytes, 2 * size + 100);
  ASSERT_TRUE(store.commit(2, {}).ok());

  Store fresh = std::move(Store::open(dir, test_store_options())).value();
  AlignedBuffer check(size);
  ASSERT_TRUE(testing::read_and_wait(fresh, "t1", check.data, size).ok());
  EXPECT_TRUE(matches_pattern(check.data, size, 1, 2));
  ASSERT_TRUE(testing::read_and_wait(fresh, "t0", check.data, size).ok());
  EXPECT_TRUE(matches_pattern(check.data, size, 0, 1));

  mover.evict_host(ids[1]);
  mover.evict_host(ids[2]);
  EXPECT_EQ(arena.stats().allocator.used_bytes, 0u);
  EXPECT_EQ(registry.usage(Tier::host).used_bytes, 0u);
}

}  // namespace
}  // namespace strata::memory
