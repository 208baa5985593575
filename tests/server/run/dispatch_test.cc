// Note [Inline or pool]: which requests run inline on gRPC's thread, and that admission,
// deadlines, cancellation, bad input and counters work the same for them.

#include "server/run/dispatch.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/load/scenarios.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using server::kUnboundedCost;

const int64_t kDefaultLimit = server::ServerOptions().max_inline_cost;

// The estimate and the decision for a request as the server sees it (its serialized size).
int64_t EstimateInlineCost(const v1::GradRequest& r) {
  return server::EstimateInlineCost(r, static_cast<int64_t>(r.ByteSizeLong()));
}
bool RunsInline(const v1::GradRequest& r, int64_t max_inline_cost) {
  return server::RunsInline(r, static_cast<int64_t>(r.ByteSizeLong()), max_inline_cost);
}

// The load tester's grad_tiny: a 10-op graph of [8]-sized tensors.
v1::GradRequest TinyRequest() { return load::GradTinyRequest(); }

// loss = sum(x * y) for float32 leaves of the given shapes.
v1::GradRequest ProductRequest(const std::vector<int64_t>& x_shape,
                               const std::vector<int64_t>& y_shape) {
  auto zeros = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return HostTensor::Float32(std::vector<float>(n, 0.5f), shape);
  };
  RequestBuilder b;
  b.Leaf("x", zeros(x_shape), true)
      .Leaf("y", zeros(y_shape))
      .Op("mul", {"x", "y"}, {"p"})
      .Op("sum", {"p"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

TEST(EstimateInlineCostTest, CountsItemsPassesAndTheElementBound) {
  // square: 1 leaf + 2 ops + 1 root + 1 input = 5 items, 2 passes, 3 elements (below 64).
  const v1::GradRequest square = SquareRequest();
  EXPECT_EQ(EstimateInlineCost(square),
            5 * 2 * server::kMinElementsPerItem + static_cast<int64_t>(square.ByteSizeLong()));
  // 2 leaves + 2 ops + 1 root + 1 input, 2 passes; [32, 1] * [1, 32] may reach 32^2.
  const v1::GradRequest product = ProductRequest({32, 1}, {1, 32});
  EXPECT_EQ(EstimateInlineCost(product),
            6 * 2 * 32 * 32 + static_cast<int64_t>(product.ByteSizeLong()));
  EXPECT_EQ(server::EstimateInlineCost(square, -1), kUnboundedCost);
}

TEST(EstimateInlineCostTest, TinyRequestsRunInlineUnderTheDefault) {
  EXPECT_TRUE(RunsInline(SquareRequest(), kDefaultLimit));
  EXPECT_TRUE(RunsInline(TinyRequest(), kDefaultLimit));
  EXPECT_FALSE(RunsInline(TinyRequest(), 0));  // 0 turns inline off
  EXPECT_FALSE(RunsInline(TinyRequest(), EstimateInlineCost(TinyRequest()) - 1));
}

TEST(EstimateInlineCostTest, LargeOrBroadcastTensorsGoToThePool) {
  EXPECT_FALSE(RunsInline(ProductRequest({4096}, {4096}), kDefaultLimit));
  // Two small leaves whose broadcast is 1000 x 1000.
  EXPECT_FALSE(RunsInline(ProductRequest({1000, 1}, {1000}), kDefaultLimit));
  // A small shape with far more bytes than it needs: validation reads them all to refuse it.
  v1::GradRequest stuffed = SquareRequest();
  stuffed.mutable_graph()->mutable_leaves(0)->mutable_value()->set_data(std::string(1 << 20, 0));
  EXPECT_FALSE(RunsInline(stuffed, kDefaultLimit));
}

TEST(EstimateInlineCostTest, UnboundedFeaturesGoToThePool) {
  auto with_op = [](const std::string& op) {
    v1::GradRequest r = SquareRequest();
    r.mutable_graph()->mutable_ops(0)->set_op(op);
    return EstimateInlineCost(r);
  };
  for (const char* op : {"matmul", "expand", "reshape", "conv2d", "checkpoint", "grad", "nope"}) {
    EXPECT_EQ(with_op(op), kUnboundedCost) << op;
  }
  // Every inline op, and names that differ from one only in length, a NUL byte or a ninth
  // byte (the list compares names packed into 8 bytes).
  for (const char* op :
       {"add",  "sub",      "mul",   "div",   "pow",  "where", "neg",    "abs",     "sign",
        "exp",  "log",      "sqrt",  "rsqrt", "sin",  "cos",   "tanh",   "sigmoid", "relu",
        "gelu", "softplus", "clamp", "sum",   "mean", "amax",  "detach", "hook"}) {
    EXPECT_NE(with_op(op), kUnboundedCost) << op;
  }
  for (const std::string& op :
       {std::string("ad"), std::string("addd"), std::string("add\0", 4), std::string("\0add", 4),
        std::string("softplus+"), std::string(), std::string("Add"), std::string(8, '\0')}) {
    EXPECT_EQ(with_op(op), kUnboundedCost) << absl::CEscape(op);
  }

  v1::GradRequest create_graph = SquareRequest();
  create_graph.mutable_calls(0)->set_create_graph(true);
  EXPECT_EQ(EstimateInlineCost(create_graph), kUnboundedCost);

  v1::GradRequest body = SquareRequest();
  body.mutable_graph()->mutable_ops(0)->mutable_body();
  EXPECT_EQ(EstimateInlineCost(body), kUnboundedCost);

  v1::GradRequest device = SquareRequest();
  device.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("sim:0");
  EXPECT_EQ(EstimateInlineCost(device), kUnboundedCost);
  device.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("cpu");
  EXPECT_NE(EstimateInlineCost(device), kUnboundedCost);

  v1::GradRequest seed_device = SquareRequest();
  v1::Tensor& seed = (*seed_device.mutable_calls(0)->mutable_seeds())["loss"];
  seed.set_dtype(v1::DTYPE_FLOAT32);
  seed.set_device("sim:0");
  EXPECT_EQ(EstimateInlineCost(seed_device), kUnboundedCost);
}

TEST(EstimateInlineCostTest, MalformedShapesGoToThePoolWithoutOverflow) {
  v1::GradRequest negative = SquareRequest();
  negative.mutable_graph()->mutable_leaves(0)->mutable_value()->set_shape(0, -3);
  EXPECT_EQ(EstimateInlineCost(negative), kUnboundedCost);

  v1::GradRequest huge = SquareRequest();
  v1::Tensor* x = huge.mutable_graph()->mutable_leaves(0)->mutable_value();
  x->set_shape(0, int64_t{1} << 40);
  x->add_shape(int64_t{1} << 40);
  EXPECT_EQ(EstimateInlineCost(huge), kUnboundedCost);
  EXPECT_FALSE(RunsInline(huge, INT64_MAX));
}

// Note [Session calls inline]: a session's Backward costs one pass over the held graph per
// call, plus the calls' own names and seeds and the request's bytes.
TEST(EstimateBackwardCostTest, OnePassPerCallPlusTheCallsOwnItems) {
  v1::GradRequest square = SquareRequest();
  const int64_t pass = server::EstimateInlineCost(square, 0) / 2;  // square has 2 passes
  google::protobuf::RepeatedPtrField<v1::BackwardCall> calls = square.calls();
  // 1 root + 1 input, each at least kMinElementsPerItem.
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, 100),
            pass + 2 * server::kMinElementsPerItem + 100);
  *calls.Add() = calls[0];
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, 100),
            2 * pass + 4 * server::kMinElementsPerItem + 100);

  EXPECT_EQ(server::EstimateBackwardCost(kUnboundedCost, calls, 100), kUnboundedCost);
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, -1), kUnboundedCost);
  EXPECT_EQ(server::EstimateBackwardCost(kUnboundedCost / 2 + 1, calls, 0), kUnboundedCost);
  calls[1].set_create_graph(true);
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, 100), kUnboundedCost);
  calls[1].set_create_graph(false);
  v1::Tensor& seed = (*calls[1].mutable_seeds())["loss"];
  seed.set_dtype(v1::DTYPE_FLOAT32);
  seed.add_shape(int64_t{1} << 40);
  seed.add_shape(int64_t{1} << 40);
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, 100), kUnboundedCost);
  seed.clear_shape();
  seed.set_device("sim:0");
  EXPECT_EQ(server::EstimateBackwardCost(pass, calls, 100), kUnboundedCost);
}

