#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace strata {

Status set_log_level(std::string_view level_name) {
  static const bool logger_made = [] {
    auto logger = spdlog::stderr_color_mt("strata");
    logger->set_pattern("%^[%L]%$ %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)logger_made;
  spdlog::level::level_enum level = spdlog::level::from_str(std::string(level_name));
  if (level == spdlog::level::off && level_name != "off")
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--log-level '{}' is not accepted; use one of {}", level_name, kLogLevels));
  spdlog::set_level(level);
  return Status();
}

}  // namespace strata
