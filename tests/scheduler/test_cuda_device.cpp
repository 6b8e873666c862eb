// Proves the CUDA device on a real GPU: stream order, events, a host→device→host round trip
// from registered (pinned) memory that is bit-exact, a device → device copy of an unaligned
// range that moves exactly it, and the arena budget. Exits 77 (skip)
// where no GPU is visible, so CPU-only machines report it skipped, never passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common/size.h"
#include "device/device.h"
#include "memory/host_arena.h"

namespace strata::device {
namespace {

TEST(CudaDevice, RoundTripThroughTwoStreamsIsBitExact) {
  auto device = make_device(Kind::cuda, 64 << 20).value();
  EXPECT_EQ(device->kind(), Kind::cuda);
  Stream h2d = device->create_stream("h2d").value();
  Stream d2h = device->create_stream("d2h").value();
  Event copied = device->create_event().value();
  const uint64_t size_bytes = (8 << 20) + 12345;
  std::vector<uint8_t> source(size_bytes), back(size_bytes, 0);
  for (uint64_t i = 0; i < size_bytes; ++i) source[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  ASSERT_TRUE(device->register_host_memory(source.data(), size_bytes).ok());
  ASSERT_TRUE(device->register_host_memory(back.data(), size_bytes).ok());
  DeviceBuffer buffer = device->allocate(size_bytes).value();
  ASSERT_TRUE(device->copy_to_device(h2d, buffer.data(), source.data(), size_bytes).ok());
  ASSERT_TRUE(device->record(copied, h2d).ok());
  ASSERT_TRUE(device->stream_wait(d2h, copied).ok());
  ASSERT_TRUE(device->copy_to_host(d2h, back.data(), buffer.data(), size_bytes).ok());
  bool flag = false;
  ASSERT_TRUE(device->launch(d2h, [&] { flag = true; }).ok());
  ASSERT_TRUE(device->synchronize(d2h).ok());
  EXPECT_TRUE(flag);
  EXPECT_EQ(std::memcmp(source.data(), back.data(), size_bytes), 0);
  device->unregister_host_memory(source.data());
  device->unregister_host_memory(back.data());
}

// The first H100 run: every training run failed at start-up, because the scheduler registers its
// host arena and CUDA 13 answers cudaHostRegister on cudaHostAlloc memory with InvalidValue.
TEST(CudaDevice, PinnedArenaFromCudaHostAllocRegistersAndCopies) {
  auto device = make_device(Kind::cuda, 64 << 20).value();
  memory::HostArenaOptions options;
  options.capacity_bytes = 16 << 20;
  options.try_cuda = true;
  memory::HostArena arena = memory::HostArena::create(options).value();
  ASSERT_EQ(arena.pin_kind(), memory::PinKind::cuda_host);
  Status registered = device->register_host_memory(arena.base(), arena.capacity_bytes());
  ASSERT_TRUE(registered.ok()) << registered.to_string();
  const uint64_t size_bytes = 1 << 20;
  std::byte* source = arena.base();
  std::byte* back = arena.base() + size_bytes;
  for (uint64_t i = 0; i < size_bytes; ++i) source[i] = static_cast<std::byte>(i * 29 + 7);
  std::memset(back, 0, size_bytes);
  Stream stream = device->create_stream("copies").value();
  DeviceBuffer buffer = device->allocate(size_bytes).value();
  ASSERT_TRUE(device->copy_to_device(stream, buffer.data(), source, size_bytes).ok());
  ASSERT_TRUE(device->copy_to_host(stream, back, buffer.data(), size_bytes).ok());
  ASSERT_TRUE(device->synchronize(stream).ok());
  EXPECT_EQ(std::memcmp(source, back, size_bytes), 0);
  device->unregister_host_memory(arena.base());  // a no-op on cudaHostAlloc memory, and no error
}

TEST(CudaDevice, CopyOnDeviceMovesExactlyTheRange) {
  auto device = make_device(Kind::cuda, 64 << 20).value();
  Stream stream = device->create_stream("compute").value();
  const uint64_t size_bytes = 4099;
  std::vector<uint8_t> source(size_bytes), zeros(size_bytes, 0), back(size_bytes, 0);
  for (uint64_t i = 0; i < size_bytes; ++i) source[i] = static_cast<uint8_t>(i * 37 + 11);
  DeviceBuffer from = device->allocate(size_bytes).value();
  DeviceBuffer to = device->allocate(size_bytes).value();
  ASSERT_TRUE(device->copy_to_device(stream, from.data(), source.data(), size_bytes).ok());
  ASSERT_TRUE(device->copy_to_device(stream, to.data(), zeros.data(), size_bytes).ok());
  ASSERT_TRUE(device->copy_on_device(stream, static_cast<uint8_t*>(to.data()) + 3,
                                     static_cast<const uint8_t*>(from.data()) + 5, 1000)
                  .ok());
  ASSERT_TRUE(device->copy_to_host(stream, back.data(), to.data(), size_bytes).ok());
  ASSERT_TRUE(device->synchronize(stream).ok());
  std::vector<uint8_t> expected(size_bytes, 0);
  std::memcpy(expected.data() + 3, source.data() + 5, 1000);
  EXPECT_EQ(back, expected);
}

TEST(CudaDevice, ArenaHoldsItsBudget) {
  auto device = make_device(Kind::cuda, 1 << 20).value();
  std::vector<DeviceBuffer> held;
  while (true) {
    Result<DeviceBuffer> buffer = device->allocate(100000);
    if (!buffer.ok()) break;
    held.push_back(std::move(buffer).value());
  }
  EXPECT_LE(device->memory_stats().used_bytes, device->budget_bytes());
  EXPECT_EQ(held.size(), (1u << 20) / align_up(100000, kDeviceAlignmentBytes));
}

}  // namespace
}  // namespace strata::device

int main(int argc, char** argv) {
  // Skip (77) only where there is no GPU or no driver; any other CUDA error is a failure.
  strata::Result<int> devices = strata::device::cuda_device_count_or_error();
  if (!devices.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", devices.error().to_string().c_str());
    return 1;
  }
  if (*devices == 0) {
    std::printf("no CUDA device visible: skipping\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
