// Graph sessions (Note [Graph sessions] in server/session/session_store.h) on a real server:
// Forward, Backward (again, with and without retain_graph), Extend, Release, the TTL, the
// per-tenant cap, memory back to zero, draining, and the same values and gradients as the
// one-shot ComputeGradients request's.

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// x [3] and w [3] require grad; y = tanh(x * w); loss = sum(y * y).
v1::GradRequest Model() {
  RequestBuilder b;
  b.RequestId("model")
      .Leaf("x", HostTensor::Float32({1, 2, 3}, {3}), true)
      .Leaf("w", HostTensor::Float32({0.5f, -1, 0.25f}, {3}), true)
      .Op("mul", {"x", "w"}, {"xw"})
      .Op("tanh", {"xw"}, {"y"})
      .Op("mul", {"y", "y"}, {"yy"})
      .Op("sum", {"yy"}, {"loss"})
      .ReturnValue("y")
      .ReturnValue("loss");
  return b.request();
}

v1::ForwardRequest ForwardOf(const v1::GradRequest& request) {
  v1::ForwardRequest forward;
  forward.set_request_id(request.request_id());
  *forward.mutable_graph() = request.graph();
  *forward.mutable_return_values() = request.return_values();
  return forward;
}

v1::BackwardCall GradCall(bool retain_graph) {
  v1::BackwardCall call;
  call.add_roots("loss");
  call.add_inputs("x");
  call.add_inputs("w");
  call.set_retain_graph(retain_graph);
  return call;
}

std::vector<double> Values(const v1::Tensor& tensor) {
  absl::StatusOr<HostTensor> t = HostTensor::FromProto(tensor);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->ToDoubles() : std::vector<double>{};
}

class SessionTest : public ::testing::Test {
 protected:
  explicit SessionTest(server::ServerOptions options = Options()) : server_(options) {
    stub_ = v1::GradService::NewStub(
        grpc::CreateChannel(server_.target(), grpc::InsecureChannelCredentials()));
  }

  static server::ServerOptions Options() {
    server::ServerOptions options = TestOptions();
    options.max_sessions_per_tenant = 3;
    return options;
  }

