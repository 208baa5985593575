// Note [Draining] (server/service/grad_server.h) on in-process servers: Shutdown sends GOAWAY
// at once, so that a connected client's next calls go to another server while the call in
// flight finishes.

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// Options whose request "held" waits, on a worker, until release is notified.
server::ServerOptions HoldingOptions(absl::Notification* release) {
  server::ServerOptions options = TestOptions();
  options.max_inline_cost = 0;  // every request on the workers, the held one included
  options.before_run_for_testing = [release](const v1::GradRequest& request,
                                             const autograd::CancellationToken&) {
    if (request.request_id() == "held") {
      release->WaitForNotificationWithTimeout(absl::Seconds(30));
    }
  };
  return options;
}

int64_t RequestsOk(TestServer& server) {
  return server.server().service().counters().requests_ok();
}

TEST(DrainTest, ConnectedClientsMoveToAnotherServerAtOnce) {
  absl::Notification release;
  TestServer a(HoldingOptions(&release));
  TestServer b;
  // A client of two replicas: one channel, round robin over both addresses.
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  client::Client both(grpc::CreateCustomChannel(
      absl::StrCat("ipv4:127.0.0.1:", a.server().port(), ",127.0.0.1:", b.server().port()),
      grpc::InsecureChannelCredentials(), args));
  for (int i = 0; i < 100 && (RequestsOk(a) == 0 || RequestsOk(b) == 0); ++i) {
    ASSERT_TRUE(CheckSquareWorks(both).ok());
  }
  ASSERT_GT(RequestsOk(a), 0);
  ASSERT_GT(RequestsOk(b), 0);

  // A call in flight on a, through a connection of its own.
  v1::GradRequest held = SquareRequest();
  held.set_request_id("held");
  absl::StatusOr<v1::GradResponse> held_result;
  std::thread held_call([&] {
    client::CallOptions call;
    call.timeout = absl::Seconds(30);
    held_result = a.client().ComputeGradients(held, call);
  });
  ASSERT_TRUE(WaitForInFlight(a.client(), 1, absl::Seconds(10)));

  // A health watcher on a connection of a's.
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(a.client().channel());
  grpc::ClientContext watch_context;
  watch_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> watch =
      health->Watch(&watch_context, grpc::health::v1::HealthCheckRequest());
  grpc::health::v1::HealthCheckResponse answer;
  ASSERT_TRUE(watch->Read(&answer));
  ASSERT_EQ(answer.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  std::atomic<bool> drained{false};
  std::thread stop([&] { drained = a.server().Shutdown(absl::Seconds(30)); });
  // a's requests done once its GOAWAY has surely reached the client: 100 ms after the drain
  // began (the watcher hears NOT_SERVING as it does).
  std::atomic<int64_t> a_after_goaway{-1};
  std::thread observer([&] {
    if (!watch->Read(&answer)) return;
    EXPECT_EQ(answer.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    absl::SleepFor(absl::Milliseconds(100));
    a_after_goaway = RequestsOk(a);
  });
  // The client calls on meanwhile, one call at a time, and its calls succeed: a's GOAWAY sends
  // them to b. Only a call that crosses the GOAWAY on the wire may fail: gRPC 1.51 ends it
  // with CANCELLED before any handler sees it (Note [Draining], step 3); one at most.
  std::map<absl::StatusCode, int> failed;
  int ok = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(1.5); absl::Now() < end;) {
    client::CallOptions call;
    call.timeout = absl::Seconds(10);
    absl::StatusOr<v1::GradResponse> r = both.ComputeGradients(SquareRequest(), call);
    if (r.ok()) {
      ++ok;
    } else {
      ++failed[r.status().code()];
    }
  }
  observer.join();
  EXPECT_LE(failed[absl::StatusCode::kCancelled], 1);
  failed.erase(absl::StatusCode::kCancelled);
  for (auto [code, n] : failed) ADD_FAILURE() << n << " calls failed with " << code;
  EXPECT_GT(ok, 10);
  // None of them reached a once its GOAWAY had.
  EXPECT_GE(a_after_goaway.load(), 0);
  EXPECT_EQ(RequestsOk(a), a_after_goaway.load());

  // The call in flight was not disturbed, and the drain ends when it does.
  EXPECT_FALSE(drained);
  release.Notify();
  held_call.join();
  EXPECT_TRUE(held_result.ok()) << held_result.status();
  stop.join();
  EXPECT_TRUE(drained);
  while (watch->Read(&answer)) {
  }
  watch->Finish().IgnoreError();
}

// A ComputeGradientsStream call that sends the first half of its request's bytes at once and
// the rest, half-closing, when SendRest is called.
class TwoPartUpload : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  TwoPartUpload(const std::shared_ptr<grpc::Channel>& channel, const v1::GradRequest& request)
      : stub_(channel) {
    const std::string bytes = request.SerializeAsString();
    v1::Chunk first, second;
    first.set_total_bytes(static_cast<int64_t>(bytes.size()));
    first.set_data(bytes.substr(0, bytes.size() / 2));
    second.set_data(bytes.substr(bytes.size() / 2));
    first_ = Buffer(first);
    second_ = Buffer(second);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stub_.PrepareBidiStreamingCall(&context_, "/gradserve.v1.GradService/ComputeGradientsStream",
                                   grpc::StubOptions(), this);
    StartWrite(&first_);
    StartRead(&read_);
    StartCall();
  }

  // Waits until the first half is written, then sends the rest.
  void SendRest() {
    first_written_.get_future().wait();
    StartWriteLast(&second_, grpc::WriteOptions());
  }
  grpc::Status Wait() { return done_.get_future().get(); }

  void OnWriteDone(bool /*ok*/) override {
    if (!first_done_) {
      first_done_ = true;
      first_written_.set_value();
    }
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&read_);
  }
  void OnDone(const grpc::Status& status) override { done_.set_value(status); }

 private:
  static grpc::ByteBuffer Buffer(const v1::Chunk& chunk) {
    grpc::Slice slice(chunk.SerializeAsString());
    return grpc::ByteBuffer(&slice, 1);
  }

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer first_, second_, read_;
  bool first_done_ = false;  // OnWriteDone's
  std::promise<void> first_written_;
  std::promise<grpc::Status> done_;
};

