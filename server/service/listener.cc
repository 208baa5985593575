#include "server/service/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/host_port.h"
#include "server/base/log.h"

namespace gradserve::server {
namespace {

// How long the thread waits before it tries again when accepting cannot go on now (no
// descriptor even after shedding, no kernel memory, an unexpected error).
constexpr int kPauseMs = 100;
// At most one line about shed connections per this long.
constexpr int64_t kLogEveryUs = 10'000'000;
// Connections accepted from one socket before the thread polls again (and sees Stop).
constexpr int kAcceptBatch = 256;

std::string ErrnoText(int error) { return std::strerror(error); }

int64_t MonotonicMicros() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000 + t.tv_nsec / 1000;
}

int64_t SoftFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  return limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(limit.rlim_cur);
}

// A listening TCP socket on addr, or -1 with *error set. dual_stack: an IPv6 wildcard that
// takes IPv4 connections too.
int ListenOn(const sockaddr* addr, socklen_t length, bool dual_stack, std::string* error) {
  const int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = ErrnoText(errno);
    return -1;
  }
  const int one = 1, zero = 0;
  // SO_REUSEADDR lets a restarted server bind while its old connections sit in TIME_WAIT.
  // Unlike gRPC's listener, no SO_REUSEPORT: a second server on a port in use fails to start
  // instead of sharing its connections.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr->sa_family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? &zero : &one, sizeof one);
  }
  // Accepted sockets inherit TCP_NODELAY (the handover sets it again, to be sure).
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (bind(fd, addr, length) != 0 || listen(fd, SOMAXCONN) != 0) {
    *error = ErrnoText(errno);
    close(fd);
    return -1;
  }
  return fd;
}

int PortOf(int fd) {
  sockaddr_storage bound;
  socklen_t length = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
}

void SetPort(sockaddr_storage* addr, int port) {
  if (addr->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address, "--listen");
  if (!parsed.ok()) return parsed.status();
  const std::string& host = parsed->host;
  const int port = parsed->port;

  // The addresses to bind, in order; the first one's port is every other's when port is 0.
  struct Candidate {
    sockaddr_storage addr{};
    socklen_t length = 0;
    bool dual_stack = false;
  };
  std::vector<Candidate> candidates;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    // Every address: [::] taking IPv4 too (as gRPC does), else 0.0.0.0 on a host without IPv6.
    Candidate v6;
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&v6.addr);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    v6.length = sizeof(sockaddr_in6);
    v6.dual_stack = true;
    candidates.push_back(v6);
    Candidate v4;
    auto* in4 = reinterpret_cast<sockaddr_in*>(&v4.addr);
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4.length = sizeof(sockaddr_in);
    candidates.push_back(v4);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int e = getaddrinfo(host.c_str(), nullptr, &hints, &found); e != 0) {
      return absl::UnavailableError(
          absl::StrCat("could not listen on ", address, ": ", gai_strerror(e)));
    }
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
      Candidate c;
      std::memcpy(&c.addr, a->ai_addr, a->ai_addrlen);
      c.length = a->ai_addrlen;
      candidates.push_back(c);
    }
    freeaddrinfo(found);
  }

  std::unique_ptr<Listener> listener(new Listener);
  std::string first_error = "no address";
  for (Candidate& c : candidates) {
    if (listener->port_ != 0)
      SetPort(&c.addr, listener->port_);
    else
      SetPort(&c.addr, port);
    std::string error;
    const int fd =
        ListenOn(reinterpret_cast<const sockaddr*>(&c.addr), c.length, c.dual_stack, &error);
    if (fd < 0) {
      if (listener->sockets_.empty()) first_error = error;
      continue;
    }
    listener->sockets_.push_back(fd);
    if (listener->port_ == 0) listener->port_ = PortOf(fd);
    // The dual-stack wildcard covers 0.0.0.0 too; that one is only the fallback.
    if (c.dual_stack) break;
  }
  if (listener->sockets_.empty() || listener->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", address, ": ", first_error,
                     " (address in use, or not an address of this host?)"));
  }
  listener->wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  listener->reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (listener->wake_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", address, ": eventfd: ", ErrnoText(errno)));
  }
  return listener;
}

Listener::~Listener() { Stop(); }

void Listener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { Run(); });
}

void Listener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (write(wake_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : sockets_) close(fd);
  sockets_.clear();
  for (int* fd : {&wake_, &reserve_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void Listener::Run() {
  std::vector<pollfd> polled;
  for (int fd : sockets_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_, POLLIN, 0});
  int pause_ms = 0;
  for (;;) {
    if (pause_ms > 0) {
      // The listening sockets stay readable: wait for Stop alone, then try them again.
      pollfd wake = {wake_, POLLIN, 0};
      if (poll(&wake, 1, pause_ms) > 0) return;
      pause_ms = 0;
    }
    if (poll(polled.data(), polled.size(), -1) < 0) continue;  // EINTR
    if (polled.back().revents != 0) return;
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i].revents != 0) pause_ms = std::max(pause_ms, AcceptAll(polled[i].fd));
    }
  }
}

int Listener::AcceptAll(int fd) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    const int connection = accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (connection >= 0) {
      accepted_.fetch_add(1, std::memory_order_relaxed);  // counted before it can be served
      const int one = 1;
      setsockopt(connection, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = fd;
      p.fd = connection;
      acceptor_->HandleNewConnection(&p);  // gRPC's from here on
      continue;
    }
    switch (errno) {
      case EINTR:
        continue;
      case EAGAIN:
        return 0;
      case EMFILE:
      case ENFILE:
        if (Shed(fd)) continue;
        return kPauseMs;
      case ENOBUFS:
      case ENOMEM:
        return kPauseMs;
      case ECONNABORTED:
      case EPROTO:
      case EPERM:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        continue;  // that connection is gone (accept(2): treat as EAGAIN, try again)
      default:
        LogLine(absl::StrCat("listener: accept failed: ", ErrnoText(errno), "; trying again"));
        return kPauseMs;
    }
  }
  return 0;
}

bool Listener::Shed(int fd) {
  if (reserve_ >= 0) {
    close(reserve_);
    reserve_ = -1;
  }
  const int connection = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (connection >= 0) {
    // Reset rather than close politely: no TIME_WAIT left here, and the client learns at once.
    const linger reset = {1, 0};
    setsockopt(connection, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(connection);
    shed_.fetch_add(1, std::memory_order_relaxed);
  }
  reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);  // may fail; the next Shed pauses then
  const int64_t now = MonotonicMicros();
  const int64_t shed = shed_.load(std::memory_order_relaxed);
  if (shed > shed_logged_ && now - last_log_us_ >= kLogEveryUs) {
    LogLine(absl::StrCat("listener: out of file descriptors (soft limit ", SoftFileLimit(),
                         "): closed ", shed - shed_logged_,
                         " new connections at once since the last such line"));
    shed_logged_ = shed;
    last_log_us_ = now;
  }
  return connection >= 0;
}

}  // namespace gradserve::server
