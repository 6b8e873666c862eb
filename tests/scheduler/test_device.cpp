// Proves the CPU device behaves like a GPU where the scheduler relies on it: a stream runs its
// work in order, two streams really run at the same time (each waits for the other to have
// started, which only finishes if they overlap), events complete when — and only when — the
// work before them has run, a stream can wait on another's event, copies (host ↔ device and
// device → device, at unaligned offsets, neighbours untouched) are byte-exact, and the arena
// never hands out more than its budget. The emulated device (the same machinery, discrete) is
// checked for what makes it a GPU stand-in: its kind says its memory is not host memory, a copy
// reads and writes its bytes when its stream reaches it (not when it is enqueued), events and
// stream waits order a copy behind compute as CUDA's do, and its arena is as hard a cap.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "device/device.h"

namespace strata::device {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Device> cpu(uint64_t budget_bytes = 1 << 20) {
  Result<std::unique_ptr<Device>> device = make_device(Kind::cpu, budget_bytes);
  if (!device.ok()) {  // a failure of the test, not a dereference of the error (gtest reports the throw)
    ADD_FAILURE() << device.status().to_string();
    throw std::runtime_error("cpu device");
  }
  return std::move(device).value();
}

// Spins until `flag` is set or two seconds pass; returns whether it was set.
bool wait_flag(const std::atomic<bool>& flag) {
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(CpuDevice, StreamRunsTasksInOrder) {
  auto device = cpu();
  Stream stream = device->create_stream("s").value();
  std::vector<int> order;
  for (int i = 0; i < 500; ++i)
    ASSERT_TRUE(device->launch(stream, [&order, i] {
      if (i % 97 == 0) std::this_thread::sleep_for(1ms);  // jitter must not reorder
      order.push_back(i);
    }).ok());
  ASSERT_TRUE(device->synchronize(stream).ok());
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(order[i], i);
}

TEST(CpuDevice, TwoStreamsRunConcurrently) {
  auto device = cpu();
  Stream a = device->create_stream("a").value();
  Stream b = device->create_stream("b").value();
  std::atomic<bool> a_started{false}, b_started{false};
  std::atomic<bool> a_saw_b{false}, b_saw_a{false};
  // Each task announces itself then waits for the other: both can finish only if they run at
  // the same time. On a single ordered thread one would time out.
  ASSERT_TRUE(device->launch(a, [&] { a_started = true; a_saw_b = wait_flag(b_started); }).ok());
  ASSERT_TRUE(device->launch(b, [&] { b_started = true; b_saw_a = wait_flag(a_started); }).ok());
  ASSERT_TRUE(device->synchronize(a).ok());
  ASSERT_TRUE(device->synchronize(b).ok());
  EXPECT_TRUE(a_saw_b);
  EXPECT_TRUE(b_saw_a);
}

TEST(CpuDevice, EventCompletesOnlyAfterPriorWork) {
  auto device = cpu();
  Stream stream = device->create_stream("s").value();
  Event event = device->create_event().value();
  EXPECT_TRUE(device->query(event).value()) << "a never-recorded event counts as complete";
  std::atomic<bool> release{false}, ran{false};
  ASSERT_TRUE(device->launch(stream, [&] { wait_flag(release); ran = true; }).ok());
  ASSERT_TRUE(device->record(event, stream).ok());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(device->query(event).value()) << "the work before the event has not run";
  release = true;
  ASSERT_TRUE(device->wait(event).ok());
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(device->query(event).value());
}

TEST(CpuDevice, StreamWaitsOnAnotherStreamsEvent) {
  auto device = cpu();
  Stream producer = device->create_stream("producer").value();
  Stream consumer = device->create_stream("consumer").value();
  Event produced = device->create_event().value();
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  int seen = -1;
  ASSERT_TRUE(device->launch(producer, [&] { wait_flag(release); value = 42; }).ok());
  ASSERT_TRUE(device->record(produced, producer).ok());
  ASSERT_TRUE(device->stream_wait(consumer, produced).ok());
  ASSERT_TRUE(device->launch(consumer, [&] { seen = value.load(); }).ok());
  std::this_thread::sleep_for(20ms);
  release = true;
  ASSERT_TRUE(device->synchronize(consumer).ok());
  EXPECT_EQ(seen, 42) << "the consumer ran before the producer's event";
}

TEST(CpuDevice, CopiesRoundTripBitExact) {
  auto device = cpu();
  Stream h2d = device->create_stream("h2d").value();
  Stream d2h = device->create_stream("d2h").value();
  Event copied = device->create_event().value();
  const uint64_t size_bytes = 300000;  // not a multiple of the alignment
  std::vector<uint32_t> source(size_bytes / 4), back(size_bytes / 4, 0);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint32_t>(i * 2654435761u);
  DeviceBuffer buffer = device->allocate(size_bytes).value();
  ASSERT_TRUE(device->copy_to_device(h2d, buffer.data(), source.data(), size_bytes).ok());
  ASSERT_TRUE(device->record(copied, h2d).ok());
  ASSERT_TRUE(device->stream_wait(d2h, copied).ok());
  ASSERT_TRUE(device->copy_to_host(d2h, back.data(), buffer.data(), size_bytes).ok());
  ASSERT_TRUE(device->synchronize(d2h).ok());
  EXPECT_EQ(std::memcmp(source.data(), back.data(), size_bytes), 0);
}

// ZeRO stage 3's share into its gather slot: a device → device copy lands exactly the bytes
// asked for at the offset asked for, and nothing around them.
TEST(CpuDevice, CopyOnDeviceMovesExactlyTheRange) {
  auto device = cpu();
  Stream stream = device->create_stream("compute").value();
  const uint64_t size_bytes = 4099;
  std::vector<uint8_t> source(size_bytes), back(size_bytes, 0);
  for (size_t i = 0; i < size_bytes; ++i) source[i] = static_cast<uint8_t>(i * 37 + 11);
  DeviceBuffer from = device->allocate(size_bytes).value();
  DeviceBuffer to = device->allocate(size_bytes).value();
  std::vector<uint8_t> zeros(size_bytes, 0);
  ASSERT_TRUE(device->copy_to_device(stream, from.data(), source.data(), size_bytes).ok());
  ASSERT_TRUE(device->copy_to_device(stream, to.data(), zeros.data(), size_bytes).ok());
  auto* from_bytes = static_cast<uint8_t*>(from.data());
  auto* to_bytes = static_cast<uint8_t*>(to.data());
  ASSERT_TRUE(device->copy_on_device(stream, to_bytes + 3, from_bytes + 5, 1000).ok());
  ASSERT_TRUE(device->copy_to_host(stream, back.data(), to.data(), size_bytes).ok());
  ASSERT_TRUE(device->synchronize(stream).ok());
  std::vector<uint8_t> expected(size_bytes, 0);
  std::memcpy(expected.data() + 3, source.data() + 5, 1000);
  EXPECT_EQ(back, expected);
}

TEST(CpuDevice, ArenaHoldsItsBudget) {
  const uint64_t budget_bytes = 64 * kDeviceAlignmentBytes;
  auto device = cpu(budget_bytes);
  uint64_t worst_used_bytes = 0;
  device->set_allocation_hook([&](uint64_t used_bytes, uint64_t budget) {
    EXPECT_LE(used_bytes, budget);
    worst_used_bytes = std::max(worst_used_bytes, used_bytes);
  });
  std::vector<DeviceBuffer> held;
  for (;;) {
    Result<DeviceBuffer> buffer = device->allocate(3 * kDeviceAlignmentBytes + 1);
    if (!buffer.ok()) {
      EXPECT_EQ(buffer.error().kind, ErrorKind::no_space) << buffer.error().to_string();
      break;
    }
    EXPECT_EQ(buffer->offset_bytes() % kDeviceAlignmentBytes, 0u);
    held.push_back(std::move(buffer).value());
  }
  EXPECT_EQ(held.size(), 16u);  // 4 pages each after rounding
  EXPECT_EQ(worst_used_bytes, budget_bytes);
  EXPECT_EQ(device->memory_stats().used_bytes, budget_bytes);
  held.pop_back();  // RAII returns the range
  EXPECT_EQ(device->memory_stats().used_bytes, budget_bytes - 4 * kDeviceAlignmentBytes);
  EXPECT_TRUE(device->allocate(4 * kDeviceAlignmentBytes).ok());
}

TEST(CpuDevice, FactoryRejectsUnknownAndMissing) {
  EXPECT_FALSE(parse_kind("tpu").ok());
  EXPECT_EQ(parse_kind("cuda").value(), Kind::cuda);
  EXPECT_FALSE(make_device(Kind::cpu, 100).ok()) << "a budget below one page is refused";
  if (cuda_device_count() == 0) {
    EXPECT_FALSE(make_device(Kind::cuda, 1 << 20).ok());
  }
}

// --- the emulated discrete device -----------------------------------------------------

std::unique_ptr<Device> emulated(uint64_t budget_bytes = 1 << 20) {
  Result<std::unique_ptr<Device>> device = make_device(Kind::emulated, budget_bytes);
  if (!device.ok()) {
    ADD_FAILURE() << device.status().to_string();
    throw std::runtime_error("emulated device");
  }
  return std::move(device).value();
}

TEST(EmulatedDevice, IsDiscreteAndNamedSo) {
  auto device = emulated();
  EXPECT_EQ(device->kind(), Kind::emulated);
  EXPECT_FALSE(device->memory_is_host());
  EXPECT_TRUE(cpu()->memory_is_host());
  EXPECT_EQ(parse_kind(kind_name(Kind::emulated)).value(), Kind::emulated);
  // The config-string answer is the same authority as the device's.
  EXPECT_FALSE(memory_is_host("emulated"));
  EXPECT_FALSE(memory_is_host("cuda"));
  EXPECT_TRUE(memory_is_host("cpu"));
  EXPECT_FALSE(memory_is_host(Kind::cuda));
}

// A copy is asynchronous: enqueued behind work that has not run, it has not touched either side
// yet — the host source may still change and the change is what arrives (as with
// cudaMemcpyAsync, the buffer must live and is read when the stream gets there) — and an event
// recorded after it is incomplete until it has run.
TEST(EmulatedDevice, CopiesRunWhenTheirStreamReachesThem) {
  auto device = emulated();
  Stream compute = device->create_stream("compute").value();
  Stream copy = device->create_stream("h2d").value();
  Event computed = device->create_event().value();
  Event copied = device->create_event().value();
  const uint64_t size_bytes = 12345;
  DeviceBuffer buffer = device->allocate(size_bytes).value();
  std::memset(buffer.data(), 0, size_bytes);  // the test may look: the region is this process's
  std::vector<uint8_t> source(size_bytes, 1), back(size_bytes, 0);
  std::atomic<bool> release{false};
  ASSERT_TRUE(device->launch(compute, [&] {
    while (!release.load()) std::this_thread::yield();
  }).ok());
  ASSERT_TRUE(device->record(computed, compute).ok());
  ASSERT_TRUE(device->stream_wait(copy, computed).ok());  // the copy waits for the compute
  ASSERT_TRUE(device->copy_to_device(copy, buffer.data(), source.data(), size_bytes).ok());
  ASSERT_TRUE(device->copy_to_host(copy, back.data(), buffer.data(), size_bytes).ok());
  ASSERT_TRUE(device->record(copied, copy).ok());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(device->query(copied).value()) << "the copies completed before the compute they wait for";
  EXPECT_EQ(static_cast<uint8_t*>(buffer.data())[0], 0) << "the copy ran at enqueue, not in stream order";
  for (size_t i = 0; i < size_bytes; ++i) source[i] = static_cast<uint8_t>(i * 31 + 7);
  release = true;
  ASSERT_TRUE(device->wait(copied).ok());
  EXPECT_TRUE(device->query(copied).value());
  EXPECT_EQ(source, back) << "the device did not receive the source as it was when the copy ran";
}

// The emulated arena is the whole device: allocation past device.memory is no_space, never
// memory taken from elsewhere.
TEST(EmulatedDevice, BudgetIsHard) {
  const uint64_t budget_bytes = 8 * kDeviceAlignmentBytes;
  auto device = emulated(budget_bytes);
  EXPECT_EQ(device->budget_bytes(), budget_bytes);
  DeviceBuffer most = device->allocate(7 * kDeviceAlignmentBytes).value();
  Result<DeviceBuffer> over = device->allocate(kDeviceAlignmentBytes + 1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().kind, ErrorKind::no_space);
  DeviceBuffer last = device->allocate(kDeviceAlignmentBytes).value();
  EXPECT_EQ(device->memory_stats().used_bytes, budget_bytes);
  EXPECT_EQ(device->memory_stats().high_water_bytes, budget_bytes);
}

}  // namespace
}  // namespace strata::device
