#include "common/size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace strata {

Result<uint64_t> parse_size(std::string_view text) {
  auto fail = [&] {
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("'{}' is not a size; use {}", text, kSizeFormsHelp));
  };
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  size_t number_begin = pos;
  bool seen_dot = false;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || (text[pos] == '.' && !seen_dot))) {
    seen_dot |= text[pos] == '.';
    ++pos;
  }
  std::string number(text.substr(number_begin, pos - number_begin));
  if (number.empty() || number == ".") return fail();
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string unit;
  for (; pos < text.size(); ++pos) {
    if (std::isspace(static_cast<unsigned char>(text[pos]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[pos])));
  }
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos != text.size()) return fail();

  uint64_t multiplier = 0;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") multiplier = kKiB;
  else if (unit == "m" || unit == "mb" || unit == "mib") multiplier = kMiB;
  else if (unit == "g" || unit == "gb" || unit == "gib") multiplier = kGiB;
  else if (unit == "t" || unit == "tb" || unit == "tib") multiplier = 1024 * kGiB;
  else return fail();

  if (!seen_dot) {
    uint64_t value = 0;
    for (char digit : number) {
      uint64_t next = value * 10 + static_cast<uint64_t>(digit - '0');
      if (next / 10 != value) return fail();  // overflow
      value = next;
    }
    if (value != 0 && multiplier > UINT64_MAX / value) return fail();
    return value * multiplier;
  }
  // strtod, not stod: a number too long for a double (hundreds of digits) is a refusal, not an
  // out_of_range exception (fuzz/regressions/size/ holds the input that found it).
  double value = std::strtod(number.c_str(), nullptr) * static_cast<double>(multiplier);
  if (!std::isfinite(value) || value > 1.8e19 || value != std::floor(value)) return fail();
  return static_cast<uint64_t>(value);
}

std::string format_size(uint64_t size_bytes) {
  if (size_bytes >= kGiB && size_bytes % kGiB == 0) return fmt::format("{} GiB", size_bytes / kGiB);
  if (size_bytes >= kGiB) return fmt::format("{:.2f} GiB", static_cast<double>(size_bytes) / kGiB);
  if (size_bytes >= kMiB && size_bytes % kMiB == 0) return fmt::format("{} MiB", size_bytes / kMiB);
  if (size_bytes >= kMiB) return fmt::format("{:.2f} MiB", static_cast<double>(size_bytes) / kMiB);
  if (size_bytes >= kKiB && size_bytes % kKiB == 0) return fmt::format("{} KiB", size_bytes / kKiB);
  if (size_bytes >= kKiB) return fmt::format("{:.2f} KiB", static_cast<double>(size_bytes) / kKiB);
  return fmt::format("{} B", size_bytes);
}

}  // namespace strata
