// Proves the range allocator keeps its promises under random alloc/free — blocks never
// overlap, the budget is never exceeded, freed neighbours coalesce back into one block,
// alignment is honoured — by checking every step against a shadow byte map; and that the
// host arena hands out aligned, usable, budgeted blocks of the region it pinned.
#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <gtest/gtest.h>

#include "memory/allocator.h"
#include "memory/host_arena.h"

namespace strata::memory {
namespace {

TEST(RangeAllocator, FirstBlockAndExactFill) {
  RangeAllocator allocator(1 << 20, 4096);
  Result<Block> a = allocator.allocate(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->offset_bytes, 0u);
  EXPECT_EQ(a->size_bytes, 4096u);  // rounded to the granule
  Result<Block> rest = allocator.allocate((1 << 20) - 4096);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(allocator.stats().free_bytes, 0u);
  Result<Block> none = allocator.allocate(1);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().kind, ErrorKind::no_space);
  EXPECT_EQ(allocator.stats().failed_allocations, 1u);
  allocator.free(*a);
  allocator.free(*rest);
  EXPECT_EQ(allocator.stats().free_block_count, 1u);
  EXPECT_EQ(allocator.stats().largest_free_bytes, 1u << 20);
}

TEST(RangeAllocator, BestFitPicksTheSmallestHoleThatFits) {
  RangeAllocator allocator(64 * 4096, 4096);
  // Carve holes of 3, 1 and 2 granules separated by live blocks.
  std::vector<Block> blocks;
  for (uint64_t granules : {3u, 1u, 1u, 1u, 2u, 1u}) blocks.push_back(allocator.allocate(granules * 4096).value());
  allocator.free(blocks[0]);  // hole of 3 at 0
  allocator.free(blocks[2]);  // hole of 1 at 4
  allocator.free(blocks[4]);  // hole of 2 at 6
  Result<Block> two = allocator.allocate(2 * 4096);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->offset_bytes, 6u * 4096);  // the 2-hole, not the 3-hole or the tail
  Result<Block> one = allocator.allocate(4096);
  EXPECT_EQ(one->offset_bytes, 4u * 4096);
}

TEST(RangeAllocator, AlignmentSplitsTheHeadOff) {
  RangeAllocator allocator(1 << 20, 4096);
  Block small = allocator.allocate(4096).value();
  Result<Block> aligned = allocator.allocate(64 * 1024, 64 * 1024);
  ASSERT_TRUE(aligned.ok());
  EXPECT_EQ(aligned->offset_bytes % (64 * 1024), 0u);
  // The head between the small block and the aligned one is still free and usable.
  Result<Block> head = allocator.allocate(60 * 1024);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->offset_bytes, 4096u);
  allocator.free(small);
  allocator.free(*aligned);
  allocator.free(*head);
  EXPECT_EQ(allocator.stats().free_block_count, 1u);
}

TEST(RangeAllocator, ReserveRejectsOverlapAndMisalignment) {
  RangeAllocator allocator(1 << 20, 4096);
  Result<Block> a = allocator.reserve(8192, 5000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size_bytes, 8192u);
  EXPECT_FALSE(allocator.reserve(12288, 4096).ok());  // inside a
  EXPECT_FALSE(allocator.reserve(4096, 8192).ok());   // runs into a
  EXPECT_FALSE(allocator.reserve(100, 10).ok());      // misaligned
  EXPECT_FALSE(allocator.reserve((1 << 20) - 4096, 8192).ok());  // past the end
  EXPECT_TRUE(allocator.reserve(0, 4096).ok());
  EXPECT_EQ(allocator.stats().used_bytes, 12288u);
}

TEST(RangeAllocator, FragmentationIsOneMinusLargestOverFree) {
  RangeAllocator allocator(8 * 4096, 4096);
  std::vector<Block> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(allocator.allocate(4096).value());
  for (int i = 0; i < 8; i += 2) allocator.free(blocks[i]);  // four 1-granule holes
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.free_bytes, 4u * 4096);
  EXPECT_EQ(stats.largest_free_bytes, 4096u);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 0.75);
  EXPECT_FALSE(allocator.allocate(2 * 4096).ok());  // free bytes exist but no hole fits
  for (int i = 1; i < 8; i += 2) allocator.free(blocks[i]);
  EXPECT_DOUBLE_EQ(allocator.stats().fragmentation, 0.0);
}

