// Note [Teardown after the reply]: a RequestRunner fills the response, and what the request made
// stays alive until the RequestRunner is destroyed: only then does the thread keep its graph (Note
// [Reusing a validated graph]), and nothing it holds needs the call's messages any more.

#include "server/run/request_runner.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/library/gradserve_client.h"
#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

using client::HostTensor;
using client::RequestBuilder;

// loss = sum(x * x) for x = [1, -2, 3], with leaf names of its own in the thread's cache.
v1::GradRequest SquareOf(const std::string& name) {
  RequestBuilder b;
  b.Leaf(name, HostTensor::Float32({1, -2, 3}, {3}), /*requires_grad=*/true)
      .Op("mul", {name, name}, {"sq"})
      .Op("sum", {"sq"}, {"loss"});
  b.Grad({"loss"}, {name});
  return b.request();
}

// Whether this thread's cache now holds request's graph (a lease takes it, and drops it).
bool ThreadKeeps(const v1::GradRequest& request) {
  return GraphLease(request.graph(), graph::Limits()).reusable() != nullptr;
}

std::shared_ptr<autograd::CancellationToken> NoDeadline() {
  return std::make_shared<autograd::CancellationToken>(absl::InfiniteFuture());
}

TEST(RequestRunnerTest, TheGraphIsKeptOnlyOnceTheRunnerIsDestroyed) {
  const v1::GradRequest request = SquareOf("teardown_x");
  v1::GradResponse response;
  auto runner = std::make_unique<RequestRunner>();
  ASSERT_TRUE(runner->Run(request, graph::Limits(), NoDeadline(), absl::Now(), &response).ok());
  ASSERT_EQ(response.calls_size(), 1);
  ASSERT_EQ(response.calls(0).gradients_size(), 1);
  const v1::Gradient& grad = response.calls(0).gradients(0);
  EXPECT_EQ(grad.name(), "teardown_x");
  EXPECT_TRUE(grad.connected());
  absl::StatusOr<HostTensor> value = HostTensor::FromProto(grad.value());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->ToDoubles(), (std::vector<double>{2, -4, 6}));
  EXPECT_FALSE(ThreadKeeps(request));  // the runner still holds it
  runner.reset();
  EXPECT_TRUE(ThreadKeeps(request));
}

TEST(RequestRunnerTest, OutlivesTheCallsMessages) {
  auto request = std::make_unique<v1::GradRequest>(SquareOf("outlive_x"));
  auto response = std::make_unique<v1::GradResponse>();
  RequestRunner runner;
  ASSERT_TRUE(
      runner.Run(*request, graph::Limits(), NoDeadline(), absl::Now(), response.get()).ok());
  // A reactor may be gone, its messages with it, before the RequestRunner is destroyed; the
  // runner's tensors own their bytes (a sanitizer build checks the frees below).
  request.reset();
  response.reset();
}

TEST(RequestRunnerTest, AFailedCallStillGivesTheGraphBack) {
  v1::GradRequest request = SquareOf("failed_x");
  request.mutable_calls(0)->set_roots(0, "no_such_value");
  v1::GradResponse response;
  {
    RequestRunner runner;
    const absl::Status status =
        runner.Run(request, graph::Limits(), NoDeadline(), absl::Now(), &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(response.num_nodes(), 2);  // recorded before the backward call failed
  }
  // The graph validated and recorded, so it is kept for the next request.
  EXPECT_TRUE(ThreadKeeps(SquareOf("failed_x")));
}

// loss = sum(relu(exp(tanh(x * w)))): three ops after the mul that a request with one plain
// call runs as one chain (Note [Elementwise chains] in engine/ops/elementwise.h).
v1::GradRequest ChainOf(const std::string& x) {
  RequestBuilder b;
  b.Leaf(x, HostTensor::Float32({0.5, -1, 2}, {3}), /*requires_grad=*/true)
      .Leaf("w", HostTensor::Float32({1.5, 0.25, -0.75}, {3}), /*requires_grad=*/true)
      .Op("mul", {x, "w"}, {"a"})
      .Op("tanh", {"a"}, {"b"})
      .Op("exp", {"b"}, {"c"})
      .Op("relu", {"c"}, {"d"})
      .Op("sum", {"d"}, {"loss"});
  b.Grad({"loss"}, {x});
  return b.request();
}

TEST(RequestRunnerTest, RequestsThatCouldTellRunTheirOpsOneByOne) {
  // Two calls: the second meets the first's released Nodes, and its error names the op's own
  // Node, as PyTorch's would, not a chain's.
  v1::GradRequest twice = ChainOf("chain_twice_x");
  *twice.add_calls() = twice.calls(0);
  v1::GradResponse response;
  {
    RequestRunner runner;
    const absl::Status status =
        runner.Run(twice, graph::Limits(), NoDeadline(), absl::Now(), &response);
    EXPECT_FALSE(status.ok());
    EXPECT_TRUE(absl::StrContains(status.message(), "ReluBackward0")) << status;
    EXPECT_EQ(response.num_nodes(), 5);
  }
  // create_graph: the gradient is recorded through the ops' own Nodes, and comes back.
  v1::GradRequest create_graph = ChainOf("chain_create_graph_x");
  create_graph.mutable_calls(0)->set_create_graph(true);
  v1::GradRequest plain = ChainOf("chain_plain_x");
  std::vector<std::vector<double>> grads;
  for (const v1::GradRequest* request : {&create_graph, &plain}) {
    v1::GradResponse r;
    RequestRunner runner;
    ASSERT_TRUE(runner.Run(*request, graph::Limits(), NoDeadline(), absl::Now(), &r).ok());
    EXPECT_EQ(r.num_nodes(), 5);
    absl::StatusOr<HostTensor> value = HostTensor::FromProto(r.calls(0).gradients(0).value());
    ASSERT_TRUE(value.ok()) << value.status();
    grads.push_back(value->ToDoubles());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace
}  // namespace gradserve::server
