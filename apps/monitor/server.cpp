#include "apps/monitor/server.h"

#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "apps/monitor/assets.h"

namespace strata::monitor {

namespace {

// Replaces the one placeholder the pages carry for the shared chart code.
std::string with_charts(std::string_view page) {
  std::string out(page);
  constexpr std::string_view kPlaceholder = "/*@STRATA_CHARTS_JS@*/";
  const size_t at = out.find(kPlaceholder);
  if (at != std::string::npos) out.replace(at, kPlaceholder.size(), assets::kChartsJs);
  return out;
}

// The dashboard fetches its own origin only; inline script and style, nothing from anywhere
// else — which is also what keeps it working offline.
constexpr const char* kDashboardPolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:";

}  // namespace

const std::string& dashboard_page() {
  static const std::string page = with_charts(assets::kDashboardHtml);
  return page;
}

const std::string& report_template() {
  static const std::string page = with_charts(assets::kReportHtml);
  return page;
}

struct MonitorServer::Impl {
  httplib::Server http;
  std::thread listener;
  std::string host;
  int port = 0;
};

MonitorServer::MonitorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MonitorServer::~MonitorServer() {
  impl_->http.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

const std::string& MonitorServer::host() const { return impl_->host; }
int MonitorServer::port() const { return impl_->port; }
std::string MonitorServer::url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}/", v6 ? "[" : "", impl_->host, v6 ? "]" : "", impl_->port);
}

Result<std::unique_ptr<MonitorServer>> MonitorServer::start(const ListenAddress& address, const RunMetrics& metrics) {
  auto impl = std::make_unique<Impl>();
  httplib::Server& http = impl->http;
  // A scraper and a browser or two: two workers are plenty, and bound the threads we add.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // One request per connection: a browser polling over keep-alive would otherwise hold a
  // worker between its polls, and two tabs would leave Prometheus waiting.
  http.set_keep_alive_max_count(1);
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_header("Content-Security-Policy", kDashboardPolicy);
    response.set_header("Cache-Control", "no-store");
    response.set_content(dashboard_page(), "text/html; charset=utf-8");
  });
  http.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics.prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/api/history", [&metrics](const httplib::Request& request, httplib::Response& response) {
    uint64_t since = 0;
    if (request.has_param("since")) {
      const std::string text = request.get_param_value("since");
      char* end = nullptr;
      since = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') {
        response.status = 400;
        response.set_content("since: not a step number\n", "text/plain");
        return;
      }
    }
    response.set_header("Cache-Control", "no-store");
    response.set_content(metrics.history_json(since).dump(), "application/json");
  });
  if (address.port == 0) {
    impl->port = http.bind_to_any_port(address.host);
    if (impl->port < 0) impl->port = 0;
  } else if (http.bind_to_port(address.host, address.port)) {
    impl->port = address.port;
  }
  if (impl->port == 0)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("--serve {}:{}: cannot listen there (the port is in use, or the address is not "
                                  "this machine's); pick another port, or :0 for a free one",
                                  address.host, address.port));
  impl->host = address.host;
  impl->listener = std::thread([&http] { http.listen_after_bind(); });
  return std::unique_ptr<MonitorServer>(new MonitorServer(std::move(impl)));
}

}  // namespace strata::monitor
