// tests/engine/test_budgets.cpp — proves the one pool rule (run/budgets.h memory_pools) against
// its contract, written out here as arithmetic: the CPU device makes device.memory +
// host.memory one pool whose scratch is the device region (so 2 GiB + 6 GiB and 3 GiB + 5 GiB
// are the same run), a discrete device keeps device.memory as its arena and host.memory as the
// pool whatever the scratch; a scratch beyond the budget empties the pool instead of wrapping it.
// Then that the training budgets and the default optimizer chunk size are the rule's figures,
// and where device-resident gradients lie with and without gradient accumulation.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "models/model_layout.h"
#include "run/budgets.h"
#include "run/train_config.h"
#include "run/train_plan.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryPools, TheCpuDeviceIsOnePoolWhateverTheSplit) {
  const uint64_t scratch_bytes = 300 * kMiB;
  const MemoryPools a = memory_pools(device::Kind::cpu, 2 * kGiB, 6 * kGiB, scratch_bytes);
  const MemoryPools b = memory_pools(device::Kind::cpu, 3 * kGiB, 5 * kGiB, scratch_bytes);
  for (const MemoryPools& pools : {a, b}) {
    EXPECT_TRUE(pools.one_pool);
    EXPECT_EQ(pools.budget_bytes, 8 * kGiB);
    EXPECT_EQ(pools.device_region_bytes, scratch_bytes);
    EXPECT_EQ(pools.pool_bytes, 8 * kGiB - scratch_bytes);
    EXPECT_EQ(pools.streaming_bytes(), pools.pool_bytes);
  }
}

TEST(MemoryPools, ADiscreteDeviceKeepsItsArenaAndTheHostPool) {
  for (const device::Kind kind : {device::Kind::cuda, device::Kind::emulated}) {
    const MemoryPools pools = memory_pools(kind, 2 * kGiB, 6 * kGiB, 300 * kMiB);
    EXPECT_FALSE(pools.one_pool);
    EXPECT_EQ(pools.budget_bytes, 2 * kGiB);  // the scratch and a step share device.memory
    EXPECT_EQ(pools.device_region_bytes, 2 * kGiB);
    EXPECT_EQ(pools.pool_bytes, 6 * kGiB);  // the scratch never comes out of host.memory
    EXPECT_EQ(pools.streaming_bytes(), 2 * kGiB);
    EXPECT_EQ(memory_pools(kind, 8 * kGiB, 1 * kGiB, 0).streaming_bytes(), 1 * kGiB);
  }
}

TEST(MemoryPools, AScratchBeyondTheBudgetEmptiesThePool) {
  const MemoryPools pools = memory_pools(device::Kind::cpu, 1 * kMiB, 2 * kMiB, 5 * kMiB);
  EXPECT_EQ(pools.pool_bytes, 0u);
  EXPECT_EQ(pools.device_region_bytes, 5 * kMiB);  // the caller's check reports what does not fit
}

TEST(MemoryPools, AConfigAsksTheRuleByItsKindName) {
  TrainConfig config;
  config.device_memory_bytes = 256 * kMiB;
  config.host_memory_bytes = 512 * kMiB;
  config.device_kind = "cpu";
  EXPECT_EQ(memory_pools(config, 4 * kMiB).pool_bytes, 764 * kMiB);
  config.device_kind = "emulated";
  EXPECT_EQ(memory_pools(config, 4 * kMiB).pool_bytes, 512 * kMiB);
}