// Random alloc/free against a shadow map of granules: any overlap, any lost or double-
// counted byte, any failure to coalesce shows.
TEST(RangeAllocator, RandomAllocFreeKeepsInvariants) {
  constexpr uint64_t kGranule = 512;
  constexpr uint64_t kCapacity = 4096 * kGranule;
  RangeAllocator allocator(kCapacity, kGranule);
  std::vector<int> owner(kCapacity / kGranule, -1);
  std::vector<std::pair<int, Block>> live;
  std::mt19937_64 rng(20261122);
  int next_id = 0;
  uint64_t failures = 0;
  for (int step = 0; step < 40000; ++step) {
    const bool do_alloc = live.empty() || (rng() % 100) < 55;
    if (do_alloc) {
      // Mostly small, sometimes large, odd sizes; sometimes a stricter alignment.
      const uint64_t size = (rng() % 10 == 0) ? 1 + rng() % (kCapacity / 8) : 1 + rng() % (8 * kGranule);
      const uint64_t alignment = (rng() % 5 == 0) ? kGranule << (rng() % 4) : 0;
      Result<Block> block = allocator.allocate(size, alignment);
      if (!block.ok()) {
        ASSERT_EQ(block.error().kind, ErrorKind::no_space);
        // A refusal must be honest: no free run of granules could have held it (aligned).
        const uint64_t need = (size + kGranule - 1) / kGranule;
        const uint64_t align_granules = std::max<uint64_t>(1, alignment / kGranule);
        for (uint64_t start = 0; start + need <= owner.size(); start += align_granules) {
          bool fits = true;
          for (uint64_t g = start; g < start + need && fits; ++g) fits = owner[g] < 0;
          ASSERT_FALSE(fits) << "refused " << size << " bytes though granule " << start << " was free";
        }
        ++failures;
        continue;
      }
      ASSERT_EQ(block->offset_bytes % kGranule, 0u);
      if (alignment != 0) {
        ASSERT_EQ(block->offset_bytes % alignment, 0u);
      }
      ASSERT_GE(block->size_bytes, size);
      ASSERT_LE(block->offset_bytes + block->size_bytes, kCapacity);
      for (uint64_t g = block->offset_bytes / kGranule; g < (block->offset_bytes + block->size_bytes) / kGranule; ++g) {
        ASSERT_EQ(owner[g], -1) << "overlap at granule " << g;
        owner[g] = next_id;
      }
      live.emplace_back(next_id++, *block);
    } else {
      const size_t index = rng() % live.size();
      const auto [id, block] = live[index];
      for (uint64_t g = block.offset_bytes / kGranule; g < (block.offset_bytes + block.size_bytes) / kGranule; ++g) {
        ASSERT_EQ(owner[g], id);
        owner[g] = -1;
      }
      allocator.free(block);
      live[index] = live.back();
      live.pop_back();
    }
    if (step % 997 == 0) {
      // The free list must be exactly the runs of free granules, maximal (coalesced).
      std::map<uint64_t, uint64_t> expected;
      for (uint64_t g = 0; g < owner.size();) {
        if (owner[g] >= 0) {
          ++g;
          continue;
        }
        uint64_t end = g;
        while (end < owner.size() && owner[end] < 0) ++end;
        expected.emplace(g * kGranule, (end - g) * kGranule);
        g = end;
      }
      ASSERT_EQ(allocator.free_blocks(), expected);
      uint64_t used = 0;
      for (const auto& [id, block] : live) used += block.size_bytes;
      ASSERT_EQ(allocator.stats().used_bytes, used);
      ASSERT_LE(used, kCapacity);
    }
  }
  EXPECT_GT(failures, 0u) << "the test never reached the budget; make it harder";
  for (const auto& [id, block] : live) allocator.free(block);
  EXPECT_EQ(allocator.stats().free_block_count, 1u);
  EXPECT_EQ(allocator.stats().used_bytes, 0u);
}

