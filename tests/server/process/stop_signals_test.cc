// Note [Stop signals] (server/process/main.cc) and Note [Draining]
// (server/service/grad_server.h) on the real binary: on SIGTERM, health turns NOT_SERVING and
// the port closes at once, the call in flight finishes, further stop signals are ignored, and
// the process exits 0.

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// A SlowRequest that takes about `target` on this machine (a sanitizer build is slower): one
// call timed, then scaled.
v1::GradRequest RequestTaking(client::Client& client, absl::Duration target) {
  constexpr int kProbeSteps = 200, kN = 512;
  client::CallOptions call;
  call.timeout = absl::Seconds(60);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(client.ComputeGradients(SlowRequest(kProbeSteps, kN), call).ok());
  const double took = std::max(1e-3, absl::ToDoubleSeconds(absl::Now() - start));
  const int steps = static_cast<int>(
      std::clamp(kProbeSteps * absl::ToDoubleSeconds(target) / took, 200.0, 20000.0));
  v1::GradRequest request = SlowRequest(steps, kN);
  request.set_request_id("held");
  return request;
}

TEST(StopSignalsTest, RepeatedSignalsAreIgnoredUntilTheCallInFlightFinished) {
  ServerProcess process(
      {"--grace_period=60s", "--worker_threads=2", "--max_inline_cost=0", "--log_requests=all"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<client::Client> client = client::Client::Connect(target);
  const v1::GradRequest held = RequestTaking(*client, absl::Seconds(3));

  // A health watcher, connected before the signal.
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(client->channel());
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest watch_request;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> watch =
      health->Watch(&watch_context, watch_request);
  grpc::health::v1::HealthCheckResponse answer;
  ASSERT_TRUE(watch->Read(&answer));
  EXPECT_EQ(answer.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  absl::StatusOr<v1::GradResponse> held_result;
  std::thread held_call([&] {
    client::CallOptions call;
    call.timeout = absl::Seconds(60);
    held_result = client->ComputeGradients(held, call);
  });
  ASSERT_TRUE(WaitForInFlight(*client, 1, absl::Seconds(10)));

  process.Signal(SIGTERM);
  const absl::Time signalled = absl::Now();
  // The watcher hears NOT_SERVING at once.
  ASSERT_TRUE(watch->Read(&answer));
  EXPECT_EQ(answer.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(1));
  // A probe, over a new connection, is refused: the port is closed.
  {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // not the connection of `client`
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status probe =
        grpc::health::v1::Health::NewStub(channel)->Check(&context, request, &response);
    EXPECT_EQ(probe.error_code(), grpc::StatusCode::UNAVAILABLE) << probe.error_message();
  }
  // More stop signals, while the call is still running: each one is ignored.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGTERM}) {
    absl::SleepFor(absl::Milliseconds(50));
    process.Signal(sig);
  }
  held_call.join();
  EXPECT_TRUE(held_result.ok()) << held_result.status() << "\n" << process.Log();
  EXPECT_EQ(process.WaitForExit(absl::Seconds(30)), 0) << process.Log();
  const std::string log = process.Log();
  EXPECT_TRUE(absl::StrContains(log, "got SIGTERM: closing the port, health NOT_SERVING")) << log;
  EXPECT_TRUE(absl::StrContains(log, "got SIGINT again; ignored while draining")) << log;
  EXPECT_TRUE(absl::StrContains(log, "got SIGHUP again; ignored while draining")) << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=held rpc=unary status=OK")) << log;
  EXPECT_TRUE(absl::StrContains(log, "every call in flight finished; exiting")) << log;
  while (watch->Read(&answer)) {
  }
  watch->Finish().IgnoreError();
}

}  // namespace
}  // namespace gradserve::testing
