// GradServer: the gRPC server around GradService, with the standard health service
// (grpc.health.v1) and server reflection, and a graceful shutdown.

#ifndef GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_
#define GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/service/grad_service.h"
#include "server/service/listener.h"
#include "server/service/server_options.h"

namespace gradserve::server {

// Thread safety: Shutdown may be called from any thread, once; the accessors from any thread.
// The destructor shuts down (with no grace period) if Shutdown was not called.
class GradServer {
 public:
  // Builds and starts the server on options.listen_address. UNAVAILABLE if the address cannot
  // be bound; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<GradServer>> Start(const ServerOptions& options);
  ~GradServer();

  // The port actually bound (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // The server's memory sizing, for the start-up log: "memory: 14.1 GiB for requests
  // (--max_server_memory_bytes), ... of 23.5 GiB (physical memory)".
  const std::string& memory_line() const { return memory_line_; }
  GradService& service() { return *service_; }
  // Connections accepted, and connections closed at once for want of file descriptors (Note
  // [Our own listening socket] in server/service/listener.h).
  int64_t connections_accepted() const { return listener_->accepted(); }
  int64_t connections_shed() const { return listener_->shed(); }

  // Graceful shutdown: health turns NOT_SERVING, new grad calls get UNAVAILABLE, calls in
  // flight may finish within `grace`, then whatever is left is cancelled and the server stops.
  // Returns true if every admitted call finished within the grace period.
  bool Shutdown(absl::Duration grace);

 private:
  GradServer() = default;

  std::unique_ptr<GradService> service_;  // outlives server_
  std::unique_ptr<Listener> listener_;    // stopped before server_ shuts down
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string memory_line_;
  bool shut_down_ = false;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_
