// End-to-end tests of good requests: a real server on a loopback port and the real client.

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/graph/interpreter.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "server/wire/wire.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Pointwise;

class GradServerTest : public ::testing::Test {
 protected:
  TestServer server_;
};

TEST_F(GradServerTest, SquareGradientIsTwiceX) {
  absl::StatusOr<client::GradResult> r = server_.client().Grad(SquareRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, "square");
  ASSERT_EQ(r->calls.size(), 1u);
  const client::Gradient* g = r->calls[0].Find("x");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->connected);
  ASSERT_TRUE(g->value);
  EXPECT_EQ(g->value->dtype, v1::DTYPE_FLOAT32);
  EXPECT_THAT(g->value->shape, ElementsAre(3));
  EXPECT_THAT(g->value->ToDoubles(), ElementsAre(2, 4, 6));
  EXPECT_GT(r->num_nodes, 0);
  EXPECT_GT(r->timings.total_us(), 0);
}

// An MLP layer: loss = sum(relu(x @ w + b)). Gradients by hand and by the engine directly.
TEST_F(GradServerTest, MlpMatchesHandComputationAndEngine) {
  const std::vector<double> x = {1, -2, 3, 0.5, 1, -1};            // [2, 3]
  const std::vector<double> w = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6};  // [3, 2]
  const std::vector<double> b = {0.05, -0.1};
  RequestBuilder rb;
  rb.Leaf("x", HostTensor::Float64(x, {2, 3}))
      .Leaf("w", HostTensor::Float64(w, {3, 2}), true)
      .Leaf("b", HostTensor::Float64(b, {2}), true)
      .Op("matmul", {"x", "w"}, {"h"})
      .Op("add", {"h", "b"}, {"z"})
      .Op("relu", {"z"}, {"r"})
      .Op("sum", {"r"}, {"loss"})
      .ReturnValue("loss");
  rb.Grad({"loss"}, {"w", "b"});

  // By hand: dL/dz = [z > 0]; dL/dw = x^T dz; dL/db = column sums of dz.
  double z[2][2];
  double loss = 0;
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 2; ++j) {
      z[n][j] = b[j];
      for (int i = 0; i < 3; ++i) z[n][j] += x[n * 3 + i] * w[i * 2 + j];
      loss += std::max(0.0, z[n][j]);
    }
  }
  std::vector<double> dw(6, 0), db(2, 0);
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 2; ++j) {
      const double dz = z[n][j] > 0 ? 1 : 0;
      db[j] += dz;
      for (int i = 0; i < 3; ++i) dw[i * 2 + j] += x[n * 3 + i] * dz;
    }
  }

  absl::StatusOr<client::GradResult> r = server_.client().Grad(rb.request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->calls.size(), 1u);
  ASSERT_EQ(r->calls[0].gradients.size(), 2u);
  EXPECT_THAT(r->calls[0].Find("w")->value->ToDoubles(), Pointwise(DoubleNear(1e-12), dw));
  EXPECT_THAT(r->calls[0].Find("b")->value->ToDoubles(), Pointwise(DoubleNear(1e-12), db));
  ASSERT_EQ(r->values.size(), 1u);
  EXPECT_NEAR(r->values[0].second.ToDoubles().at(0), loss, 1e-12);

  // The engine run directly on the same graph agrees exactly.
  absl::StatusOr<server::EngineRequest> direct = server::FromProto(rb.request(), graph::Limits());
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto recorded = graph::RecordedGraph::Record(*direct->graph, graph::Limits());
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  absl::StatusOr<graph::CallResult> engine = (*recorded)->Backward(direct->calls[0]);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int k = 0; k < 2; ++k) {
    const Tensor& t = engine->grads[k];
    std::vector<double> expected(t.data<double>(), t.data<double>() + t.numel());
    EXPECT_EQ(r->calls[0].gradients[k].value->ToDoubles(), expected);
  }
}

TEST_F(GradServerTest, BackwardSemanticsAccumulateAcrossCalls) {
  v1::GradRequest request = SquareRequest();
  request.clear_calls();
  RequestBuilder b;
  *b.mutable_request() = request;
  b.Backward({"loss"}, {"x"}).set_retain_graph(true);
  b.Backward({"loss"}, {"x"});
  absl::StatusOr<client::GradResult> r = server_.client().Grad(b.request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->calls.size(), 2u);
  EXPECT_THAT(r->calls[0].Find("x")->value->ToDoubles(), ElementsAre(2, 4, 6));
  EXPECT_THAT(r->calls[1].Find("x")->value->ToDoubles(), ElementsAre(4, 8, 12));
}