// A hook that holds requests with a given id at the start of their work.
struct Hold {
  std::string id;
  absl::Notification entered;
  absl::Notification release;
};

class DispatchTest : public ::testing::Test {
 protected:
  // A server whose hook waits for the deadline of requests named "until-deadline" and holds
  // those named hold_.id.
  server::ServerOptions HookedOptions() {
    server::ServerOptions options = TestOptions();
    options.before_run_for_testing = [this](const v1::GradRequest& request,
                                            const autograd::CancellationToken& token) {
      if (request.request_id() == "until-deadline") {
        while (token.Check().ok()) absl::SleepFor(absl::Milliseconds(1));
      }
      if (!hold_.id.empty() && request.request_id() == hold_.id) {
        hold_.entered.Notify();
        hold_.release.WaitForNotification();
      }
    };
    return options;
  }

  static v1::Counters Counters(TestServer& server) {
    absl::StatusOr<v1::ServerInfo> info = server.client().GetServerInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->counters() : v1::Counters();
  }

  Hold hold_;
};

TEST_F(DispatchTest, SmallRequestsRunInlineLargeOnesOnThePool) {
  TestServer server;
  ASSERT_TRUE(CheckSquareWorks(server.client()).ok());
  EXPECT_EQ(server.server().service().requests_inline(), 1);
  absl::StatusOr<client::GradResult> tiny = server.client().Grad(TinyRequest());
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(server.server().service().requests_inline(), 2);

  absl::StatusOr<client::GradResult> slow = server.client().Grad(SlowRequest(2, 16));
  ASSERT_TRUE(slow.ok()) << slow.status();
  absl::StatusOr<client::GradResult> wide = server.client().Grad(ProductRequest({1000, 1}, {1000}));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(server.server().service().requests_inline(), 2);
  const v1::Counters c = Counters(server);
  EXPECT_EQ(c.requests_ok(), 4);
  EXPECT_EQ(c.in_flight(), 0);
  EXPECT_GT(c.bytes_received(), 0);
  EXPECT_GT(c.bytes_sent(), 0);
}

