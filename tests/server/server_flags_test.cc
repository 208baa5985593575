// The flags of gradserve-server that shape its per-request work: --log_requests and
// --max_inline_cost, checked on the real binary and through ServerOptions.

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/server_options.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using server::ServerOptions;

TEST(ServerFlagsTest, LogRequestsParsesItsThreeValues) {
  for (ServerOptions::LogRequests v :
       {ServerOptions::LogRequests::kAll, ServerOptions::LogRequests::kErrors,
        ServerOptions::LogRequests::kNone}) {
    ServerOptions::LogRequests parsed = ServerOptions::LogRequests::kAll;
    ASSERT_TRUE(server::ParseLogRequests(server::LogRequestsName(v), &parsed).ok());
    EXPECT_EQ(parsed, v);
  }
  ServerOptions::LogRequests parsed = ServerOptions::LogRequests::kAll;
  absl::Status s = server::ParseLogRequests("some", &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--log_requests")) << s;
  EXPECT_EQ(ServerOptions().log_requests, ServerOptions::LogRequests::kErrors);
}

TEST(ServerFlagsTest, NegativeMaxInlineCostIsRefused) {
  ServerOptions o = TestOptions();
  o.max_inline_cost = 0;
  EXPECT_TRUE(server::CheckOptions(o).ok());
  o.max_inline_cost = -1;
  absl::Status s = server::CheckOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_inline_cost")) << s;
}

TEST(ServerFlagsTest, BadFlagValuesStopTheBinaryWithAMessage) {
  for (const char* flag : {"--log_requests=loud", "--max_inline_cost=-5"}) {
    ServerProcess process({flag});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2) << flag;
    const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
    EXPECT_TRUE(absl::StrContains(process.Log(), name)) << process.Log();
  }
}

TEST(ServerFlagsTest, HelpListsTheServersFlags) {
  ServerProcess process({"--help"});
  EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 1);  // absl's exit code for --help
  for (const char* flag :
       {"--listen", "--max_in_flight", "--log_requests", "--max_inline_cost", "--grace_period"}) {
    EXPECT_TRUE(absl::StrContains(process.Log(), flag)) << flag << "\n" << process.Log();
  }
}

// Sends one good and one bad request to a server started with flags; returns its log.
std::string LogOfOneGoodAndOneBadRequest(std::vector<std::string> flags) {
  ServerProcess process(std::move(flags));
  const int port = process.WaitForPort(absl::Seconds(20));
  EXPECT_GT(port, 0) << process.Log();
  if (port == 0) return "";
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  EXPECT_TRUE(CheckSquareWorks(*client).ok());
  v1::GradRequest bad = SquareRequest();
  bad.set_request_id("bad");
  bad.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
  EXPECT_EQ(client->ComputeGradients(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // Each line is written before the call's status is sent.
  return process.Log();
}

TEST(ServerFlagsTest, LogRequestsChoosesWhichRequestsAreLogged) {
  std::string log = LogOfOneGoodAndOneBadRequest({});  // errors by default
  EXPECT_FALSE(absl::StrContains(log, "request id=square")) << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=bad rpc=unary status=INVALID_ARGUMENT")) << log;

  for (const char* inline_flag : {"--max_inline_cost=0", "--max_inline_cost=16384"}) {
    log = LogOfOneGoodAndOneBadRequest({"--log_requests=all", inline_flag});
    EXPECT_TRUE(absl::StrContains(log, "request id=square rpc=unary status=OK duration_ms="))
        << log;
    EXPECT_TRUE(absl::StrContains(log, "request id=bad rpc=unary status=INVALID_ARGUMENT")) << log;
  }

  log = LogOfOneGoodAndOneBadRequest({"--log_requests=none"});
  EXPECT_FALSE(absl::StrContains(log, "request id=")) << log;
  EXPECT_TRUE(absl::StrContains(log, "listening on")) << log;
}

}  // namespace
}  // namespace gradserve::testing
