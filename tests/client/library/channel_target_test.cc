// Note [Several replicas]: the targets a client accepts, and one Client spreading its calls
// over three real servers on loopback with round_robin.

#include "client/library/channel_target.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/library/gradserve_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ChannelTargetTest, ListsOfAddressesBecomeGrpcLists) {
  EXPECT_EQ(*client::GrpcTarget("10.0.0.1:50051,10.0.0.2:50051"),
            "ipv4:10.0.0.1:50051,10.0.0.2:50051");
  EXPECT_EQ(*client::GrpcTarget(" 127.0.0.1:1 , 127.0.0.1:2 "), "ipv4:127.0.0.1:1,127.0.0.1:2");
  EXPECT_EQ(*client::GrpcTarget("[::1]:1,[fe80::2]:2"), "ipv6:[::1]:1,[fe80::2]:2");
}

TEST(ChannelTargetTest, AddressesAndGrpcUrisAsTheyAre) {
  for (const char* target : {"localhost:50051", "10.0.0.1:50051", "dns:///gradserve:50051",
                             "ipv4:10.0.0.1:1,10.0.0.2:1", "unix:/run/gradserve.sock"}) {
    EXPECT_EQ(*client::GrpcTarget(target), target);
  }
}

TEST(ChannelTargetTest, BadListsAreRefusedNamingTheEntry) {
  EXPECT_THAT(client::GrpcTarget("").status().message(), HasSubstr("empty"));
  EXPECT_THAT(client::GrpcTarget("a.example:1,b.example:1").status().message(),
              AllOf(HasSubstr("'a.example:1'"), HasSubstr("dns:///NAME:PORT")));
  EXPECT_THAT(client::GrpcTarget("10.0.0.1:1,[::1]:2").status().message(),
              HasSubstr("mixes IPv4 and IPv6"));
  for (const char* bad : {"10.0.0.1,10.0.0.2:1", "10.0.0.1:1,10.0.0.2:", "10.0.0.1:1,",
                          "10.0.0.1:1,10.0.0.2:123456", "10.0.0.1:1,::1:2", "1.2.3:1,1.2.3.4:1"}) {
    EXPECT_EQ(client::GrpcTarget(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Three servers, one list: the calls of one client reach all of them about evenly.
TEST(ChannelTargetTest, OneClientSpreadsItsCallsOverEveryServer) {
  LocalServer servers[3];
  std::vector<std::string> targets;
  for (LocalServer& s : servers) targets.push_back(s.target());
  std::unique_ptr<client::Client> client = client::Client::Connect(absl::StrJoin(targets, ","));
  client::RequestBuilder b;
  b.Leaf("x", client::HostTensor::Float32({1, 2, 3}, {3}), /*requires_grad=*/true);
  b.Op("mul", {"x", "x"}, {"y"});
  b.Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  // round_robin uses the connections that are up: the first calls of a cold channel go to the
  // servers it reached first. So calls are made until every server has had one (bounded),
  // and then the spread of the next calls is exact: a third each, in turn.
  auto counts = [&] {
    std::vector<int64_t> c;
    for (LocalServer& s : servers) c.push_back(s.server().service().counters().requests_total());
    return c;
  };
  int warmup = 0;
  for (; warmup < 5000; ++warmup) {
    const std::vector<int64_t> c = counts();
    if (std::find(c.begin(), c.end(), 0) == c.end()) break;
    ASSERT_TRUE(client->ComputeGradients(b.request()).ok()) << warmup;
  }
  const std::vector<int64_t> before = counts();
  ASSERT_EQ(std::find(before.begin(), before.end(), 0), before.end())
      << "a server had no call after " << warmup << " calls";
  constexpr int kCalls = 60;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(client->ComputeGradients(b.request()).ok()) << i;
  }
  const std::vector<int64_t> after = counts();
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(after[i] - before[i], kCalls / 3) << servers[i].target();
    total += after[i] - before[i];
  }
  EXPECT_EQ(total, kCalls);
}

}  // namespace
}  // namespace gradserve::testing
