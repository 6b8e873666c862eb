// common/listen_address.cpp — the HOST:PORT parser (listen_address.h).
#include "common/listen_address.h"

#include <fmt/format.h>

namespace strata {

Result<ListenAddress> parse_listen_address(const std::string& text, const std::string& what) {
  ListenAddress address;
  std::string port_text = text;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    address.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    // [::1]:8080 — brackets around an IPv6 address.
    if (address.host.size() >= 2 && address.host.front() == '[' && address.host.back() == ']')
      address.host = address.host.substr(1, address.host.size() - 2);
  }
  if (address.host.empty()) address.host = "127.0.0.1";
  bool digits = !port_text.empty() && port_text.size() <= 5;
  for (char c : port_text) digits = digits && c >= '0' && c <= '9';
  if (!digits || std::stoi(port_text) > 65535)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}'{}' is not HOST:PORT, :PORT or PORT (port 0..65535; 0 picks a free one)",
                                  what.empty() ? "" : what + ": ", text));
  address.port = std::stoi(port_text);
  return address;
}

}  // namespace strata
