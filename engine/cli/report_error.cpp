// strata — how every command reports an error: one line, and the exit code it maps to. In the
// engine library (not main.cpp) so that tests and fuzz harnesses linking the library resolve
// it too.
#include <spdlog/spdlog.h>

#include "engine/cli/commands.h"

namespace strata::cli {

int report_error(const Error& error) {
  spdlog::error("{}", error.to_string());
  return error.kind == ErrorKind::invalid_argument ? 2 : 1;
}

}  // namespace strata::cli
