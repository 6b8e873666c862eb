// strata/device/backend.h — the interface for device backend authors (CPU, CUDA).
//
// Users hold `Stream` and `Event` (device.h); those own one of these. A backend's Device
// implementation downcasts them to its own types — a stream of one device must never be given
// to another device (asserted by the backends through `owner`).
#pragma once

#include <string>

#include "device/device.h"
#include "strata_build_config.h"

namespace strata::device {

class StreamBackend {
 public:
  virtual ~StreamBackend() = default;
  virtual const std::string& name() const = 0;
  virtual void* native_handle() const = 0;
  virtual const Device* owner() const = 0;
};

class EventBackend {
 public:
  virtual ~EventBackend() = default;
  virtual const Device* owner() const = 0;
};

#if STRATA_HAVE_CUDA
// device/cuda_device.cpp: only in CUDA builds.
[[nodiscard]] Result<std::unique_ptr<Device>> make_cuda_device(uint64_t budget_bytes, int ordinal);
int cuda_device_count_impl();
[[nodiscard]] Result<int> cuda_device_count_checked_impl();
#endif

}  // namespace strata::device
