// echo_server: the bare gRPC baseline of bench/run. One unary method, gradserve.bench.Echo/Echo,
// answers with the bytes it received, on gRPC's callback API (as gradserve-server uses), with
// no message size limit, and with malloc tuned as gradserve-server's (Note [Malloc tuning]), so
// that the two differ in what they do with the bytes only. Prints "listening on HOST:PORT" on
// stdout once it serves; stops on SIGTERM or SIGINT.
//
// --work_us makes each call busy-wait that long before it answers: a stand-in for a handler's
// own work, to see what a given server time per call does to latency and rate beside a bare
// call (docs/benchmarks.md, "How much server work the targets allow").
//
// --work_bytes makes each call also write and then read a fresh buffer of that many bytes, a
// stand-in for the memory a handler's work touches (what the busy-wait does not do to the
// caches: docs/benchmarks.md, "TLS and tokens against plaintext").
//
// --tls_cert and --tls_key (PEM files) serve over TLS instead of plaintext: the bare gRPC TLS
// reference of bench/run's TLS rows (Note [The TLS reference]).
//
// Usage: echo_server [--listen=127.0.0.1:0] [--work_us=0] [--work_bytes=0]
//                    [--tls_cert=PEM --tls_key=PEM]

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/echo.grpc.pb.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "program/flag_arguments.h"
#include "program/process_start.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on; port 0 picks a free one.");
ABSL_FLAG(int, work_us, 0,
          "microseconds each call busy-waits before answering, a stand-in for a handler's work "
          "(0: none, the bare baseline)");
ABSL_FLAG(int, work_bytes, 0,
          "bytes of a fresh buffer each call writes and reads, a stand-in for the memory a "
          "handler's work touches (0: none)");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve over TLS with it and --tls_key (empty: plaintext)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace gradserve::bench {
namespace {

// Note [The TLS reference]: with --tls_cert, the echo serves over gRPC's plain TLS credentials
// (SslServerCredentials: the same TSI, OpenSSL frame protector and secure endpoint as
// gradserve-server's TlsServerCredentials once the handshake is done; no client certificates,
// no auth metadata processor). So echo TLS against echo plaintext is what gRPC 1.51's TLS itself
// costs on this host, the reference for gradserve's own TLS rows. Under callgrind, TLS adds
// about 30,000 instructions per empty echo to this server and 31,000 to `gradserve load`;
// to gradserve-server's grad_tiny without tokens, 33,000: the same records, protected and
// unprotected by the same code (docs/benchmarks.md, TLS section).

// The whole file at path into *text; false if it cannot be read.
bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream bytes;
  bytes << in.rdbuf();
  *text = bytes.str();
  return true;
}

// Thread safety: immutable after construction; gRPC runs Echo on its callback threads at once.
class EchoService final : public Echo::CallbackService {
 public:
  EchoService(absl::Duration work, int work_bytes) : work_(work), work_bytes_(work_bytes) {}

 private:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoMessage* request,
                                 EchoMessage* response) override {
    if (work_ > absl::ZeroDuration()) {
      // Busy, not asleep: the stand-in takes a CPU as a handler's work does.
      const absl::Time end = absl::Now() + work_;
      while (absl::Now() < end) {
      }
    }
    if (work_bytes_ > 0) {
      std::vector<unsigned char> buffer(static_cast<size_t>(work_bytes_));
      for (size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<unsigned char>(i);
      unsigned sum = 0;
      for (size_t i = 0; i < buffer.size(); i += 64) sum += buffer[i];
      benchmark_sink_.store(sum, std::memory_order_relaxed);  // so the loops are not elided
    }
    response->set_payload(request->payload());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  const absl::Duration work_;
  const int work_bytes_;
  std::atomic<unsigned> benchmark_sink_{0};
};

int Main() {
  // Only this thread takes the stop signals (threads inherit the mask), with sigwait.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  const std::string listen = absl::GetFlag(FLAGS_listen);
  const int work_us = absl::GetFlag(FLAGS_work_us);
  const int work_bytes = absl::GetFlag(FLAGS_work_bytes);
  if (work_us < 0 || work_bytes < 0) {
    std::fprintf(stderr, "echo_server: --work_us and --work_bytes must be 0 or more, not %d, %d\n",
                 work_us, work_bytes);
    return 2;  // a usage error, as a bad flag is
  }
  const std::string tls_cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string tls_key = absl::GetFlag(FLAGS_tls_key);
  if (tls_cert.empty() != tls_key.empty()) {
    std::fprintf(stderr, "echo_server: --tls_cert and --tls_key go together\n");
    return 2;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls_cert.empty()) {  // Note [The TLS reference]
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (!ReadFile(tls_cert, &pair.cert_chain) || !ReadFile(tls_key, &pair.private_key)) {
      std::fprintf(stderr, "echo_server: cannot read --tls_cert or --tls_key\n");
      return 1;
    }
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    credentials = grpc::SslServerCredentials(ssl);
  }
  EchoService service(absl::Microseconds(work_us), work_bytes);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "echo_server: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("listening on %s:%d\n", listen.substr(0, listen.rfind(':')).c_str(), port);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  server->Shutdown();
  return 0;
}

}  // namespace
}  // namespace gradserve::bench

int main(int argc, char** argv) {
  // The server's start, but on glibc's malloc, as a bare gRPC server runs: linked with
  // mimalloc this echo was no faster, if anything slower (docs/benchmarks.md), which would
  // flatter grad_64mb's ratio.
  gradserve::StartProcess();
  absl::SetProgramUsageMessage(
      "the bare gRPC echo baseline of bench/run.\nUsage: echo_server "
      "[--listen=127.0.0.1:0] [--work_us=0] [--work_bytes=0] [--tls_cert=PEM --tls_key=PEM]");
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "echo_server").has_value()) return 2;
  return gradserve::bench::Main();
}
