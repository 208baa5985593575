// GradServer: the gRPC server around GradService, with the standard health service
// (grpc.health.v1) and server reflection, bounds on its connections and a graceful shutdown.
//
// Note [The admin address]
// The serving port answers health to anyone (probes need no secret) and, with a token file,
// reflection and GetServerInfo only to clients allowed `reflection` or `info` (Note [Who may
// call] in server/security/token_auth.h). --admin_listen (off by default) adds a second,
// plaintext address with health, reflection and GetServerInfo, for probes, operators and, later,
// metrics on the loopback or the pod's network; a NetworkPolicy keeps it there
// (deploy/k8s/base/networkpolicy.yaml). With it and no token file, GetServerInfo moves there: the
// serving port answers it PERMISSION_DENIED. Reflection, which gRPC installs on every server,
// stays on the serving port too (it describes proto/, which is public); a token file guards it
// there.
//
// Note [Connection limits]
// A client's connections cost the server a file descriptor and gRPC's buffers each, and its
// streams cost memory, whether or not it ever sends a grad call; gRPC's defaults bound none
// of that. GradServer sets, from ServerOptions (flags of the same names):
// - --max_connection_idle (GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 min): a connection without a
//   call for this long gets GOAWAY and is closed; its client reconnects on its next call.
//   Without it, idle connections stay open for good (2,000 of them used up a soft limit of
//   1024 descriptors). 5 min is below the idle timeouts of common load balancers (AWS NLB: 350
//   s), so that the server closes a quiet connection cleanly before a middlebox drops it.
// - --max_connection_age (GRPC_ARG_MAX_CONNECTION_AGE_MS, 30 min, which gRPC varies by +-10%)
//   and --max_connection_age_grace (GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 1 min): a client's
//   channel keeps the replica it first reached, so replicas an autoscaler adds get no old
//   client. Aged out by a graceful GOAWAY, a client reconnects, through the Service, to any
//   replica; calls in flight on the old connection go on for up to the grace, then it is
//   closed. 30 min (the order gRPC's proposal A9 suggests) costs one reconnection per client
//   per half hour.
// - --keepalive_time and --keepalive_timeout (GRPC_ARG_KEEPALIVE_TIME_MS, _TIMEOUT_MS, 1 min
//   and 20 s): the server pings a connection that has been quiet for a minute and closes it if
//   the ping is unanswered for 20 s, cancelling its calls. gRPC's default of 2 h lets a client
//   that vanished (host gone, NAT entry dropped) hold its descriptor, and its calls their
//   engine slots up to their deadlines (maybe none), for hours. The pings go on while a
//   connection has no call (GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA 0) until
//   --max_connection_idle closes it.
// - --min_client_ping_interval (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5 s,
//   with GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS 1 and GRPC_ARG_HTTP2_MAX_PING_STRIKES 2): a
//   client may send keepalive pings this often, with or without calls; after its third ping
//   too early the server sends GOAWAY "too_many_pings" and closes the connection. gRPC's
//   default allows one ping per 5 min with calls and per 2 h without, and so cuts off the
//   common client setting of a keepalive every 10 to 30 s (10 s is the least grpc-go and
//   grpc-java allow); 5 s admits every such client and still stops a flood of pings.
// - --max_concurrent_streams (GRPC_ARG_MAX_CONCURRENT_STREAMS, 100): HTTP/2's
//   SETTINGS_MAX_CONCURRENT_STREAMS. gRPC's default is unlimited: one connection opened
//   10,000 health Watch streams. 100 is the least RFC 9113 says a peer should allow (nginx
//   allows 128, Go 250), and well above --max_in_flight's 32 grad calls; a client with more
//   calls on one connection queues them itself (gRPC's clients do), and `gradserve load`
//   spreads its calls over --connections.
// File descriptors themselves: main raises RLIMIT_NOFILE's soft limit to the hard limit (Note
// [Open files] in server/process/main.cc), and the listener keeps accepting once they run out
// (Note [Our own listening socket] in server/service/listener.h).
//
// Note [Draining]
// Shutdown(grace) (main calls it on SIGTERM: Note [Stop signals] in server/process/main.cc)
// moves clients away at once and lets calls in flight finish:
// 1. Listener::Stop: the port closes, so a new connection is refused.
// 2. Health turns NOT_SERVING: a client watching it (grpc.health.v1.Health/Watch, as gRPC's
//    client-side health checking does) is told at once.
// 3. grpc_server_shutdown_and_notify: GOAWAY on every connection, at once. A client's channel
//    sends no new call on its connection and reconnects, to another replica (round_robin over
//    several addresses, or a Service address that no longer leads here); its calls sent before
//    the GOAWAY reached it run here. (A call that arrives after this point, in the instant the
//    GOAWAY travels, is ended by gRPC before any handler sees it: its client gets CANCELLED,
//    which gRPC 1.51 does not let a server change.)
// 4. Calls in flight go on, uploads still arriving included. Admission stays open: a grad call
//    that reaches GradService now was sent before its client saw the GOAWAY (or is a stream
//    that began before it and has only now fully arrived), so it is served, not refused.
// 5. The drain ends when gRPC has finished every call; or 2 s after the last grad call ended
//    (admitted or still uploading) if something else is still open, such as a health Watch
//    stream, which never ends by itself (the 2 s let the last responses flush); or when the
//    grace period ends. What is still open then is cancelled, after GradService::StartDraining,
//    so that nothing is admitted meanwhile. An upload whose client stalls is ended by
//    --upload_idle_timeout, as at any other time.
// What a Kubernetes readiness probe sees from step 1 on: a refused connection, so the probe
// fails and the pod is not ready, as NOT_SERVING would make it. It cannot be answered
// NOT_SERVING instead: gRPC 1.51 cannot send GOAWAY without refusing new calls, health checks
// included, and a probe makes a new connection each time. Kubernetes takes a terminating pod
// out of its Service's endpoints by itself; deploy/k8s/base/deployment.yaml's preStop sleep keeps
// the server serving until that has reached every node, so that clients' reconnections after
// the GOAWAY go to the other replicas.

