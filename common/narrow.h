// strata/common/narrow.h — checked narrowing of sizes for APIs that take `int` (cuBLAS).
//
// Sizes are int64_t everywhere in strata; cuBLAS and some CUDA launch parameters take int.
// A silent static_cast<int> of a dimension past INT_MAX wraps to a negative or small number
// and cuBLAS then reads or writes the wrong memory. Callers check with `all_fit_int` first and
// return an error naming the call. Header-only, no state, any thread.
#pragma once

#include <climits>
#include <cstdint>
#include <initializer_list>

namespace strata {

// True when every value is in [0, INT_MAX] (a negative size is as wrong as a huge one).
[[nodiscard]] constexpr bool all_fit_int(std::initializer_list<int64_t> values) {
  for (int64_t value : values)
    if (value < 0 || value > INT_MAX) return false;
  return true;
}

}  // namespace strata
