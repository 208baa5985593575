// MetricsEndpoint: GET /metrics over plain HTTP on its own address, for Prometheus.
//
// Note [The metrics address]
// Prometheus scrapes HTTP, and gRPC's ports speak HTTP/2 only to gRPC, so the metrics live on an
// address of their own, --metrics_listen (off by default), served by Debian's cpp-httplib rather
// than a parser of our own. It belongs to the admin surface (Note [The admin address] in
// server/service/grad_server.h): plaintext and unauthenticated, meant for a private network or
// a loopback sidecar, never the serving port's clients. It serves GET /metrics and nothing
// else (404), answers from its own few threads, so a slow scraper never takes an engine or
// gRPC thread, bounds what it reads (a request line and headers, no body) and times out idle
// connections. A scrape renders the metrics at once (Note [Metrics without a lock]); it holds
// no lock that a grad call takes.

#ifndef GRADSERVE_SERVER_METRICS_METRICS_ENDPOINT_H_
#define GRADSERVE_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace gradserve::server::metrics {

// Thread safety: render is called from the endpoint's threads, several at once if several
// scrapes come at once. The destructor stops the endpoint and waits for its threads.
class MetricsEndpoint {
 public:
  // Listens on address (host:port; port 0 picks a free one) and answers GET /metrics with
  // render(), in the text format. UNAVAILABLE if address cannot be bound, INVALID_ARGUMENT if
  // it is not host:port.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::function<std::string()> render);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint();

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;  // runs http_'s accept loop
  int port_ = 0;
};

}  // namespace gradserve::server::metrics

#endif  // GRADSERVE_SERVER_METRICS_METRICS_ENDPOINT_H_
