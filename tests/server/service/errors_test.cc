// Bad requests: each gets its status code (DESIGN.md section 5) and a message naming the
// culprit, and the server keeps answering good requests during and after.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

struct BadRequest {
  std::string name;
  std::function<v1::GradRequest()> make;
  absl::StatusCode code;
  std::vector<std::string> message_has;  // substrings the message must contain
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const BadRequest& c, std::ostream* os) { *os << c.name; }

v1::GradRequest WithLeafData(const std::string& data, v1::DType dtype, std::vector<int64_t> shape) {
  RequestBuilder b;
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data;
  b.Leaf("x", t, dtype == v1::DTYPE_FLOAT32).Op("sum", {"x"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

v1::GradRequest Chain(int ops) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1}, {1}), true);
  std::string h = "x";
  for (int i = 0; i < ops; ++i) {
    b.Op("neg", {h}, {absl::StrCat("n", i)});
    h = absl::StrCat("n", i);
  }
  b.Op("sum", {h}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

// 40 outer products of a 2048-vector with itself: 16 MiB each, 640 MiB together, over the
// test server's 256 MiB per request if all are held at once; with returned, the request
// returns them all, so they are (Note [Values freed after their last use]).
v1::GradRequest ManyProducts(bool returned) {
  RequestBuilder b;
  b.Leaf("c", HostTensor::Float32(std::vector<float>(2048, 1), {2048, 1}))
      .Leaf("r", HostTensor::Float32(std::vector<float>(2048, 1), {1, 2048}));
  for (int i = 0; i < 40; ++i) b.Op("mul", {"c", "r"}, {absl::StrCat("p", i)});
  v1::GradRequest request = b.request();
  for (int i = 0; returned && i < 40; ++i) request.add_return_values(absl::StrCat("p", i));
  return request;
}

v1::GradRequest NestedCheckpoints(int depth) {
  v1::GradRequest r;
  r.mutable_graph()->add_leaves()->set_name("x");
  HostTensor::Float32({1}, {1}).ToProto(r.mutable_graph()->mutable_leaves(0)->mutable_value());
  r.mutable_graph()->mutable_leaves(0)->set_requires_grad(true);
  v1::Graph* g = r.mutable_graph();
  for (int d = 0; d < depth; ++d) {
    v1::Op* op = g->add_ops();
    op->set_op("checkpoint");
    op->add_inputs(d == 0 ? "x" : "in");
    op->add_outputs(d == 0 ? "y" : "out");
    g = op->mutable_body();
    g->add_inputs("in");
    g->add_outputs("out");
  }
  v1::Op* op = g->add_ops();
  op->set_op("neg");
  op->add_inputs("in");
  op->add_outputs("out");
  return r;
}

std::vector<BadRequest> Cases() {
  std::vector<BadRequest> cases;
  cases.push_back({"unknown_op",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     r.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"frobnicate"}});
  cases.push_back({"dangling_reference",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     r.mutable_graph()->mutable_ops(1)->set_inputs(0, "nowhere");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"nowhere"}});
  cases.push_back(
      {"shape_overflow",
       [] {
         return WithLeafData("", v1::DTYPE_FLOAT32, {int64_t{1} << 40, int64_t{1} << 40});
       },
       absl::StatusCode::kInvalidArgument,
       {"leaf 'x'"}});
  cases.push_back({"negative_size",
                   [] { return WithLeafData("", v1::DTYPE_FLOAT32, {-3}); },
                   absl::StatusCode::kInvalidArgument,
                   {"leaf 'x'"}});
  // No element, but strides past int64 (found by tests/fuzz).
  cases.push_back({"empty_but_strides_overflow",
                   [] {
                     return WithLeafData("", v1::DTYPE_FLOAT32, {0, 2, 4, INT64_MAX});
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"leaf 'x'", "strides larger than int64"}});
  cases.push_back({"byte_length_mismatch",
                   [] { return WithLeafData(std::string(5, '\0'), v1::DTYPE_FLOAT32, {2}); },
                   absl::StatusCode::kInvalidArgument,
                   {"leaf 'x'", "5 bytes", "needs 8"}});
  cases.push_back(
      {"bad_dtype",
       [] { return WithLeafData(std::string(8, '\0'), static_cast<v1::DType>(17), {2}); },
       absl::StatusCode::kInvalidArgument,
       {"leaf 'x'", "dtype 17"}});
  cases.push_back({"bool_byte_not_0_or_1",
                   [] { return WithLeafData(std::string("\x01\x07", 2), v1::DTYPE_BOOL, {2}); },
                   absl::StatusCode::kInvalidArgument,
                   {"leaf 'x'", "bool"}});
  cases.push_back({"unknown_device",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     r.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("cuda:7");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"leaf 'x'", "cuda:7"}});
  cases.push_back({"over_max_ops",
                   [] { return Chain(5001); },
                   absl::StatusCode::kResourceExhausted,
                   {"--max_ops"}});
  cases.push_back({"over_max_leaves",
                   [] {
                     RequestBuilder b;
                     for (int i = 0; i < 21; ++i)
                       b.Leaf(absl::StrCat("l", i), HostTensor::Float32({1}, {1}));
                     return b.request();
                   },
                   absl::StatusCode::kResourceExhausted,
                   {"--max_leaves"}});
  cases.push_back({"over_max_tensor_elements",
                   [] { return WithLeafData("", v1::DTYPE_FLOAT32, {int64_t{9} << 20}); },
                   absl::StatusCode::kResourceExhausted,
                   {"leaf 'x'", "--max_tensor_elements"}});
  cases.push_back({"over_max_memory_bytes_while_computing",
                   [] { return ManyProducts(/*returned=*/true); },
                   absl::StatusCode::kResourceExhausted,
                   {}});
  cases.push_back({"over_max_nesting",
                   [] { return NestedCheckpoints(6); },
                   absl::StatusCode::kResourceExhausted,
                   {"--max_nesting"}});
  cases.push_back({"over_max_backward_calls",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     for (int i = 0; i < 8; ++i) *r.add_calls() = r.calls(0);
                     return r;
                   },
                   absl::StatusCode::kResourceExhausted,
                   {"--max_backward_calls"}});
  cases.push_back({"nan_under_anomaly_mode",
                   [] {
                     RequestBuilder b;
                     b.Leaf("x", HostTensor::Float32({-1}, {1}), true)
                         .Op("sqrt", {"x"}, {"s"})
                         .Op("sum", {"s"}, {"loss"});
                     b.Grad({"loss"}, {"x"}).set_detect_anomaly(true);
                     return b.request();
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"NaN"}});
  cases.push_back({"backward_through_freed_graph",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     *r.add_calls() = r.calls(0);  // the first did not retain the graph
                     return r;
                   },
                   absl::StatusCode::kFailedPrecondition,
                   {"call #1"}});
  cases.push_back({"unused_input_without_allow_unused",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     v1::Leaf* u = r.mutable_graph()->add_leaves();
                     u->set_name("unused_leaf");
                     u->set_requires_grad(true);
                     HostTensor::Float32({1}, {1}).ToProto(u->mutable_value());
                     r.mutable_calls(0)->add_inputs("unused_leaf");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"unused_leaf"}});
  cases.push_back({"non_scalar_root_without_seed",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     r.mutable_calls(0)->set_roots(0, "y");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"y"}});
  cases.push_back({"seed_for_a_value_that_is_not_a_root",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     HostTensor::Float32({1}, {}).ToProto(
                         &(*r.mutable_calls(0)->mutable_seeds())["y"]);
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"'y'", "not one of the call's roots"}});
  cases.push_back({"unknown_return_value",
                   [] {
                     v1::GradRequest r = SquareRequest();
                     r.add_return_values("ghost");
                     return r;
                   },
                   absl::StatusCode::kInvalidArgument,
                   {"ghost"}});
  return cases;
}

