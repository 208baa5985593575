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
// Usage: echo_server [--listen=127.0.0.1:0] [--work_us=0]

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

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

namespace gradserve::bench {
namespace {

// Thread safety: immutable after construction; gRPC runs Echo on its callback threads at once.
class EchoService final : public Echo::CallbackService {
 public:
  explicit EchoService(absl::Duration work) : work_(work) {}

 private:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoMessage* request,
                                 EchoMessage* response) override {
    if (work_ > absl::ZeroDuration()) {
      // Busy, not asleep: the stand-in takes a CPU as a handler's work does.
      const absl::Time end = absl::Now() + work_;
      while (absl::Now() < end) {
      }
    }
    response->set_payload(request->payload());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  const absl::Duration work_;
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
  if (work_us < 0) {
    std::fprintf(stderr, "echo_server: --work_us must be 0 or more, not %d\n", work_us);
    return 2;  // a usage error, as a bad flag is
  }
  EchoService service(absl::Microseconds(work_us));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
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
      "[--listen=127.0.0.1:0] [--work_us=0]");
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "echo_server").has_value()) return 2;
  return gradserve::bench::Main();
}
