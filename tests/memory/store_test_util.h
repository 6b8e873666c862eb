// tests/memory/store_test_util.h — shared by the memory suites: content stamped with the
// tensor and version it belongs to (so a byte from the wrong tensor, the wrong version or the
// wrong offset shows), an engine config that works here, file snapshots.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/io.h"
#include "memory/store.h"
#include "tests/support/stamp.h"

namespace strata::memory::testing {

// Stamped content (tests/support/stamp.h) under the names the memory suites use.
inline void fill_pattern(void* data, uint64_t size_bytes, uint64_t tensor_index, uint64_t version) {
  strata::testing::stamp(data, size_bytes, tensor_index, version);
}
inline bool matches_pattern(const void* data, uint64_t size_bytes, uint64_t tensor_index, uint64_t version) {
  return strata::testing::has_stamp(data, size_bytes, tensor_index, version);
}

inline io::EngineConfig test_engine_config() {
  io::EngineConfig config;
  std::vector<io::Backend> backends = io::available_backends();
  config.backend = backends.empty() ? io::Backend::psync : backends.front();
  config.queue_depth = 16;
  config.block_size_bytes = 256 * 1024;
  return config;
}

inline StoreOptions test_store_options() {
  StoreOptions options;
  options.engine = test_engine_config();
  options.max_extent_bytes = 256 * 1024;  // small, so ordinary tensors span several extents
  return options;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// An aligned heap buffer for tests that do not need the arena.
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t size_bytes)
      : size(size_bytes), data(static_cast<unsigned char*>(std::aligned_alloc(4096, (size_bytes + 4095) / 4096 * 4096))) {}
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept : size(other.size), data(other.data) { other.data = nullptr; }
  ~AlignedBuffer() { std::free(data); }
  uint64_t size;
  unsigned char* data;
};

}  // namespace strata::memory::testing

namespace strata::memory::testing {

// Submit and wait in one call, for tests that do not test overlap.
[[nodiscard]] inline Status write_and_wait(Store& store, std::string_view name, DType dtype,
                                           std::span<const int64_t> shape, const void* data,
                                           uint64_t size_bytes) {
  Result<StoreTicket> ticket = store.write_tensor_async(name, dtype, shape, data, size_bytes);
  if (!ticket.ok()) return ticket.status();
  return store.wait(*ticket);
}
[[nodiscard]] inline Status read_and_wait(Store& store, std::string_view name, void* data, uint64_t capacity_bytes) {
  Result<StoreTicket> ticket = store.read_tensor_async(name, data, capacity_bytes);
  if (!ticket.ok()) return ticket.status();
  return store.wait(*ticket);
}

}  // namespace strata::memory::testing