TEST(RunBudgets, TrainingTakesTheKernelsScratchOutOfTheOnePool) {
  TrainConfig config;
  config.device_memory_bytes = 256 * kMiB;
  config.host_memory_bytes = 512 * kMiB;
  const ModelLayout layout(config.model);
  const uint64_t scratch_bytes = device_scratch(config, layout).total();
  ASSERT_GT(scratch_bytes, device::kDeviceAlignmentBytes);

  config.device_kind = "cpu";
  RunBudgets budgets = run_budgets(config, layout);
  EXPECT_TRUE(budgets.one_pool);
  EXPECT_EQ(budgets.scratch_bytes, scratch_bytes);
  EXPECT_EQ(budgets.device_region_bytes, scratch_bytes);
  EXPECT_EQ(budgets.pool_bytes, 768 * kMiB - scratch_bytes);
  EXPECT_EQ(budgets.timing_device_bytes, 768 * kMiB);

  config.device_kind = "emulated";
  budgets = run_budgets(config, layout);
  EXPECT_FALSE(budgets.one_pool);
  EXPECT_EQ(budgets.device_region_bytes, 256 * kMiB);
  EXPECT_EQ(budgets.pool_bytes, 512 * kMiB);
  EXPECT_EQ(budgets.timing_device_bytes, 256 * kMiB);
}

// grads: device (run/train_plan.h device_grads_offsets): with K = 1 every block's gradients go
// at the start of a one-block scratch; with K > 1 every trained unit but the embeddings and
// ln_f (own buffers) has its own place, none overlapping, aligned as a device allocation, and
// the scratch ends at the last one — 4 B per trained block parameter, plus alignment.
TEST(RunBudgets, DeviceGradientsAcrossMicroBatchesHaveAPlaceEach) {
  TrainConfig config;
  config.model.n_layer = 3;
  config.placement.grads = Tier::device;
  const ModelLayout layout(config.model);
  uint64_t largest_block_bytes = 0, block_bytes = 0;
  for (int64_t i = 0; i < layout.n_layer(); ++i) {
    largest_block_bytes = std::max(largest_block_bytes, layout.units()[layout.block_unit(i)].element_count * 4);
    block_bytes += layout.units()[layout.block_unit(i)].element_count * 4;
  }
  for (uint64_t offset : device_grads_offsets(config, layout)) EXPECT_EQ(offset, 0u);
  EXPECT_EQ(device_scratch(config, layout).block_grads_bytes, largest_block_bytes);

  config.gradient_accumulation_steps = 2;
  const std::vector<uint64_t> offsets = device_grads_offsets(config, layout);
  const uint64_t scratch_bytes = device_scratch(config, layout).block_grads_bytes;
  EXPECT_GE(scratch_bytes, block_bytes);
  EXPECT_LT(scratch_bytes, block_bytes + layout.n_layer() * device::kDeviceAlignmentBytes);
  uint64_t expected_offset = 0;
  for (int64_t i = 0; i < layout.n_layer(); ++i) {  // model order, side by side
    const size_t unit = layout.block_unit(i);
    EXPECT_EQ(offsets[unit], expected_offset) << layout.units()[unit].name;
    EXPECT_EQ(offsets[unit] % device::kDeviceAlignmentBytes, 0u);
    expected_offset = offsets[unit] + layout.units()[unit].element_count * 4;
    EXPECT_LE(expected_offset, scratch_bytes);
    expected_offset = (expected_offset + device::kDeviceAlignmentBytes - 1) / device::kDeviceAlignmentBytes *
                      device::kDeviceAlignmentBytes;
  }
  // The whole model's gradients on the device: the scratch a budget must hold grows by every
  // block's gradients but the one a K = 1 run already kept.
  TrainConfig one_pass = config;
  one_pass.gradient_accumulation_steps = 1;
  EXPECT_GE(device_scratch(config, layout).total(),
            device_scratch(one_pass, layout).total() + block_bytes - largest_block_bytes);
}

TEST(ChunkElements, TheDefaultChunkIsASixteenthOfWhatStreams) {
  TrainConfig config;  // adamw: 12 bytes an element
  config.device_memory_bytes = 256 * kMiB;
  config.host_memory_bytes = 512 * kMiB;
  config.device_kind = "cpu";  // 768 MiB / 16 / 12 = 4 Mi elements exactly
  EXPECT_EQ(chunk_elements_for_budgets(config), uint64_t{4} << 20);
  config.device_kind = "emulated";  // min(512, 256) MiB / 16 / 12 = 1.33 Mi: the power of two below
  EXPECT_EQ(chunk_elements_for_budgets(config), uint64_t{1} << 20);
}

}  // namespace
}  // namespace strata