class BadRequestTest : public ::testing::TestWithParam<BadRequest> {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};
TestServer* BadRequestTest::server_ = nullptr;

TEST_P(BadRequestTest, GetsItsCodeAndNamesTheCulprit) {
  const BadRequest& c = GetParam();
  client::CallOptions options;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<v1::GradResponse> r = server_->client().ComputeGradients(c.make(), options);
  ASSERT_FALSE(r.ok()) << c.name << " was accepted";
  EXPECT_EQ(r.status().code(), c.code) << r.status();
  EXPECT_NE(r.status().code(), absl::StatusCode::kUnknown);
  EXPECT_FALSE(r.status().message().empty());
  for (const std::string& s : c.message_has) {
    EXPECT_TRUE(absl::StrContains(r.status().message(), s))
        << "message of " << c.name << " lacks '" << s << "': " << r.status().message();
  }
  EXPECT_TRUE(CheckSquareWorks(server_->client()).ok()) << "server broken after " << c.name;
}

INSTANTIATE_TEST_SUITE_P(Table, BadRequestTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

class ServerErrorTest : public ::testing::Test {};

// Bytes that are no GradRequest (a varint that never ends, then text).
constexpr char kGarbage[] = "\xff\xff\xff\xff\x0f garbage";
constexpr int kGarbageBytes = sizeof(kGarbage) - 1;

// Note [Values freed after their last use]: the same products, none of them returned or read
// again, are each dropped as soon as it is made, and the request fits.
TEST_F(ServerErrorTest, ValuesNothingReadsAgainAreFreedAsTheRequestRuns) {
  TestServer server;
  client::CallOptions options;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<v1::GradResponse> r =
      server.client().ComputeGradients(ManyProducts(/*returned=*/false), options);
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST_F(ServerErrorTest, MalformedBytesAreInvalidArgument) {
  TestServer server;
  auto stub = v1::GradService::NewStub(server.client().channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->ComputeGradientsStream(&context);
  v1::Chunk chunk;
  chunk.set_data(std::string(kGarbage, kGarbageBytes));
  stream->Write(chunk);
  stream->WritesDone();
  while (stream->Read(&chunk)) {
  }
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "malformed")) << status.error_message();
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// Sends kGarbage as a unary ComputeGradients call and returns the call's status.
grpc::Status SendGarbageUnary(TestServer& server) {
  return SendUnaryBytes(server.client().channel(), std::string(kGarbage, kGarbageBytes));
}

// Note [Unary messages reused]: the server parses a unary request itself, and bytes that are
// no GradRequest get the same answer as on the stream; the call is counted as failed.
TEST_F(ServerErrorTest, MalformedUnaryBytesAreInvalidArgument) {
  TestServer server;
  const grpc::Status status = SendGarbageUnary(server);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "malformed")) << status.error_message();
  absl::StatusOr<v1::ServerInfo> info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->counters().requests_failed(), 1);
  EXPECT_EQ(info->counters().bytes_received(), kGarbageBytes);
  EXPECT_EQ(info->counters().in_flight(), 0);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