TEST(RangeAllocator, ThreadsShareOneAllocator) {
  RangeAllocator allocator(64 << 20, 4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&allocator, t] {
      std::mt19937 rng(t);
      std::vector<Block> mine;
      for (int i = 0; i < 5000; ++i) {
        if (mine.size() < 20 && rng() % 2 == 0) {
          Result<Block> block = allocator.allocate(1 + rng() % (256 * 1024));
          if (block.ok()) mine.push_back(*block);
        } else if (!mine.empty()) {
          allocator.free(mine.back());
          mine.pop_back();
        }
      }
      for (const Block& block : mine) allocator.free(block);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(allocator.stats().used_bytes, 0u);
  EXPECT_EQ(allocator.stats().free_block_count, 1u);
}

TEST(HostArena, BlocksAreAlignedUsableAndBudgeted) {
  HostArenaOptions options;
  options.capacity_bytes = 4 << 20;
  options.alignment_bytes = 4096;
  Result<HostArena> made = HostArena::create(options);
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  HostArena arena = std::move(made).value();
  EXPECT_EQ(arena.capacity_bytes(), 4u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.base()) % 4096, 0u);

  Result<HostBlock> a = arena.allocate(1000);
  Result<HostBlock> b = arena.allocate(3 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4096, 0u);
  EXPECT_TRUE(arena.contains(b->data, b->size_bytes));
  std::memset(a->data, 0xab, a->size_bytes);
  std::memset(b->data, 0xcd, b->size_bytes);
  EXPECT_EQ(static_cast<unsigned char>(a->data[999]), 0xab);

  Result<HostBlock> too_big = arena.allocate(2 << 20);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().kind, ErrorKind::no_space);
  EXPECT_EQ(arena.stats().allocator.used_bytes, 4096u + (3u << 20));

  {
    // RAII buffers survive a move of the arena and give their block back.
    HostArena moved = std::move(arena);
    Result<HostBuffer> buffer = HostBuffer::allocate(moved, 512 * 1024);
    ASSERT_TRUE(buffer.ok());
    HostBuffer kept = std::move(buffer).value();
    EXPECT_TRUE(moved.contains(kept.data(), kept.size_bytes()));
    arena = std::move(moved);
  }
  EXPECT_EQ(arena.stats().allocator.used_bytes, 4096u + (3u << 20));
  arena.free(*a);
  arena.free(*b);
  EXPECT_EQ(arena.stats().allocator.used_bytes, 0u);
}

TEST(HostArena, ReportsHowItIsPinned) {
  HostArenaOptions options;
  options.capacity_bytes = 1 << 20;
  options.try_mlock = false;  // forced fallback: plain pages, one warning
  Result<HostArena> plain = HostArena::create(options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->pin_kind(), PinKind::unpinned);
  options.try_mlock = true;
  Result<HostArena> pinned = HostArena::create(options);
  ASSERT_TRUE(pinned.ok());
  // 1 MiB fits under the usual 8 MiB RLIMIT_MEMLOCK, so it is locked (or CUDA-pinned).
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  if (pinned->pin_kind() == PinKind::unpinned && limit.rlim_cur < (1u << 20)) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK is below 1 MiB here";
  }
  EXPECT_NE(pinned->pin_kind(), PinKind::unpinned);
}

// Proves an arena asks CUDA for its pages only when told to (a CUDA run sets try_cuda): by
// default — every cpu and emulated run — it never comes from cudaHostAlloc, even in a CUDA build
// on a machine with a GPU, so such a run does not initialise CUDA at all.
TEST(HostArena, PinsWithCudaOnlyWhenAsked) {
  HostArenaOptions options;
  options.capacity_bytes = 1 << 20;
  EXPECT_FALSE(options.try_cuda);
  Result<HostArena> arena = HostArena::create(options);
  ASSERT_TRUE(arena.ok());
  EXPECT_NE(arena->pin_kind(), PinKind::cuda_host);
}

}  // namespace
}  // namespace strata::memory
