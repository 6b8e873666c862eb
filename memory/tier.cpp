// strata/memory/tier.cpp — tier names.
#include "memory/tier.h"

#include <string>

namespace strata::memory {

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

Result<Tier> parse_tier(std::string_view name) {
  if (name == "device") return Tier::device;
  if (name == "host") return Tier::host;
  if (name == "nvme") return Tier::nvme;
  return make_error(ErrorKind::invalid_argument, "unknown tier '" + std::string(name) + "'; use device, host or nvme");
}

}  // namespace strata::memory