#ifndef GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_
#define GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/metrics/metrics_endpoint.h"
#include "server/security/server_security.h"
#include "server/service/grad_service.h"
#include "server/service/listener.h"
#include "server/service/server_options.h"

namespace gradserve::server {

// Thread safety: Shutdown may be called from any thread, but not from two at once; a second
// call returns at once. The accessors may be called from any thread. The destructor shuts down
// (with no grace period) if Shutdown was not called.
class GradServer {
 public:
  // Builds and starts the server on options.listen_address. UNAVAILABLE if the address cannot
  // be bound; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<GradServer>> Start(const ServerOptions& options);
  ~GradServer();

  // The port actually bound (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // The admin address's port (Note [The admin address]); 0 without --admin_listen.
  int admin_port() const { return admin_port_; }
  // The metrics address's port (Note [The metrics address]); 0 without --metrics_listen.
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  // For the start-up log: "tls: on; tokens: 3 clients of 2 tenants; ..." (SetUpSecurity).
  const std::string& security_line() const { return security_.description; }
  // The server's memory sizing, for the start-up log: "memory: 14.1 GiB for requests
  // (--max_server_memory_bytes), ... of 23.5 GiB (physical memory)".
  const std::string& memory_line() const { return memory_line_; }
  GradService& service() { return *service_; }
  // Connections accepted, and connections closed at once for want of file descriptors (Note
  // [Our own listening socket] in server/service/listener.h).
  int64_t connections_accepted() const { return listener_->accepted(); }
  int64_t connections_shed() const { return listener_->shed(); }

  // Note [Draining]: the port closed, health NOT_SERVING and GOAWAY on every connection at
  // once; calls in flight may finish within `grace`, then whatever is left is cancelled and
  // the server stops. Returns true if every admitted grad call finished within the grace
  // period (a second call: what the first returned).
  bool Shutdown(absl::Duration grace);

 private:
  GradServer() = default;

  class AdminService;

  ServerSecurity security_;               // the serving port's credentials and TokenAuth
  std::unique_ptr<GradService> service_;  // outlives server_ and admin_server_
  std::unique_ptr<Listener> listener_;    // stopped before server_ shuts down
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<AdminService> admin_service_;  // outlives admin_server_
  std::unique_ptr<grpc::Server> admin_server_;   // null without --admin_listen
  // Declared after service_, which its scrapes read: destroyed (stopped) before it.
  std::unique_ptr<metrics::MetricsEndpoint> metrics_;  // null without --metrics_listen
  int port_ = 0;
  int admin_port_ = 0;
  std::string memory_line_;
  bool shut_down_ = false;
  bool drained_ = false;  // what Shutdown returned
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_GRAD_SERVER_H_
