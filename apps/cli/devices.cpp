// `strata devices`: the accelerators this process can use, and which cuBLAS and NCCL it would
// load (both are found at run time: common/runtime_library.h). The first thing a GPU check
// asks: its exit code tells "no GPU here" (77, Meson's skip code, one line) from "a GPU that
// does not work" (1), so a bare machine without a GPU skips honestly and a broken one fails.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "comm/comm.h"
#include "apps/cli/commands.h"
#include "strata_build_config.h"

#if STRATA_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cublas_loader.h"
#endif

namespace strata::cli {
namespace {

constexpr int kExitNoDevice = 77;

// Fills `out` and returns the exit code: 0 with at least one usable device, 77 without one
// (no device, no driver, or a build without CUDA), 1 when CUDA reports anything else.
int describe_devices(nlohmann::json& out) {
  out["built_with_cuda"] = STRATA_HAVE_CUDA != 0;
  out["built_with_nccl"] = STRATA_HAVE_NCCL != 0;
  out["cuda_devices"] = 0;
#if !STRATA_HAVE_CUDA
  out["why"] = "this build has no CUDA";
  return kExitNoDevice;
#else
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  // Without a device or without a driver (libcuda missing or older than the runtime) there is
  // nothing to check: a skip. Every other answer is a fault worth failing on.
  if (probe == cudaErrorNoDevice || probe == cudaErrorInsufficientDriver || (probe == cudaSuccess && count == 0)) {
    out["why"] = fmt::format("no CUDA device ({})", probe == cudaSuccess ? "device count 0" : cudaGetErrorString(probe));
    return kExitNoDevice;
  }
  if (probe != cudaSuccess) {
    out["error"] = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorString(probe), cudaGetErrorName(probe));
    return 1;
  }
  out["cuda_devices"] = count;
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  out["driver_version"] = fmt::format("{}.{}", driver / 1000, driver % 1000 / 10);
  out["runtime_version"] = fmt::format("{}.{}", runtime / 1000, runtime % 1000 / 10);
  nlohmann::json list = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (const cudaError_t code = cudaGetDeviceProperties(&prop, i); code != cudaSuccess) {
      out["error"] = fmt::format("cudaGetDeviceProperties({}) failed: {}", i, cudaGetErrorString(code));
      return 1;
    }
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      out["error"] = fmt::format("device {} ({}) does not open a context", i, prop.name);
      return 1;
    }
    list.push_back({{"index", i},
                    {"name", prop.name},
                    {"compute_capability", fmt::format("{}.{}", prop.major, prop.minor)},
                    {"memory_bytes", total_bytes},
                    {"free_bytes", free_bytes},
                    {"multiprocessors", prop.multiProcessorCount}});
  }
  out["devices"] = list;
  const RuntimeLibrary& cublas = kernels::cublas_runtime_library();
  if (cublas.handle != nullptr) out["cublas"] = cublas.path;
  else out["cublas_error"] = "not found; tried " + cublas.tried;
  Result<std::string> nccl = comm::find_nccl_library();
  if (nccl.ok()) out["nccl"] = *nccl;
  else out["nccl_error"] = nccl.error().message;
  return 0;
#endif
}

}  // namespace

void add_devices_command(CLI::App& app, CliState& state) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "devices",
      "List the CUDA devices this process sees and the cuBLAS and NCCL it would load. Exit 0 with a device, 77 "
      "without one (no device or no driver), 1 when CUDA fails otherwise.");
  command->add_flag("--json", *json, "print one JSON object on stdout");
  command->callback([json, &state] {
    nlohmann::json out;
    state.exit_code = describe_devices(out);
    if (*json) {
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    if (state.exit_code == kExitNoDevice) {
      std::printf("no GPU: %s\n", out.value("why", std::string("no CUDA device")).c_str());
      return;
    }
    if (state.exit_code != 0) {
      spdlog::error("{}", out.value("error", std::string("CUDA failed")));
      return;
    }
    for (const auto& device : out["devices"])
      std::printf("cuda:%d %s (sm %s, %.1f GiB)\n", device["index"].get<int>(),
                  device["name"].get<std::string>().c_str(), device["compute_capability"].get<std::string>().c_str(),
                  static_cast<double>(device["memory_bytes"].get<size_t>()) / (1ull << 30));
    std::printf("cuBLAS: %s\nNCCL: %s\n",
                out.contains("cublas") ? out["cublas"].get<std::string>().c_str()
                                       : out.value("cublas_error", std::string()).c_str(),
                out.contains("nccl") ? out["nccl"].get<std::string>().c_str()
                                     : out.value("nccl_error", std::string()).c_str());
  });
}

}  // namespace strata::cli
