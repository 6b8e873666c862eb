// fuzz/fuzz_hf_index.cpp — libFuzzer harness: any bytes as model.safetensors.index.json. The
// parser must return a weight map or one invalid_argument error, and every file name it
// accepts must stay in the folder by its spelling (one path component, not . or ..).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/hf/hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto map = strata::hf::parse_index_json(text, "model.safetensors.index.json");
  if (!map.ok()) {
    if (map.error().kind != strata::ErrorKind::invalid_argument) std::abort();
    return 0;
  }
  for (const auto& [name, file] : *map)
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos)
      std::abort();
  return 0;
}
