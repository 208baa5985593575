#include "server/metrics/metrics_endpoint.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/host_port.h"
#include "server/metrics/text_format.h"

namespace gradserve::server::metrics {

MetricsEndpoint::MetricsEndpoint() = default;

MetricsEndpoint::~MetricsEndpoint() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::function<std::string()> render) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address, "--metrics_listen");
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint);
  endpoint->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *endpoint->http_;
  // Note [The metrics address]: small and bounded; a scrape has no body.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.set_read_timeout(5);
  http.set_write_timeout(5);
  http.set_keep_alive_timeout(30);
  http.set_keep_alive_max_count(100);
  http.set_payload_max_length(0);
  http.Get("/metrics", [render = std::move(render)](const httplib::Request& /*request*/,
                                                    httplib::Response& response) {
    response.set_content(render(), kTextContentType);
  });
  endpoint->port_ = parsed->port == 0 ? http.bind_to_any_port(parsed->host)
                    : http.bind_to_port(parsed->host, parsed->port) ? parsed->port
                                                                    : -1;
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --metrics_listen ", address));
  }
  endpoint->thread_ = std::thread([&http] { http.listen_after_bind(); });
  return endpoint;
}

}  // namespace gradserve::server::metrics
