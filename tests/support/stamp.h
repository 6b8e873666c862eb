// tests/support/stamp.h — content stamped with the tensor and version it belongs to: every
// 8-byte word is a hash of (tensor, version, word index), so a byte from the wrong tensor, an
// old version or the wrong offset shows in a byte-exact comparison. Shared by the suites.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline void stamp(void* data, uint64_t size_bytes, uint64_t tensor, uint64_t version) {
  auto* out = static_cast<unsigned char*>(data);
  const uint64_t seed = mix64(tensor * 0x100000001b3ull + version);
  for (uint64_t word = 0; word * 8 < size_bytes; ++word) {
    const uint64_t value = mix64(seed ^ word);
    std::memcpy(out + word * 8, &value, std::min<uint64_t>(8, size_bytes - word * 8));
  }
}

inline bool has_stamp(const void* data, uint64_t size_bytes, uint64_t tensor, uint64_t version) {
  std::vector<unsigned char> expected(size_bytes);
  stamp(expected.data(), size_bytes, tensor, version);
  return std::memcmp(expected.data(), data, size_bytes) == 0;
}

}  // namespace strata::testing
