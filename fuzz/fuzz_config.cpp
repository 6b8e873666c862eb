// fuzz/fuzz_config.cpp — libFuzzer harness: any bytes as a `strata train` YAML config. The
// loader and every section's validation must return a config or one error; nothing may
// throw, crash or hang. Paths in the input resolve against a scratch folder that holds an
// `nvme` folder and a small data file, so the checks past the path checks are reached too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/config_reader.h"
#include "run/train_config.h"

namespace {

std::string scratch_folder() {
  static const std::string folder = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "strata-fuzz-config-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    std::filesystem::create_directories(std::filesystem::path(pattern) / "nvme");
    std::ofstream(std::filesystem::path(pattern) / "data.txt") << std::string(4096, 'a');
    return pattern;
  }();
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  strata::Result<strata::ConfigNode> root = strata::ConfigNode::load_string(text, scratch_folder() + "/train.yaml");
  if (!root.ok()) return 0;
  (void)strata::parse_train_config(std::move(root).value());
  return 0;
}