// Note [Draining], step 4: a streamed request still arriving when the drain begins is a call in
// flight too; it is served, however long after the last admitted call it arrives.
TEST(DrainTest, AnUploadStillArrivingIsServed) {
  TestServer server;
  TwoPartUpload upload(server.client().channel(), SquareRequest());
  for (const absl::Time end = absl::Now() + absl::Seconds(10);
       server.server().service().uploads().open() == 0 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(server.server().service().uploads().open(), 1);

  std::atomic<bool> drained{false};
  std::thread stop([&] { drained = server.server().Shutdown(absl::Seconds(30)); });
  // Longer than the 2 s that calls other than grad calls get.
  absl::SleepFor(absl::Seconds(2.5));
  upload.SendRest();
  const grpc::Status status = upload.Wait();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  stop.join();
  EXPECT_TRUE(drained);
  EXPECT_EQ(server.server().service().counters().requests_ok(), 1);
}

// Note [Draining], step 5: a health Watch stream, which never ends by itself, does not hold
// the drain to its grace period.
TEST(DrainTest, AHealthWatchDoesNotHoldTheDrain) {
  TestServer server;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub =
      grpc::health::v1::Health::NewStub(server.client().channel());
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> watch =
      stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  const absl::Time start = absl::Now();
  std::atomic<bool> drained{false};
  std::thread stop([&] { drained = server.server().Shutdown(absl::Seconds(30)); });
  // Told NOT_SERVING at once, then the stream ends with the server.
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  while (watch->Read(&response)) {
  }
  watch->Finish().IgnoreError();
  stop.join();
  EXPECT_TRUE(drained);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace gradserve::testing
