// strata/common/mix.h — SplitMix64's finaliser: one well-mixed 64-bit value per 64-bit key, the
// same on every platform and in every language that has 64-bit unsigned arithmetic (the Python
// references reimplement it in a few lines). The one counter-based hash strata keys its
// deterministic draws by: random init (models/model_layout.cpp), held-out example splits
// (data/examples.cpp), LoRA's dropout keys and masks (train/trainer.cpp, kernels/lora — on the
// device too, hence host-and-device under nvcc).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define STRATA_MIX_HOST_DEVICE __host__ __device__
#else
#define STRATA_MIX_HOST_DEVICE
#endif

namespace strata {

STRATA_MIX_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t value) {
  value += 0x9e3779b97f4a7c15ull;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

}  // namespace strata
