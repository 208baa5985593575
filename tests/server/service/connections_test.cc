// Note [Connection limits] (server/service/grad_server.h) on an in-process server: idle
// connections are closed, old ones aged out while calls go on, and streams per connection
// capped.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// A new channel of its own (a local subchannel pool: no connection shared with another
// channel to the same address).
std::shared_ptr<grpc::Channel> NewChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// Whether channel's state leaves state within timeout.
bool Leaves(grpc::Channel& channel, grpc_connectivity_state state, absl::Duration timeout) {
  return channel.WaitForStateChange(state, absl::ToChronoTime(absl::Now() + timeout));
}

TEST(ConnectionsTest, AnIdleConnectionIsClosedAndTheClientReconnects) {
  server::ServerOptions options = TestOptions();
  options.max_connection_idle = absl::Milliseconds(300);
  TestServer server(options);
  client::Client client(NewChannel(server.target()));
  ASSERT_TRUE(CheckSquareWorks(client).ok());
  ASSERT_EQ(client.channel()->GetState(false), GRPC_CHANNEL_READY);
  // No call for 300 ms: GOAWAY, and the channel goes idle.
  EXPECT_TRUE(Leaves(*client.channel(), GRPC_CHANNEL_READY, absl::Seconds(5)));
  // The next call reconnects, over a new connection.
  EXPECT_TRUE(CheckSquareWorks(client).ok());
  EXPECT_EQ(server.server().connections_accepted(), 2);
}

TEST(ConnectionsTest, AnOldConnectionIsReplacedWhileCallsGoOn) {
  server::ServerOptions options = TestOptions();
  options.max_connection_age = absl::Milliseconds(400);
  options.max_connection_age_grace = absl::Seconds(5);
  TestServer server(options);
  client::Client client(NewChannel(server.target()));
  int calls = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(2.5); absl::Now() < end; ++calls) {
    client::CallOptions call;
    call.timeout = absl::Seconds(10);
    absl::StatusOr<v1::GradResponse> r = client.ComputeGradients(SquareRequest(), call);
    ASSERT_TRUE(r.ok()) << "call " << calls << ": " << r.status();
    absl::SleepFor(absl::Milliseconds(5));
  }
  // A new connection every 400 ms (+-10%) or so, none of the calls lost.
  EXPECT_GE(server.server().connections_accepted(), 3) << calls << " calls";
}

// A channel of its own whose client sends keepalive pings every `every`, with or without
// calls.
std::shared_ptr<grpc::Channel> PingingChannel(const std::string& target, absl::Duration every) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(absl::ToInt64Milliseconds(every)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
              static_cast<int>(absl::ToInt64Milliseconds(every)));
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

TEST(ConnectionsTest, ClientsMayPingAsOftenAsAllowedAndNoMore) {
  server::ServerOptions options = TestOptions();
  options.min_client_ping_interval = absl::Milliseconds(1500);
  TestServer server(options);
  // Pings every 2 s, with no call: allowed (gRPC's default allows one per 2 h, and would
  // disconnect it after the third ping too early).
  client::Client polite(PingingChannel(server.target(), absl::Seconds(2)));
  // Pings as often as gRPC's client does at most, once a second: sent GOAWAY
  // ("too_many_pings") after its third ping too early.
  client::Client flooding(PingingChannel(server.target(), absl::Milliseconds(100)));
  ASSERT_TRUE(CheckSquareWorks(polite).ok());
  ASSERT_TRUE(CheckSquareWorks(flooding).ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(Leaves(*flooding.channel(), GRPC_CHANNEL_READY, absl::Seconds(10)));
  // The polite client, which has pinged four times by then, is still connected (the first
  // ping after a call never counts).
  EXPECT_FALSE(Leaves(*polite.channel(), GRPC_CHANNEL_READY,
                      std::max(absl::ZeroDuration(), start + absl::Seconds(9) - absl::Now())));
  EXPECT_TRUE(CheckSquareWorks(polite).ok());
  EXPECT_EQ(server.server().connections_accepted(), 2);
}

// A health Watch call that counts the answers it receives.
class Watch : public grpc::ClientReadReactor<grpc::health::v1::HealthCheckResponse> {
 public:
  explicit Watch(grpc::health::v1::Health::Stub& stub) {
    stub.async()->Watch(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  ~Watch() override {
    context_.TryCancel();
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(&done_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mutex_);
      ++answers_;
      last_ = response_.status();
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& /*status*/) override {
    absl::MutexLock lock(&mutex_);
    done_ = true;
  }

  int answers() {
    absl::MutexLock lock(&mutex_);
    return answers_;
  }
  grpc::health::v1::HealthCheckResponse::ServingStatus last() {
    absl::MutexLock lock(&mutex_);
    return last_;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  grpc::health::v1::HealthCheckRequest request_;
  grpc::health::v1::HealthCheckResponse response_;
  absl::Mutex mutex_;
  int answers_ ABSL_GUARDED_BY(mutex_) = 0;
  grpc::health::v1::HealthCheckResponse::ServingStatus last_ ABSL_GUARDED_BY(mutex_) =
      grpc::health::v1::HealthCheckResponse::UNKNOWN;
  bool done_ ABSL_GUARDED_BY(mutex_) = false;
};

// Watches that have had their first answer, after waiting up to timeout for `expected`.
int WatchesAnswered(std::vector<std::unique_ptr<Watch>>& watches, int expected,
                    absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    int answered = 0;
    for (auto& w : watches) answered += w->answers() > 0 ? 1 : 0;
    if (answered >= expected || absl::Now() >= end) return answered;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

TEST(ConnectionsTest, StreamsPerConnectionAreCapped) {
  server::ServerOptions options = TestOptions();
  options.max_concurrent_streams = 4;
  TestServer server(options);
  std::shared_ptr<grpc::Channel> channel = NewChannel(server.target());
  ASSERT_TRUE(channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10))));
  std::unique_ptr<grpc::health::v1::Health::Stub> stub = grpc::health::v1::Health::NewStub(channel);
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 10; ++i) watches.push_back(std::make_unique<Watch>(*stub));
  // Four streams are open and answered; the other six wait, in the client, for one to end.
  EXPECT_EQ(WatchesAnswered(watches, 4, absl::Seconds(10)), 4);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(WatchesAnswered(watches, 5, absl::ZeroDuration()), 4);
  // Ending two lets two more through.
  int cancelled = 0;
  for (auto& w : watches) {
    if (cancelled < 2 && w->answers() > 0) {
      w->Cancel();
      ++cancelled;
    }
  }
  EXPECT_EQ(WatchesAnswered(watches, 6, absl::Seconds(10)), 6);
  EXPECT_EQ(server.server().connections_accepted(), 1);
}

}  // namespace
}  // namespace gradserve::testing
