// Listener: the server's listening sockets and the thread that accepts on them, handing each
// connection to gRPC.
//
// Note [Our own listening socket]
// gRPC 1.51's listener (src/core/lib/iomgr/tcp_server_posix.cc, on_read) stops for good on
// any accept error but EINTR and EAGAIN: once the process runs out of file descriptors
// (EMFILE), say under 2,000 idle connections at a soft limit of 1024, the port accepts nothing
// until the process restarts, although the connections already open keep working. (Later gRPC
// releases retry instead; Debian 12 ships 1.51.) So GradServer does not give gRPC its address:
// Listener binds it, accepts on a thread of its own and hands each connection to gRPC through
// an ExternalConnectionAcceptor (ServerBuilder::experimental()), where it is served as gRPC's
// own listener's connections are: the same channel arguments (Note [Connection limits] in
// server/service/grad_server.h), the same credentials and the same resource quota. One thing
// gRPC's listener does that this path skips: it closes a new connection at once while that
// quota (--grpc_memory_bytes) is under high pressure; here the connection is served, and the
// quota still bounds what it buffers.
//
// Out of descriptors, Listener sheds instead of stopping: it keeps one descriptor in reserve
// (/dev/null), closes it, accepts the waiting connection, closes that at once (its client
// sees the connection closed and tries again, later or elsewhere) and reopens the reserve.
// Should even that fail, it waits 100 ms and tries again. Either way, once descriptors are
// free again (the attacker's connections closed, or closed by --max_connection_idle), new
// connections are served. It logs at most one line per 10 s about shed connections.
//
// Stop closes the listening sockets (a new connection is refused from then on) and joins the
// thread. gRPC's acceptor neither serves nor closes a connection handed to it after the
// server began to shut down (it logs and leaks the descriptor), so GradServer stops the
// Listener before it shuts gRPC down (Note [Draining]).

#ifndef GRADSERVE_SERVER_SERVICE_LISTENER_H_
#define GRADSERVE_SERVER_SERVICE_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server_builder.h"

namespace gradserve::server {

// Thread safety: Bind, then Start once the gRPC server has started, then Stop, from one
// thread or with the caller's own ordering; accepted() and shed() from any thread. The
// destructor stops it.
class Listener {
 public:
  // Binds address, "host:port": an IPv4 address, an IPv6 address in brackets, or a name
  // (every address it resolves to, on the same port); 0.0.0.0 and [::] listen on every
  // address, IPv4 and IPv6 alike where the host has IPv6. Port 0 picks a free port.
  // UNAVAILABLE if nothing can be bound, INVALID_ARGUMENT if address is no host:port.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& address);
  ~Listener();

  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The port bound.
  int port() const { return port_; }

  // Starts accepting on a new thread; each connection goes to acceptor. Call once, after the
  // gRPC server the acceptor belongs to has started.
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Closes the listening sockets, so that new connections are refused, and joins the thread.
  // Connections already handed over are gRPC's and stay open. Idempotent.
  void Stop();

  // Connections handed to gRPC, and connections closed at once for want of descriptors.
  int64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  int64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  Listener() = default;

  // The accepting thread's loop, until Stop.
  void Run();
  // Accepts what waits on listening socket fd; returns how long to pause before polling again
  // (0: none).
  int AcceptAll(int fd);
  // Out of descriptors: closes one waiting connection on fd using the reserve. True if it did.
  bool Shed(int fd);

  std::vector<int> sockets_;  // listening, non-blocking; closed by Stop
  int port_ = 0;
  int wake_ = -1;     // an eventfd; Stop writes it to end Run
  int reserve_ = -1;  // an open /dev/null, spent by Shed; the thread's alone
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;
  bool stopped_ = false;
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> shed_{0};
  int64_t shed_logged_ = 0;  // the thread's: shed_ when it last logged
  int64_t last_log_us_ = 0;  // the thread's: when it last logged, monotonic
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_LISTENER_H_
