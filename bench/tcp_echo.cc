// tcp_echo: what the host's loopback itself moves, the physical reference of bench/run's
// grad_64mb row (issue 32). One process, one TCP connection on 127.0.0.1: a server thread
// reads a request of --bytes and writes the same bytes back; the client sends the request, then
// reads the reply, --repeats times. Each exchange's figure counts the bytes both ways (up+down,
// as `gradserve load` counts grad_64mb's) over its time from the first byte sent to the last
// received. Prints one JSON line: the median exchange, with the bytes and the repeats.
//
// Note [The TCP reference]
// grad_64mb's first reference was a bare gRPC echo of the same bytes, whose speed moved four-fold
// from host to host with gRPC's own copies, so two rows could not be judged. A plain TCP echo
// with the same shape (one connection, a request, then its reply, no pipelining) is what any
// protocol on this host could at best do: both sides in one process still cross the kernel's
// socket buffers twice, as gradserve-server and its client do. Buffers are 1 MiB writes and
// reads, the socket buffers the kernel's defaults.
//
// Usage: tcp_echo [--bytes=67108864] [--repeats=5]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "program/flag_arguments.h"

ABSL_FLAG(int64_t, bytes, int64_t{64} << 20, "bytes of each request (and of its reply)");
ABSL_FLAG(int, repeats, 5, "exchanges; the figure is their median");

namespace gradserve::bench {
namespace {

constexpr size_t kChunk = size_t{1} << 20;

// Writes all of data[0, n) to fd; false on an error.
bool WriteAll(int fd, const char* data, int64_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, static_cast<size_t>(std::min<int64_t>(n, kChunk)), 0);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= w;
  }
  return true;
}

// Reads exactly n bytes from fd into buffer (kChunk bytes, reused); false on an error or EOF.
bool ReadAll(int fd, char* buffer, int64_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, buffer, static_cast<size_t>(std::min<int64_t>(n, kChunk)), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    n -= r;
  }
  return true;
}

int Fail(const char* what) {
  std::fprintf(stderr, "tcp_echo: %s: %s\n", what, std::strerror(errno));
  return 1;
}

int Main() {
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (bytes < 1 || repeats < 1 || repeats > 1000) {
    std::fprintf(stderr, "tcp_echo: --bytes must be at least 1 and --repeats 1 to 1000\n");
    return 2;
  }
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Fail("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Fail("listening on 127.0.0.1");
  }

  // The server: one connection, `repeats` requests, each answered with its own bytes (the
  // reply's content does not matter to the figure: the same buffer is sent back).
  bool server_ok = true;
  std::thread server([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) {
      server_ok = false;
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> buffer(kChunk);
    for (int i = 0; i < repeats && server_ok; ++i) {
      server_ok = ReadAll(fd, buffer.data(), bytes);
      for (int64_t left = bytes; server_ok && left > 0; left -= kChunk) {
        server_ok = WriteAll(fd, buffer.data(), std::min<int64_t>(left, kChunk));
      }
    }
    ::close(fd);
  });

  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int result = Fail("connecting");
    ::shutdown(listener, SHUT_RDWR);
    server.join();
    return result;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> request(static_cast<size_t>(bytes), 'x');
  std::vector<char> buffer(kChunk);
  std::vector<double> rates;
  bool ok = true;
  for (int i = 0; i < repeats && ok; ++i) {
    const absl::Time start = absl::Now();
    ok = WriteAll(fd, request.data(), bytes) && ReadAll(fd, buffer.data(), bytes);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    rates.push_back(2.0 * static_cast<double>(bytes) / seconds);
  }
  ::close(fd);
  server.join();
  ::close(listener);
  if (!ok || !server_ok) return Fail("exchanging the bytes");
  std::sort(rates.begin(), rates.end());
  std::printf("{\"bytes\": %lld, \"repeats\": %d, \"bytes_per_second\": %.0f}\n",
              static_cast<long long>(bytes), repeats, rates[rates.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace gradserve::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "a plain TCP echo on 127.0.0.1, the reference of bench/run's grad_64mb row.\nUsage: "
      "tcp_echo [--bytes=67108864] [--repeats=5]");
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "tcp_echo").has_value()) return 2;
  return gradserve::bench::Main();
}
