// Note [Several replicas]: the targets a client accepts, and one Client spreading its calls
// over three real servers on loopback with round_robin.

#include "client/library/channel_target.h"

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
  constexpr int kCalls = 60;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(client->ComputeGradients(b.request()).ok()) << i;
  }
  int64_t total = 0;
  for (LocalServer& s : servers) {
    const int64_t calls = s.server().service().counters().requests_total();
    // Exactly a third once every connection is up; the first calls may precede some.
    EXPECT_GE(calls, kCalls / 3 - 5) << s.target();
    total += calls;
  }
  EXPECT_EQ(total, kCalls);
}

}  // namespace
}  // namespace gradserve::testing
