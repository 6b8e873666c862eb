// strata/common/runtime_library.h — finds and opens NVIDIA's run-time libraries (cuBLAS, NCCL)
// where a machine keeps them, instead of linking them at build time.
//
// Why: strata's binaries travel to GPU machines that have the driver, the CUDA toolkit and
// PyTorch's pip wheels but not necessarily the build machine's paths, and libcublas/libnccl are
// hundreds of MB: they never travel with strata (scripts/gpu-bundle.sh). The search order is
//   1. the dynamic loader's own (LD_LIBRARY_PATH, the binary's run path, ldconfig's cache),
//   2. the CUDA toolkit: $CUDA_HOME/lib64, then /usr/local/cuda/lib64 and its targets folder,
//   3. pip wheels: <site-packages>/nvidia/*/lib/ under the usual Python prefixes (nvidia-cublas
//      puts CUDA 13's libraries in nvidia/cu13/lib, nvidia-nccl in nvidia/nccl/lib).
// $CUDA_HOME is read here, not passed down from a config, because it is the toolkit's own
// convention for where it lives (nvcc and PyTorch read it the same way).
//
// Contract: the handle is never closed (the library stays loaded for the process's life, as a
// linked library would). Thread-safe: dlopen is; callers cache the result in a function-local
// static.
#pragma once

#include <string>

namespace strata {

struct RuntimeLibrary {
  void* handle = nullptr;   // dlopen's handle; nullptr when no candidate loaded
  std::string path;         // the file that was loaded (as the loader resolved it)
  std::string tried;        // when not loaded: every place tried, and the last dlerror, for one error line
};

// Opens `soname` (e.g. "libcublas.so.13") from the first place above that has it, RTLD_NOW |
// RTLD_LOCAL. Logs the path at debug level.
RuntimeLibrary open_runtime_library(const char* soname);

}  // namespace strata
