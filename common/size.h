// strata/common/size.h — byte sizes as people write them.
//
// Contract: `parse_size` accepts plain bytes ("4096") or a number with a binary unit
// ("512KiB", "1MiB", "4GiB", "1TiB"; also "K"/"M"/"G"/"T" and "KB"/"MB"/"GB" meaning the
// same binary units, as fio does). Fractions are allowed with a unit ("1.5GiB") and must
// come out to a whole number of bytes. Anything else is an `invalid_argument` error that
// repeats the text and lists the accepted forms. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

[[nodiscard]] Result<uint64_t> parse_size(std::string_view text);
// "64 MiB", "1.50 GiB", "512 B": for logs and tables.
std::string format_size(uint64_t size_bytes);
// The sizes text, for help and error messages.
inline constexpr const char* kSizeFormsHelp = "plain bytes (4096) or a binary unit: 512KiB, 1MiB, 4GiB";

constexpr uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr uint64_t align_down(uint64_t value, uint64_t alignment) {
  return value / alignment * alignment;
}
constexpr bool is_power_of_two(uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

}  // namespace strata
