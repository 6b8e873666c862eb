// tests/support/temp_dir.h — a scratch folder per test, removed when the test ends.
// Lives under $STRATA_TEST_TMPDIR (set by meson to the build tree, so O_DIRECT is tried on
// the same filesystem as the checkout) or /tmp.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

namespace strata::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("STRATA_TEST_TMPDIR");
    std::filesystem::path root = base != nullptr ? base : "/tmp";
    std::filesystem::create_directories(root);
    std::string pattern = (root / "strata-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::testing