// Note [Unary messages reused]: holders are reused by calls of any size, inline or on the
// pool, and each answer is its own request's.
TEST_F(DispatchTest, ReusedMessagesCarryEachCallsOwnAnswer) {
  TestServer server;
  for (int i = 0; i < 20; ++i) {
    v1::GradRequest big = ProductRequest({4096}, {4096});  // 32 KiB of leaves: past 8 KiB
    big.set_request_id(absl::StrCat("big-", i));
    absl::StatusOr<client::GradResult> r = server.client().Grad(big);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->request_id, big.request_id());
    ASSERT_EQ(r->calls.size(), 1u);
    const client::Gradient* g = r->calls[0].Find("x");
    ASSERT_TRUE(g != nullptr && g->value);
    EXPECT_EQ(g->value->ToDoubles(), std::vector<double>(4096, 0.5));

    v1::GradRequest tiny = TinyRequest();
    tiny.set_request_id(absl::StrCat("tiny-", i));
    absl::StatusOr<client::GradResult> t = server.client().Grad(tiny);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->request_id, tiny.request_id());
    ASSERT_TRUE(CheckSquareWorks(server.client()).ok());
  }
  EXPECT_EQ(server.server().service().requests_inline(), 40);
}

TEST_F(DispatchTest, ZeroMaxInlineCostSendsEveryRequestToThePool) {
  server::ServerOptions options = TestOptions();
  options.max_inline_cost = 0;
  TestServer server(options);
  ASSERT_TRUE(CheckSquareWorks(server.client()).ok());
  EXPECT_EQ(server.server().service().requests_inline(), 0);
  EXPECT_EQ(Counters(server).requests_ok(), 1);
}

