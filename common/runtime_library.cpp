// Finds NVIDIA's run-time libraries (common/runtime_library.h).
#include "common/runtime_library.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/log.h"

namespace strata {
namespace {

// The path the loader actually mapped (dlopen by bare soname does not say where it found it).
std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0')
    return map->l_name;
  return fallback;
}

// Every file matching `pattern`, sorted (glob's order), none when nothing matches.
std::vector<std::string> matches(const std::string& pattern) {
  std::vector<std::string> found;
  glob_t result{};
  if (glob(pattern.c_str(), 0, nullptr, &result) == 0) {
    for (size_t i = 0; i < result.gl_pathc; ++i) found.emplace_back(result.gl_pathv[i]);
  }
  globfree(&result);
  return found;
}

// Steps 2 and 3 of the header's search order: the toolkit's folders as full paths, and the
// site-packages folders whose nvidia/*/lib/ may hold a wheel's copy.
struct Candidates {
  std::vector<std::string> paths;         // to try one by one, in order
  std::vector<std::string> wheel_globs;   // what was searched for wheels (for the error line)
};

Candidates candidate_paths(const std::string& soname) {
  Candidates found;
  auto add = [&found](std::string path) {
    for (const std::string& seen : found.paths)
      if (seen == path) return;  // $CUDA_HOME is usually /usr/local/cuda itself
    found.paths.push_back(std::move(path));
  };
  if (const char* cuda_home = std::getenv("CUDA_HOME"); cuda_home != nullptr && cuda_home[0] != '\0')
    add(std::string(cuda_home) + "/lib64/" + soname);
  add("/usr/local/cuda/lib64/" + soname);
  add("/usr/local/cuda/targets/x86_64-linux/lib/" + soname);
  // Where pip puts wheels: the system's and a venv's site-packages, the user's, conda's.
  std::vector<std::string> prefixes = {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                                       "/usr/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
                                       "/opt/conda/lib/python3*/site-packages"};
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv != nullptr && venv[0] != '\0')
    prefixes.insert(prefixes.begin(), std::string(venv) + "/lib/python3*/site-packages");
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0')
    prefixes.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  for (const std::string& prefix : prefixes) {
    const std::string pattern = prefix + "/nvidia/*/lib/" + soname;
    found.wheel_globs.push_back(pattern);
    for (std::string& path : matches(pattern)) add(std::move(path));
  }
  return found;
}

}  // namespace

RuntimeLibrary open_runtime_library(const char* soname) {
  RuntimeLibrary library;
  library.handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (library.handle != nullptr) {
    library.path = loaded_path(library.handle, soname);
  } else {
    library.tried = std::string("the loader's search path");
    // A candidate that exists but does not load (a missing dependency, a wrong ABI) is worth
    // naming: the last loader error that is not "no such file" is kept for the error line.
    const char* first_error = dlerror();
    std::string last_error = first_error != nullptr && std::string(first_error).find("No such file") == std::string::npos
                                 ? first_error : "";
    const Candidates candidates = candidate_paths(soname);
    for (const std::string& path : candidates.paths) {
      library.tried += ", " + path;
      library.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library.handle != nullptr) {
        library.path = loaded_path(library.handle, path);
        break;
      }
      const char* text = dlerror();
      if (text != nullptr && std::string(text).find("No such file") == std::string::npos) last_error = text;
    }
    if (library.handle == nullptr) {
      for (const std::string& pattern : candidates.wheel_globs) library.tried += ", " + pattern;
      if (!last_error.empty()) library.tried += " (" + last_error + ")";
    }
  }
  if (library.handle != nullptr) {
    library.tried.clear();
    spdlog::debug("loaded {} from {}", soname, library.path);
  } else {
    spdlog::debug("{} not found; tried {}", soname, library.tried);
  }
  return library;
}

}  // namespace strata
