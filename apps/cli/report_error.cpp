// strata — how every command reports an error: one line, and the exit code it maps to. In the
// engine library (not main.cpp) so that tests and fuzz harnesses linking the library resolve
// it too.
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/cli/commands.h"

namespace strata::cli {

std::string one_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

int report_error(const Error& error) {
  spdlog::error("{}", one_line(error.to_string()));
  return error.kind == ErrorKind::invalid_argument ? 2 : 1;
}

}  // namespace strata::cli
