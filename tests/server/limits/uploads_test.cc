// Note [Uploads apart from work] (server/limits/upload_tracker.h): streamed requests still
// arriving take no engine slot, are bounded in number, and are ended when they stall.

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "server/limits/upload_tracker.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::HasSubstr;

// Channels of their own (an HTTP/2 connection each), since a connection carries a bounded
// number of streams.
std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("gradserve.test_connection", i);  // no subchannel shared between them
    channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

bool WaitForOpenUploads(server::GradServer& server, int64_t n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (server.service().uploads().open() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(UploadsTest, StalledUploadsTakeNoSlotAndEndWhenIdle) {
  server::ServerOptions options = TestOptions();
  options.max_in_flight = 4;
  options.upload_idle_timeout = absl::Seconds(3);
  TestServer server(options);
  constexpr int kStalled = 1000;
  std::vector<std::shared_ptr<grpc::Channel>> channels = Channels(server.target(), 20);
  std::vector<std::unique_ptr<StalledUpload>> stalled;
  const absl::Time began = absl::Now();
  for (int i = 0; i < kStalled; ++i) {
    stalled.push_back(std::make_unique<StalledUpload>(channels[i % channels.size()]));
  }
  ASSERT_TRUE(WaitForOpenUploads(server.server(), kStalled, absl::Seconds(2)))
      << server.server().service().uploads().open() << " uploads open";

  // Honest clients are served while the uploads stall: they took none of the 4 slots.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(CheckSquareWorks(server.client()).ok()) << "call " << i;
  }
  EXPECT_EQ(server.server().service().counters().requests_rejected(), 0);

  // Each stalled upload ends with DEADLINE_EXCEEDED naming the flag, between 1 and 1.25
  // timeouts after its last chunk (a generous bound here: the machine is shared).
  for (auto& upload : stalled) {
    std::optional<grpc::Status> status = upload->Wait(absl::Seconds(15));
    ASSERT_TRUE(status.has_value()) << "an idle upload was not ended";
    EXPECT_EQ(status->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(status->error_message(), HasSubstr("--upload_idle_timeout"));
  }
  EXPECT_GE(absl::Now() - began, options.upload_idle_timeout);
  EXPECT_TRUE(WaitForOpenUploads(server.server(), 0, absl::Seconds(2)));
  EXPECT_EQ(server.server().service().uploads().expired(), kStalled);
  EXPECT_EQ(server.server().service().counters().in_flight(), 0);
  // What they sent was charged to the server's budget and given back (by each reactor, when
  // gRPC is done with its call).
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server.server().service().memory()->used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server.server().service().memory()->used(), 0);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

TEST(UploadsTest, UploadsPastTheLimitAreRefusedNamingIt) {
  server::ServerOptions options = TestOptions();
  options.max_uploads = 3;
  TestServer server(options);
  std::vector<std::unique_ptr<StalledUpload>> stalled;
  for (int i = 0; i < 3; ++i) {
    stalled.push_back(std::make_unique<StalledUpload>(server.client().channel()));
  }
  ASSERT_TRUE(WaitForOpenUploads(server.server(), 3, absl::Seconds(2)));
  StalledUpload fourth(server.client().channel());
  std::optional<grpc::Status> status = fourth.Wait(absl::Seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status->error_message(), HasSubstr("--max_uploads"));
  // Unary calls do not count as uploads; an upload that ends frees its place.
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
  stalled.pop_back();  // cancelled by its client
  ASSERT_TRUE(WaitForOpenUploads(server.server(), 2, absl::Seconds(5)));
  v1::GradRequest request = SquareRequest();
  EXPECT_TRUE(SendStreamMessages(server.client().channel(), {[&] {
                                   v1::Chunk chunk;
                                   chunk.set_data(request.SerializeAsString());
                                   chunk.set_total_bytes(chunk.data().size());
                                   return chunk.SerializeAsString();
                                 }()})
                  .ok());
}

}  // namespace
}  // namespace gradserve::testing
