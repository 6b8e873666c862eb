// fuzz/fuzz_manifest.cpp — libFuzzer harness: any bytes as a store's manifest.json, opened
// read-only over a real 1 MiB data file. Store::open must refuse or open; an opened store is
// listed and verified (its checksums read from the data file). Nothing may crash or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "memory/store.h"

namespace {

std::string store_folder() {
  static const std::string folder = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "strata-fuzz-manifest-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    std::ofstream(std::filesystem::path(pattern) / "data.strata") << std::string(1 << 20, '\x11');
    return pattern;
  }();
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = store_folder();
  {
    std::ofstream manifest(dir + "/manifest.json", std::ios::binary | std::ios::trunc);
    manifest.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  strata::memory::StoreOptions options;
  options.read_only = true;
  options.engine.backend = strata::io::Backend::psync;
  options.engine.queue_depth = 4;
  strata::Result<strata::memory::Store> store = strata::memory::Store::open(dir, options);
  if (store.ok()) {
    (void)store->list();
    (void)store->verify();
  }
  return 0;
}
