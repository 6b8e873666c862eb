// strata/apps/monitor/server.h — the read-only HTTP endpoint of a run (`--serve`).
//
// Contract: `MonitorServer::start` binds the address before it returns — a port in use is an
// error then (invalid_argument: exit 2), before any training work — and serves on its own
// threads (one listener, two workers) until the server is destroyed. It serves only what is
// built into the binary and what `RunMetrics` holds; nothing from the filesystem, GET only:
//   GET /                    the dashboard (assets/dashboard.html with charts.js inlined)
//   GET /metrics             Prometheus text format 0.0.4
//   GET /api/history?since=N the run and its steps after N, as JSON (the charts' shape)
// Every other path is 404. `RunMetrics` must outlive the server.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "apps/monitor/monitor.h"

namespace strata::monitor {

class MonitorServer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<MonitorServer>> start(const ListenAddress& address,
                                                                     const RunMetrics& metrics);
  ~MonitorServer();  // stops serving and joins the threads
  MonitorServer(const MonitorServer&) = delete;
  MonitorServer& operator=(const MonitorServer&) = delete;

  const std::string& host() const;
  int port() const;  // the bound port (the one the system picked when asked for 0)
  std::string url() const;

  struct Impl;

 private:
  explicit MonitorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The pages built into the binary (generated from apps/monitor/assets/ at build time).
const std::string& dashboard_page();  // charts.js inlined
const std::string& report_template(); // charts.js inlined; the data goes where it says

}  // namespace strata::monitor