TEST_F(ServerErrorTest, OverMessageAndRequestLimits) {
  server::ServerOptions options = TestOptions();
  options.max_request_bytes = 6 << 20;
  TestServer server(options);
  const int n = 2 << 20;  // 8 MiB of float32: over one message (4 MiB) and the request limit
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(n, 1), {n}), true).Op("sum", {"x"}, {"loss"});
  b.Grad({"loss"}, {"x"});

  client::CallOptions unary;
  unary.transport = client::CallOptions::Transport::kUnary;
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(b.request(), unary);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();

  r = server.client().ComputeGradients(b.request());  // streamed by the client
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--max_request_bytes")) << r.status();
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

// The client's deadline and cancellation stop the work: the server's in-flight count drops
// long before the request would have finished.
TEST_F(ServerErrorTest, DeadlineAndCancellationStopTheWork) {
  TestServer server;
  const v1::GradRequest slow = SlowRequest(2000);

  client::CallOptions deadline;
  deadline.timeout = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(slow, deadline);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  client::CallCanceller canceller;
  client::CallOptions cancellable;
  cancellable.canceller = &canceller;
  std::thread cancel_later([&] {
    WaitForInFlight(server.client(), 1, absl::Seconds(5));
    absl::SleepFor(absl::Milliseconds(100));
    canceller.Cancel();
  });
  start = absl::Now();
  r = server.client().ComputeGradients(slow, cancellable);
  cancel_later.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));

  absl::StatusOr<v1::ServerInfo> info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->counters().requests_failed(), 2);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

TEST_F(ServerErrorTest, ServerFullIsResourceExhaustedAtOnce) {
  server::ServerOptions options = TestOptions();
  options.max_in_flight = 1;
  TestServer server(options);
  auto slow = std::make_unique<SlowCallInFlight>(server.client());
  ASSERT_TRUE(WaitForInFlight(server.client(), 1, absl::Seconds(10)));
  absl::StatusOr<v1::GradResponse> r = server.client().ComputeGradients(SquareRequest());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--max_in_flight")) << r.status();
  // A full server refuses a unary call before parsing it: bytes that would not parse get
  // RESOURCE_EXHAUSTED, not INVALID_ARGUMENT, and are not counted as received.
  const grpc::Status garbage = SendGarbageUnary(server);
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << garbage.error_message();
  absl::StatusOr<v1::ServerInfo> info = server.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->counters().requests_rejected(), 2);
  EXPECT_EQ(info->counters().requests_failed(), 0);
  EXPECT_EQ(info->counters().bytes_received(), 0);
  // Info and ping still answer while the server is full.
  EXPECT_TRUE(server.client().Ping("x").ok());
  slow.reset();  // cancels the slow call and waits for it
  ASSERT_TRUE(WaitForInFlight(server.client(), 0, absl::Seconds(10)));
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
