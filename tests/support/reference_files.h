// tests/support/reference_files.h — what the tests that check kernels against a PyTorch script
// share: raw little-endian files in and out, and the error metric (max|a − b| / max|b|).
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata::testing {

template <typename T>
void write_raw(const std::string& path, const T* data, size_t count) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(T)));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<double> read_f64(const std::string& path, size_t count) {
  std::vector<double> values(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 8));
  EXPECT_TRUE(in.good() && in.gcount() == static_cast<std::streamsize>(count * 8)) << path;
  return values;
}

// max|a − b| / max|b|; a tensor whose reference is all zero must match exactly.
inline double relative_error(const float* ours, const std::vector<double>& reference) {
  double max_diff = 0.0;
  double max_ref = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(ours[i]) - reference[i]));
    max_ref = std::max(max_ref, std::abs(reference[i]));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}

}  // namespace strata::testing