  grpc::Status Forward(const v1::ForwardRequest& request, v1::ForwardResponse* response) {
    grpc::ClientContext context;
    return stub_->Forward(&context, request, response);
  }
  std::string MustForward(v1::ForwardResponse* response = nullptr) {
    v1::ForwardResponse local;
    if (response == nullptr) response = &local;
    grpc::Status s = Forward(ForwardOf(Model()), response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response->session_id();
  }
  grpc::Status Backward(const std::string& id, const std::vector<v1::BackwardCall>& calls,
                        v1::BackwardResponse* response = nullptr) {
    v1::BackwardResponse local;
    v1::BackwardRequest request;
    request.set_request_id("b");
    request.set_session_id(id);
    for (const v1::BackwardCall& call : calls) *request.add_calls() = call;
    grpc::ClientContext context;
    return stub_->Backward(&context, request, response != nullptr ? response : &local);
  }
  grpc::Status Extend(const std::string& id, const v1::Graph& graph,
                      const std::vector<std::string>& return_values = {},
                      v1::ExtendResponse* response = nullptr) {
    v1::ExtendResponse local;
    v1::ExtendRequest request;
    request.set_request_id("e");
    request.set_session_id(id);
    *request.mutable_graph() = graph;
    for (const std::string& name : return_values) request.add_return_values(name);
    grpc::ClientContext context;
    return stub_->Extend(&context, request, response != nullptr ? response : &local);
  }
  grpc::Status Release(const std::string& id) {
    v1::ReleaseRequest request;
    request.set_session_id(id);
    v1::ReleaseResponse response;
    grpc::ClientContext context;
    return stub_->Release(&context, request, &response);
  }
  int64_t MemoryUsed() { return server_.server().service().memory()->used(); }
  int64_t Sessions() { return server_.server().service().sessions().size(); }

  TestServer server_;
  std::unique_ptr<v1::GradService::Stub> stub_;
};

TEST_F(SessionTest, ForwardThenBackwardEqualsOneShotRequest) {
  v1::GradRequest one_shot = Model();
  *one_shot.add_calls() = GradCall(false);
  absl::StatusOr<client::GradResult> expected = server_.client().Grad(one_shot);
  ASSERT_TRUE(expected.ok()) << expected.status();

  v1::ForwardResponse forward;
  const std::string id = MustForward(&forward);
  ASSERT_EQ(id.size(), 32u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  ASSERT_EQ(forward.values_size(), 2);
  EXPECT_EQ(forward.values(0).name(), "y");
  EXPECT_EQ(Values(forward.values(0).value()), expected->values.at(0).second.ToDoubles());
  EXPECT_EQ(Values(forward.values(1).value()), expected->values.at(1).second.ToDoubles());
  EXPECT_GT(forward.num_nodes(), 0);
  EXPECT_EQ(Sessions(), 1);
  EXPECT_GT(MemoryUsed(), 0);  // the held graph counts

  v1::BackwardResponse backward;
  grpc::Status s = Backward(id, {GradCall(false)}, &backward);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(backward.calls_size(), 1);
  ASSERT_EQ(backward.calls(0).gradients_size(), 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(backward.calls(0).gradients(k).name(), expected->calls[0].gradients[k].name);
    EXPECT_EQ(Values(backward.calls(0).gradients(k).value()),
              expected->calls[0].gradients[k].value->ToDoubles());
  }
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(Sessions(), 0);
  EXPECT_EQ(MemoryUsed(), 0);
}

TEST_F(SessionTest, BackwardAgainNeedsRetainGraph) {
  const std::string id = MustForward();
  v1::BackwardResponse first, second;
  ASSERT_TRUE(Backward(id, {GradCall(true)}, &first).ok());
  grpc::Status s = Backward(id, {GradCall(false)}, &second);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(Values(first.calls(0).gradients(k).value()),
              Values(second.calls(0).gradients(k).value()));
  }
  // The second call freed the saved tensors, as PyTorch's backward without retain_graph does.
  s = Backward(id, {GradCall(false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  // The session is still held (a failed call does not end it) until released.
  EXPECT_EQ(Sessions(), 1);
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

TEST_F(SessionTest, AccumulatedGradPersistsAcrossBackwardCalls) {
  const std::string id = MustForward();
  v1::BackwardCall call;
  call.add_roots("loss");
  call.add_inputs("x");
  call.set_accumulate_grad(true);
  call.set_retain_graph(true);
  v1::BackwardResponse first, second;
  ASSERT_TRUE(Backward(id, {call}, &first).ok());
  ASSERT_TRUE(Backward(id, {call}, &second).ok());
  const std::vector<double> once = Values(first.calls(0).gradients(0).value());
  const std::vector<double> twice = Values(second.calls(0).gradients(0).value());
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
  ASSERT_TRUE(Release(id).ok());
}

TEST_F(SessionTest, UnknownReleasedAndMalformedIdsAreNotFound) {
  grpc::Status s = Backward("0123456789abcdef0123456789abcdef", {GradCall(false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("0123456789abcdef0123456789abcdef"), std::string::npos);
  const std::string id = MustForward();
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(Release(id).error_code(), grpc::StatusCode::NOT_FOUND);
  s = Backward(id, {GradCall(false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find(id), std::string::npos);
  // A long id is quoted truncated, not echoed whole.
  s = Backward(std::string(10000, 'a'), {GradCall(false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(s.error_message().size(), 400u);
}

TEST_F(SessionTest, BadCallsLeaveTheSessionUsable) {
  const std::string id = MustForward();
  v1::BackwardCall bad = GradCall(true);
  bad.set_roots(0, "nope");
  grpc::Status s = Backward(id, {bad});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Backward(id, {GradCall(false)}).ok());
  ASSERT_TRUE(Release(id).ok());
}

TEST_F(SessionTest, PerTenantCap) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(MustForward());
  v1::ForwardResponse response;
  grpc::Status s = Forward(ForwardOf(Model()), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("--max_sessions_per_tenant"), std::string::npos);
  ASSERT_TRUE(Release(ids[0]).ok());
  ids[0] = MustForward();
  for (const std::string& id : ids) ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

TEST_F(SessionTest, TwoBackwardCallsAtOnceRunOneAfterTheOther) {
  // Note [Concurrent backward calls on a session]: without retain_graph, exactly one of two
  // calls at once succeeds and the other fails as PyTorch's second backward does.
  for (int round = 0; round < 5; ++round) {
    const std::string id = MustForward();
    auto call = [&] { return Backward(id, {GradCall(false)}).error_code(); };
    std::future<grpc::StatusCode> a = std::async(std::launch::async, call);
    std::future<grpc::StatusCode> b = std::async(std::launch::async, call);
    const grpc::StatusCode ca = a.get(), cb = b.get();
    EXPECT_TRUE((ca == grpc::StatusCode::OK && cb == grpc::StatusCode::FAILED_PRECONDITION) ||
                (cb == grpc::StatusCode::OK && ca == grpc::StatusCode::FAILED_PRECONDITION))
        << ca << " " << cb;
    // Whichever ran second found the saved tensors freed; so does any later call.
    EXPECT_EQ(Backward(id, {GradCall(true)}).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    ASSERT_TRUE(Release(id).ok());
  }
  // With retain_graph both succeed, with the same gradients.
  const std::string id = MustForward();
  auto call = [&] {
    v1::BackwardResponse r;
    EXPECT_TRUE(Backward(id, {GradCall(true)}, &r).ok());
    return Values(r.calls(0).gradients(0).value());
  };
  std::future<std::vector<double>> a = std::async(std::launch::async, call);
  std::future<std::vector<double>> b = std::async(std::launch::async, call);
  EXPECT_EQ(a.get(), b.get());
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

// The ops Extend adds to Model(): loss2 = sum((y - t)^2) * s, with leaves t and s.
v1::Graph Extension() {
  RequestBuilder b;
  b.Leaf("t", HostTensor::Float32({0.5f, -0.5f, 1}, {3}))
      .Leaf("s", HostTensor::Float32({3}, {}))
      .Op("sub", {"y", "t"}, {"d"})
      .Op("mul", {"d", "d"}, {"dd"})
      .Op("sum", {"dd"}, {"sq"})
      .Op("mul", {"sq", "s"}, {"loss2"});
  return b.request().graph();
}

v1::BackwardCall GradOf(const std::string& root) {
  v1::BackwardCall call = GradCall(true);
  call.set_roots(0, root);
  return call;
}

// Note [Session calls inline]: a Backward over a small graph runs on gRPC's thread; one over
// a graph with an op the estimate does not bound, or over an extended graph, on the pool.
TEST_F(SessionTest, SmallBackwardCallsRunInlineOthersOnThePool) {
  auto inline_calls = [&] { return server_.server().service().requests_inline(); };
  const std::string id = MustForward();
  int64_t before = inline_calls();
  v1::BackwardResponse inline_response;
  ASSERT_TRUE(Backward(id, {GradCall(true)}, &inline_response).ok());
  EXPECT_EQ(inline_calls(), before + 1);

  // The same graph with a matmul (not bounded by the estimate): its calls use the pool, with
  // the same answer.
  v1::GradRequest model = Model();
  model.mutable_graph()->mutable_ops(2)->set_op("matmul");  // y . y, a scalar, as sum(y * y)
  model.mutable_graph()->mutable_ops(3)->set_op("mul");     // loss = yy * 1
  model.mutable_graph()->mutable_ops(3)->add_inputs("one");
  RequestBuilder one;
  one.Leaf("one", HostTensor::Float32({1}, {}));
  *model.mutable_graph()->add_leaves() = one.request().graph().leaves(0);
  v1::ForwardResponse forward;
  ASSERT_TRUE(Forward(ForwardOf(model), &forward).ok());
  before = inline_calls();
  v1::BackwardResponse pool_response;
  grpc::Status s = Backward(forward.session_id(), {GradCall(true)}, &pool_response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(inline_calls(), before);
  ASSERT_EQ(pool_response.calls(0).gradients_size(), 2);
  for (int i = 0; i < 2; ++i) {
    std::vector<double> a = Values(inline_response.calls(0).gradients(i).value());
    std::vector<double> b = Values(pool_response.calls(0).gradients(i).value());
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-5) << i << " " << j;
  }

  // Extended: its graph is no longer estimated.
  ASSERT_TRUE(Extend(id, Extension()).ok());
  before = inline_calls();
  ASSERT_TRUE(Backward(id, {GradOf("loss2")}).ok());
  EXPECT_EQ(inline_calls(), before);
  ASSERT_TRUE(Release(id).ok());
  ASSERT_TRUE(Release(forward.session_id()).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

class SessionNoInlineTest : public SessionTest {
 protected:
  SessionNoInlineTest() : SessionTest(NoInline()) {}
  static server::ServerOptions NoInline() {
    server::ServerOptions options = Options();
    options.max_inline_cost = 0;
    return options;
  }
};

TEST_F(SessionNoInlineTest, ZeroMaxInlineCostSendsBackwardToThePool) {
  const std::string id = MustForward();
  ASSERT_TRUE(Backward(id, {GradCall(true)}).ok());
  EXPECT_EQ(server_.server().service().requests_inline(), 0);
  ASSERT_TRUE(Release(id).ok());
}

TEST_F(SessionTest, ExtendThenBackwardEqualsOneShotRequest) {
  // The one-shot request: Model() with the extension's leaves and ops at its end.
  v1::GradRequest one_shot = Model();
  const v1::Graph extension = Extension();
  for (const v1::Leaf& leaf : extension.leaves()) *one_shot.mutable_graph()->add_leaves() = leaf;
  for (const v1::Op& op : extension.ops()) *one_shot.mutable_graph()->add_ops() = op;
  one_shot.add_return_values("loss2");
  *one_shot.add_calls() = GradOf("loss2");
  *one_shot.add_calls() = GradOf("loss");
  absl::StatusOr<client::GradResult> expected = server_.client().Grad(one_shot);
  ASSERT_TRUE(expected.ok()) << expected.status();

  const std::string id = MustForward();
  const int64_t after_forward = MemoryUsed();
  v1::ExtendResponse extended;
  grpc::Status s = Extend(id, extension, {"loss2", "y"}, &extended);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(extended.values_size(), 2);
  EXPECT_EQ(extended.values(0).name(), "loss2");
  EXPECT_EQ(Values(extended.values(0).value()), expected->values.at(2).second.ToDoubles());
  EXPECT_EQ(extended.num_nodes(), 4);      // sub, mul, sum, mul
  EXPECT_GT(MemoryUsed(), after_forward);  // the extension counts against the session

  v1::BackwardResponse backward;
  s = Backward(id, {GradOf("loss2"), GradOf("loss")}, &backward);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(backward.calls_size(), 2);
  for (int c = 0; c < 2; ++c) {
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(Values(backward.calls(c).gradients(k).value()),
                expected->calls[c].gradients[k].value->ToDoubles())
          << "call " << c << " input " << k;
    }
  }
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

TEST_F(SessionTest, ExtendRefusesUnknownAndRepeatedNamesAndGoesOn) {
  const std::string id = MustForward();
  RequestBuilder unknown;
  unknown.Op("exp", {"nope"}, {"e"});
  grpc::Status s = Extend(id, unknown.request().graph());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("'nope'"), std::string::npos) << s.error_message();
  RequestBuilder repeated;
  repeated.Op("exp", {"y"}, {"loss"});
  s = Extend(id, repeated.request().graph());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("'loss'"), std::string::npos) << s.error_message();
  // An op that fails while running (shapes that do not broadcast) leaves nothing either.
  RequestBuilder bad_shape;
  bad_shape.Leaf("z", HostTensor::Float32({1, 2}, {2})).Op("add", {"y", "z"}, {"yz"});
  s = Extend(id, bad_shape.request().graph());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // The names those failed calls would have defined are free, and the session works.
  RequestBuilder good;
  good.Leaf("z", HostTensor::Float32({1, 2, 3}, {3}))
      .Op("add", {"y", "z"}, {"yz"})
      .Op("sum", {"yz"}, {"e"});
  ASSERT_TRUE(Extend(id, good.request().graph()).ok());
  EXPECT_TRUE(Backward(id, {GradOf("e")}).ok());
  EXPECT_EQ(Extend("0123456789abcdef0123456789abcdef", good.request().graph()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Release(id).ok());
  s = Extend(id, good.request().graph());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find(id), std::string::npos);
  EXPECT_EQ(MemoryUsed(), 0);
}

// A session's graph and its extensions share the request memory limit.
class SessionBudgetTest : public SessionTest {
 protected:
  SessionBudgetTest() : SessionTest(SmallOptions()) {}
  static server::ServerOptions SmallOptions() {
    server::ServerOptions options = Options();
    options.limits.max_memory_bytes = 1 << 20;
    return options;
  }
};

TEST_F(SessionBudgetTest, ExtensionsCountAgainstTheSessionsMemoryLimit) {
  const std::string id = MustForward();
  auto extension = [](const std::string& name) {
    RequestBuilder b;
    b.Leaf(name, HostTensor::Float32(std::vector<float>(150'000, 1.0f), {150'000}));  // 600 kB
    return b.request().graph();
  };
  ASSERT_TRUE(Extend(id, extension("a")).ok());
  grpc::Status s = Extend(id, extension("b"));  // 1.2 MB with the first: over 1 MiB
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(Backward(id, {GradCall(false)}).ok());
  ASSERT_TRUE(Release(id).ok());
  EXPECT_EQ(MemoryUsed(), 0);
}

class SessionTtlTest : public SessionTest {
 protected:
  SessionTtlTest() : SessionTest(TtlOptions()) {}
  static server::ServerOptions TtlOptions() {
    server::ServerOptions options = Options();
    options.session_idle_ttl = absl::Milliseconds(300);
    return options;
  }
};

TEST_F(SessionTtlTest, IdleSessionExpires) {
  const std::string id = MustForward();
  // Used within the TTL, it stays.
  for (int i = 0; i < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(150));
    ASSERT_TRUE(Backward(id, {GradCall(true)}).ok());
  }
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (Sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Sessions(), 0);
  EXPECT_EQ(MemoryUsed(), 0);
  grpc::Status s = Backward(id, {GradCall(true)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("--session_idle_ttl"), std::string::npos);
}

TEST_F(SessionTest, DrainingEndsSessions) {
  const std::string id = MustForward();
  server_.server().service().StartDraining();
  EXPECT_EQ(Sessions(), 0);
  EXPECT_EQ(MemoryUsed(), 0);
  grpc::Status s = Backward(id, {GradCall(false)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("ended its sessions"), std::string::npos);
  s = Extend(id, Extension());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::ForwardResponse response;
  s = Forward(ForwardOf(Model()), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace gradserve::testing