TEST_F(GradServerTest, SeedsUnusedInputsAndMaterializedGrads) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1, 2, 3}, {3}), true)
      .Leaf("u", HostTensor::Float32({7}, {1}), true)
      .Leaf("three", HostTensor::Float32({3}, {}))
      .Op("mul", {"x", "three"}, {"y"});
  v1::BackwardCall& seeded = b.Grad({"y"}, {"x", "u"});
  seeded.set_allow_unused(true);
  seeded.set_retain_graph(true);
  HostTensor::Float32({1, 10, 100}, {3}).ToProto(&(*seeded.mutable_seeds())["y"]);
  v1::BackwardCall& materialized = b.Grad({"y"}, {"u"});
  materialized.set_allow_unused(true);
  materialized.set_materialize_grads(true);
  HostTensor::Float32({1, 1, 1}, {3}).ToProto(&(*materialized.mutable_seeds())["y"]);

  absl::StatusOr<client::GradResult> r = server_.client().Grad(b.request());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->calls.size(), 2u);
  EXPECT_THAT(r->calls[0].Find("x")->value->ToDoubles(), ElementsAre(3, 30, 300));
  const client::Gradient* unused = r->calls[0].Find("u");
  ASSERT_NE(unused, nullptr);
  EXPECT_FALSE(unused->connected);
  EXPECT_FALSE(unused->value.has_value());
  const client::Gradient* zero = r->calls[1].Find("u");
  ASSERT_NE(zero, nullptr);
  EXPECT_FALSE(zero->connected);
  ASSERT_TRUE(zero->value.has_value());
  EXPECT_THAT(zero->value->ToDoubles(), ElementsAre(0));
}

// Values written as numbers (the hand-written JSON form) work like raw bytes.
TEST_F(GradServerTest, TensorValuesFormIsAccepted) {
  v1::GradRequest request = SquareRequest();
  v1::Tensor* x = request.mutable_graph()->mutable_leaves(0)->mutable_value();
  x->clear_data();
  for (double v : {1.0, 2.0, 3.0}) x->mutable_values()->add_doubles(v);
  absl::StatusOr<client::GradResult> r = server_.client().Grad(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->calls[0].gradients[0].value->ToDoubles(), ElementsAre(2, 4, 6));
}

// A request larger than one message (4 MiB here) is streamed by the client on its own, and so
// is its equally large response.
TEST_F(GradServerTest, RequestLargerThanOneMessageIsStreamed) {
  const int n = 3 << 20;  // 12 MiB of float32
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.5f;
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(x, {n}), true)
      .Op("mul", {"x", "x"}, {"y"})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  ASSERT_GT(b.request().ByteSizeLong(), size_t{4} << 20);
  absl::StatusOr<client::GradResult> r = server_.client().Grad(b.request());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<double> g = r->calls[0].gradients[0].value->ToDoubles();
  ASSERT_EQ(g.size(), static_cast<size_t>(n));
  for (int i : {0, 1, 999, 1000, n / 2, n - 1}) EXPECT_EQ(g[i], 2.0 * x[i]) << i;

  // A small request may be streamed too.
  client::CallOptions stream;
  stream.transport = client::CallOptions::Transport::kStream;
  absl::StatusOr<client::GradResult> small = server_.client().Grad(SquareRequest(), stream);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT(small->calls[0].gradients[0].value->ToDoubles(), ElementsAre(2, 4, 6));
}

TEST_F(GradServerTest, ServerInfoPingAndHealth) {
  absl::StatusOr<v1::ServerInfo> info = server_.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(info->limits().max_message_bytes(), 4 << 20);
  EXPECT_EQ(info->limits().max_ops(), 5000);
  ASSERT_GE(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).name(), "cpu");
  std::vector<std::string> ops;
  for (const auto& op : info->ops()) ops.push_back(op.name());
  EXPECT_THAT(ops, ::testing::IsSupersetOf({"matmul", "conv2d", "grad", "checkpoint", "hook"}));

  absl::StatusOr<std::string> echo = server_.client().Ping("hello");
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(*echo, "hello");

  absl::StatusOr<std::string> health = server_.client().CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
}

// Server reflection answers list_services (what grpcurl asks first).
TEST_F(GradServerTest, ReflectionListsServices) {
  grpc::GenericStub stub(server_.client().channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](int id) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(id));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  // ServerReflectionRequest{list_services: "*"}: field 7, length-delimited.
  const std::string request("\x3a\x01*", 3);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  ASSERT_TRUE(step(4));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string response;
  for (const grpc::Slice& s : slices)
    response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_TRUE(absl::StrContains(response, "gradserve.v1.GradService")) << response;
  EXPECT_TRUE(absl::StrContains(response, "grpc.health.v1.Health")) << response;
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace gradserve::testing
