// strata/common/log.h — logging set-up.
//
// Contract: logs go to stderr through spdlog's default logger (so `--json` output on stdout
// stays machine-readable). `set_log_level` accepts trace|debug|info|warn|error|off and is
// called once by the CLI before any work; library code only logs, never configures.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace strata {

[[nodiscard]] Status set_log_level(std::string_view level_name);
inline constexpr const char* kLogLevels = "trace, debug, info, warn, error, off";

}  // namespace strata
