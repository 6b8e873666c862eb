// strata/common/listen_address.h — an address to listen on, as a user writes it (`--serve`,
// the config's `monitor.serve`): "HOST:PORT", ":PORT" or "PORT" → host and port; a missing host
// is 127.0.0.1 (loopback unless an address is given), "[::1]:8080" an IPv6 host. `what` names
// the flag or key in the error (empty: the caller names it).
#pragma once

#include <string>

#include "common/status.h"

namespace strata {

struct ListenAddress {
  std::string host;
  int port = 0;  // 0: the system picks a free port
};
[[nodiscard]] Result<ListenAddress> parse_listen_address(const std::string& text, const std::string& what);

}  // namespace strata
