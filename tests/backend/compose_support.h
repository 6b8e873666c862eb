// tests/backend/compose_support.h — what the compose tests (a model definition's ops against the
// reference kernels, bit for bit) share: aligned host buffers and a bit comparison that says
// where two outputs part.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"
#include "kernels/ops.h"

namespace strata::testing {

// Host memory the kernels accept (64-byte aligned), zeroed.
struct Aligned {
  explicit Aligned(size_t bytes)
      : size_bytes((bytes + 63) / 64 * 64), data(static_cast<float*>(std::aligned_alloc(64, size_bytes))) {
    std::memset(data, 0, size_bytes);
  }
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  kernels::Workspace workspace() const { return {data, size_bytes}; }
  size_t size_bytes;
  float* data;
};

// The first differing element and how many differ, so a failure says where.
inline void expect_same_bits(const std::string& what, const std::vector<float>& composed,
                             const std::vector<float>& direct) {
  ASSERT_EQ(composed.size(), direct.size()) << what;
  if (std::memcmp(composed.data(), direct.data(), composed.size() * sizeof(float)) == 0) return;
  size_t first = composed.size(), count = 0;
  for (size_t i = 0; i < composed.size(); ++i)
    if (std::memcmp(&composed[i], &direct[i], sizeof(float)) != 0) {
      first = std::min(first, i);
      ++count;
    }
  ADD_FAILURE() << what << ": " << count << " of " << composed.size() << " elements differ, the first at " << first
                << " (composed " << composed[first] << ", kernels " << direct[first] << ")";
}

inline void expect_ok(const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); }

}  // namespace strata::testing
