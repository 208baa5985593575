// Graceful shutdown of the real gradserve-server binary: SIGTERM while calls are in flight
// loses no accepted call, and the process exits 0.

#include <signal.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

TEST(ShutdownTest, SigtermUnderLoadLosesNoAcceptedCall) {
  ServerProcess process(
      {"--grace_period=60s", "--worker_threads=2", "--max_in_flight=64", "--log_requests=all"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(CheckSquareWorks(*client).ok());

  // Eight clients each send up to 20 medium requests, one after another, until one is refused.
  constexpr int kClients = 8;
  constexpr int kCallsPerClient = 20;
  const v1::GradRequest medium = SlowRequest(150, 512);
  // A call either is admitted (the server logs its status) or is refused: UNAVAILABLE while
  // draining, or, for one that reaches the server in the instant gRPC itself stops, CANCELLED by
  // gRPC before any handler saw it. The server's log tells admitted calls apart.
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < kCallsPerClient; ++i) {
        client::CallOptions options;
        options.timeout = absl::Seconds(120);
        absl::StatusOr<v1::GradResponse> r = client->ComputeGradients(medium, options);
        if (r.ok()) {
          ++ok;
          continue;
        }
        ++refused;
        return;
      }
    });
  }
  // Wait until at least two calls are admitted (running or queued), then stop the server.
  bool loaded = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); !loaded && absl::Now() < end;) {
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
    loaded = info.ok() && info->counters().in_flight() >= 2;
    if (!loaded) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(loaded);
  process.Signal(SIGTERM);
  // While draining, health says NOT_SERVING (unless the server has already exited).
  // The signal is taken asynchronously, so poll a little.
  absl::StatusOr<std::string> health = client->CheckHealth();
  for (const absl::Time end = absl::Now() + absl::Seconds(5);
       health.ok() && *health == "SERVING" && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(2));
    health = client->CheckHealth();
  }
  if (health.ok()) {
    EXPECT_EQ(*health, "NOT_SERVING");
  }

  for (std::thread& t : clients) t.join();
  EXPECT_EQ(process.WaitForExit(absl::Seconds(60)), 0) << process.Log();
  const std::string log = process.Log();
  int admitted = 0, admitted_ok = 0;
  for (size_t at = log.find("request id=slow"); at != std::string::npos;
       at = log.find("request id=slow", at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    if (line.find("status=UNAVAILABLE") != std::string::npos) continue;
    ++admitted;
    if (line.find("status=OK") != std::string::npos) ++admitted_ok;
  }
  EXPECT_EQ(admitted_ok, admitted) << log;  // every accepted call finished OK ...
  EXPECT_EQ(ok.load(), admitted) << log;    // ... and its client got the answer
  EXPECT_GE(ok.load(), 2);                  // at least the calls in flight at SIGTERM
  EXPECT_NE(log.find("every call in flight finished"), std::string::npos) << log;
}

}  // namespace
}  // namespace gradserve::testing
