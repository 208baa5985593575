// The log of the real gradserve-server binary under hostile clients (issue 24, item 8): a
// client's bytes never forge a log line (Note [Quoting client strings] in engine/util/quote.h),
// and a burst of refusals is logged at a bounded rate with a summary of the lines left out
// (Note [Refusals logged at a bounded rate] in server/base/log.h).

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// The lines of log, each checked to be one of the server's: its time, then the program name.
std::vector<std::string> ServerLines(const std::string& log) {
  static const std::regex kLine(
      R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d gradserve-server: [ -~]*$)");
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(std::regex_match(std::string(line), kLine)) << "not a line of the server: " << line;
    lines.emplace_back(line);
  }
  return lines;
}

TEST(RefusalLogTest, ClientBytesNeverForgeALine) {
  ServerProcess process({"--log_requests=all"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  // What a forger would append: a line that looks like the server's own.
  const std::string forged =
      "\n1999-12-31T23:59:59.000+00:00 gradserve-server: request id=forged rpc=unary status=OK";
  v1::GradRequest ok = SquareRequest();
  ok.set_request_id("ok" + forged);
  v1::GradRequest bad_op = SquareRequest();
  bad_op.set_request_id("bad" + forged + "\r\x1b[2J");
  bad_op.mutable_graph()->mutable_ops(0)->set_op("mul" + forged);
  v1::GradRequest bad_name = SquareRequest();
  bad_name.mutable_graph()->mutable_ops(1)->set_inputs(0, std::string("y\0", 2) + forged);
  v1::GradRequest long_name = SquareRequest();
  long_name.set_request_id(forged + std::string(1 << 20, 'i'));
  EXPECT_TRUE(client->ComputeGradients(ok).ok());
  for (const v1::GradRequest* r : {&bad_op, &bad_name, &long_name}) {
    absl::StatusOr<v1::GradResponse> response = client->ComputeGradients(*r);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
  }
  const std::string log = process.Log();
  EXPECT_FALSE(absl::StrContains(log, "\n1999-")) << log;
  const std::vector<std::string> lines = ServerLines(log);
  int requests = 0;
  for (const std::string& line : lines) {
    if (!absl::StrContains(line, "gradserve-server: request id=")) continue;
    ++requests;
    EXPECT_FALSE(absl::StrContains(line, "request id=forged")) << line;
    EXPECT_LT(line.size(), 600u) << line;
  }
  EXPECT_EQ(requests, 4) << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=ok\\n1999-12-31T23:59:59.000+00:00\\x20")) << log;
  // The start-up line lists the limits, this one among them.
  EXPECT_TRUE(absl::StrContains(log, " max_name_bytes=256")) << log;
}

// Ten thousand refused requests, from four clients as fast as they go: the log has at most
// --log_refusals_per_second lines a second, one summary a second, and counts every refusal in
// either.
TEST(RefusalLogTest, ABurstOfRefusalsIsLoggedAtABoundedRate) {
  ServerProcess process({"--log_refusals_per_second=5", "--grace_period=5s"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  v1::GradRequest bad = SquareRequest();
  bad.set_request_id("burst");
  bad.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
  constexpr int kClients = 4;
  constexpr int kRequests = 10'000;
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRequests / kClients; ++i) {
        refused +=
            client->ComputeGradients(bad).status().code() == absl::StatusCode::kInvalidArgument;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_EQ(refused.load(), kRequests);
  process.Signal(SIGTERM);  // the last summary is written when the service stops
  ASSERT_EQ(process.WaitForExit(absl::Seconds(30)), 0) << process.Log();

  int logged = 0, summaries = 0;
  int64_t summarized = 0;
  for (const std::string& line : ServerLines(process.Log())) {
    if (absl::StrContains(line, "request id=burst rpc=unary status=INVALID_ARGUMENT")) ++logged;
    if (const size_t at = line.find(" refusals not logged in the last "); at != std::string::npos) {
      ++summaries;
      const size_t start_of_count = line.rfind(' ', at - 1) + 1;
      int64_t n = 0;
      ASSERT_TRUE(absl::SimpleAtoi(line.substr(start_of_count, at - start_of_count), &n)) << line;
      summarized += n;
    }
  }
  const int windows = static_cast<int>(seconds) + 2;  // the seconds the burst began in
  EXPECT_EQ(logged + summarized, kRequests) << logged << " logged, " << summarized << " summed up";
  EXPECT_LE(logged, 5 * windows) << seconds << " s";
  EXPECT_GE(summaries, 1);
  EXPECT_LE(summaries, windows) << seconds << " s";
  std::printf("%d refusals in %.2f s: %d lines, %d summaries\n", kRequests, seconds, logged,
              summaries);
}

}  // namespace
}  // namespace gradserve::testing