TEST_F(DispatchTest, BadInlineRequestGetsItsStatusAndHarmsNothing) {
  TestServer server;
  v1::GradRequest bad = ProductRequest({3}, {4});
  ASSERT_TRUE(RunsInline(bad, kDefaultLimit));
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(server.server().service().requests_inline(), 1);
  const v1::Counters c = Counters(server);
  EXPECT_EQ(c.requests_failed(), 1);
  EXPECT_EQ(c.in_flight(), 0);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// A client of server without the clients' retries (Note [Several replicas] in
// client/library/channel_target.h), to see each refusal once, as the server sent it.
std::unique_ptr<client::Client> ClientWithoutRetries(const TestServer& server) {
  return std::make_unique<client::Client>(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
}

TEST_F(DispatchTest, InlineRequestsAreAdmittedLikeOthers) {
  server::ServerOptions options = HookedOptions();
  options.max_in_flight = 1;
  hold_.id = "held";
  TestServer server(options);
  // A held inline request fills the server.
  v1::GradRequest held = SquareRequest();
  held.set_request_id("held");
  std::thread first([&] { EXPECT_TRUE(server.client().ComputeGradients(held).ok()); });
  hold_.entered.WaitForNotification();
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(SquareRequest());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  hold_.release.Notify();
  first.join();
  ASSERT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(10)));
  v1::Counters c = Counters(server);
  EXPECT_EQ(c.requests_rejected(), 1);
  EXPECT_EQ(c.requests_ok(), 1);
  EXPECT_EQ(server.server().service().requests_inline(), 1);

  server.server().service().StartDraining();
  r = ClientWithoutRetries(server)->ComputeGradients(SquareRequest());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(Counters(server).requests_rejected(), 2);
}

// Note [Admission without a lock]: draining waits for a held inline call, refuses new ones,
// and wakes once the held call ends.
TEST_F(DispatchTest, DrainingWaitsForInlineCallsInFlight) {
  hold_.id = "held";
  TestServer server(HookedOptions());
  server::GradService& service = server.server().service();
  EXPECT_TRUE(service.WaitUntilIdle(absl::ZeroDuration()));
  v1::GradRequest held = SquareRequest();
  held.set_request_id("held");
  std::thread call([&] { EXPECT_TRUE(server.client().ComputeGradients(held).ok()); });
  hold_.entered.WaitForNotification();
  service.StartDraining();
  EXPECT_FALSE(service.WaitUntilIdle(absl::ZeroDuration()));
  EXPECT_EQ(ClientWithoutRetries(server)->ComputeGradients(SquareRequest()).status().code(),
            absl::StatusCode::kUnavailable);
  std::thread release([&] { hold_.release.Notify(); });
  EXPECT_TRUE(service.WaitUntilIdle(absl::InfiniteDuration()));
  release.join();
  call.join();
  EXPECT_EQ(service.counters().requests_ok(), 1);
  EXPECT_EQ(service.counters().requests_rejected(), 1);
}

TEST_F(DispatchTest, InlineWorkStopsAtTheDeadline) {
  TestServer server(HookedOptions());
  v1::GradRequest request = SquareRequest();
  request.set_request_id("until-deadline");
  ASSERT_TRUE(RunsInline(request, kDefaultLimit));
  client::CallOptions deadline;
  deadline.timeout = absl::Milliseconds(200);
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(request, deadline);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  ASSERT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(10)));
  // The server's own accounting: the work stopped with an error, not an answer.
  const v1::Counters c = Counters(server);
  EXPECT_EQ(c.requests_failed(), 1);
  EXPECT_EQ(c.requests_ok(), 0);
  EXPECT_EQ(server.server().service().requests_inline(), 1);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// gRPC tells a handler of a cancel only once it returned (Note [Inline or pool]), so inline
// work runs to its end; the client gets CANCELLED at once and the server's accounting closes.
TEST_F(DispatchTest, CancelledInlineCallLeavesTheServerConsistent) {
  hold_.id = "held";
  TestServer server(HookedOptions());
  v1::GradRequest held = SquareRequest();
  held.set_request_id("held");
  client::CallCanceller canceller;
  client::CallOptions cancellable;
  cancellable.canceller = &canceller;
  std::thread call([&] {
    absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(held, cancellable);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  });
  hold_.entered.WaitForNotification();
  canceller.Cancel();
  call.join();
  hold_.release.Notify();
  ASSERT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(10)));
  const v1::Counters c = Counters(server);
  EXPECT_EQ(c.requests_total(), 1);
  EXPECT_EQ(c.requests_ok() + c.requests_failed(), 1);
  EXPECT_EQ(server.server().service().requests_inline(), 1);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
