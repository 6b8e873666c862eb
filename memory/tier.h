// strata/memory/tier.h — the three tiers a tensor's copy can live in, and their names: one enum
// and one set of names for the whole engine (configs, placement, `strata plan`, the monitor).
//
// What lives where, at run time, is the scheduler's residency books (scheduler/scheduler.cpp);
// this header only names the tiers. Thread-free, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace strata::memory {

enum class Tier : uint8_t { device = 0, host = 1, nvme = 2 };
inline constexpr size_t kTierCount = 3;
const char* tier_name(Tier tier);                                // "device" | "host" | "nvme"
[[nodiscard]] Result<Tier> parse_tier(std::string_view name);  // invalid_argument naming the accepted ones

}  // namespace strata::memory
