// Note [Elementwise chains] (engine/ops/elementwise.h): a run of elementwise ops that the
// interpreter records as one chain gives the values, gradients and node count of its ops, and
// the chain is used only where nothing can tell.

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/autograd/node.h"
#include "engine/graph/interpreter.h"
#include "engine/ops/attributes.h"
#include "engine/ops/elementwise.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph {
namespace {

using ::gradserve::graph::testing::GradCall;
using ::gradserve::graph::testing::GraphBuilder;
using ::gradserve::graph::testing::MessageHas;

constexpr const char* kUnary[] = {"neg", "exp", "tanh", "sigmoid", "sin", "cos", "relu"};
constexpr const char* kBinary[] = {"add", "sub", "mul"};

// A tensor of `shape` and dtype with values in [-1.5, 1.5), drawn from rng.
Tensor Random(std::mt19937& rng, std::vector<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<double> value(-1.5, 1.5);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& v : values) v = value(rng);
  return Tensor::FromVector<double>(values, shape).To(dtype);
}

// A graph of `ops` random chain ops from leaves x and w (which require grad) and c (which does
// not), each op reading the one before it, then their sum "loss". Op j's output is "v<j>".
Graph RandomChain(std::mt19937& rng, int ops, std::vector<int64_t> shape, DType dtype) {
  GraphBuilder b;
  b.Leaf("x", Random(rng, shape, dtype), true)
      .Leaf("w", Random(rng, shape, dtype), true)
      .Leaf("c", Random(rng, shape, dtype), false);
  const char* const others[] = {"x", "w", "c"};
  std::string previous = "x";
  for (int j = 0; j < ops; ++j) {
    const std::string out = absl::StrCat("v", j);
    if (rng() % 2 == 0) {
      b.Op(kUnary[rng() % std::size(kUnary)], {previous}, {out});
    } else {
      const std::string other = others[rng() % 3];
      if (rng() % 2 == 0) {
        b.Op(kBinary[rng() % 3], {previous, other}, {out});
      } else {
        b.Op(kBinary[rng() % 3], {other, previous}, {out});
      }
    }
    previous = out;
  }
  b.Op("sum", {previous}, {"loss"});
  return b.Build();
}

// The bytes of a tensor's elements, packed.
std::string Bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

const std::vector<absl::string_view> kKeep = {"loss", "x", "w"};

absl::StatusOr<std::unique_ptr<RecordedGraph>> RecordChained(const Graph& graph,
                                                             const Limits& limits = Limits()) {
  return RecordedGraph::Record(std::make_shared<const Graph>(graph), limits, nullptr, &kKeep,
                               nullptr, /*elementwise_chains=*/true);
}

// The name of the Node that the gradient of root's only input goes to.
std::string NodeUnderSum(RecordedGraph& g) {
  const std::shared_ptr<autograd::Node> sum = g.Value("loss")->grad_fn();
  if (sum == nullptr || sum->next_edges()[0].function == nullptr) return "";
  return sum->next_edges()[0].function->name();
}

TEST(ElementwiseChainTest, AChainHasTheBitsGradientsAndNodeCountOfItsOps) {
  std::mt19937 rng(20261128);
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (int trial = 0; trial < 60; ++trial) {
      const int ops = 2 + static_cast<int>(rng() % 40);
      const std::vector<int64_t> shape =
          trial % 3 == 0 ? std::vector<int64_t>{8} : std::vector<int64_t>{3, 5};
      const Graph graph = RandomChain(rng, ops, shape, dtype);
      auto chained = RecordChained(graph);
      auto plain = RecordedGraph::Record(graph, Limits());  // keeps every value
      ASSERT_TRUE(chained.ok() && plain.ok()) << chained.status() << plain.status();
      RecordedGraph& g = **chained;
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " trial ", trial, ", ", ops, " ops"));
      EXPECT_EQ(NodeUnderSum(g), "ElementwiseChainBackward");
      EXPECT_FALSE(g.Value("v0")->defined()) << "an op of the chain kept its value";
      EXPECT_EQ(Bytes(*g.Value("loss")), Bytes(*(*plain)->Value("loss")));
      EXPECT_EQ(g.Value(absl::StrCat("v", ops - 1))->name(), absl::StrCat("v", ops - 1));
      EXPECT_EQ(g.num_nodes(), (*plain)->num_nodes());
      BackwardCall call = GradCall("loss", {"x", "w"});
      call.allow_unused = true;  // w may be in no op
      absl::StatusOr<CallResult> got = g.Backward(call);
      absl::StatusOr<CallResult> want = (*plain)->Backward(call);
      ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(got->connected[i], want->connected[i]) << i;
        ASSERT_EQ(got->grads[i].defined(), want->grads[i].defined()) << i;
        if (want->grads[i].defined()) EXPECT_EQ(Bytes(got->grads[i]), Bytes(want->grads[i])) << i;
      }
    }
  }
}

TEST(ElementwiseChainTest, LeavesGetTheirGradientsWithBackwardSemantics) {
  std::mt19937 rng(7);
  const Graph graph = RandomChain(rng, 12, {4}, DType::kFloat32);
  auto chained = RecordChained(graph);
  auto plain = RecordedGraph::Record(graph, Limits());
  ASSERT_TRUE(chained.ok() && plain.ok());
  BackwardCall call = GradCall("loss", {});
  call.accumulate_grad = true;
  absl::StatusOr<CallResult> got = (*chained)->Backward(call);
  absl::StatusOr<CallResult> want = (*plain)->Backward(call);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
  ASSERT_EQ(got->names, want->names);
  for (size_t i = 0; i < want->grads.size(); ++i) {
    EXPECT_EQ(Bytes(got->grads[i]), Bytes(want->grads[i])) << got->names[i];
  }
}

TEST(ElementwiseChainTest, OpsRunOneByOneWhereAChainWouldShow) {
  std::mt19937 rng(11);
  const Graph base = RandomChain(rng, 6, {8}, DType::kFloat32);
  auto runs_plain = [](const absl::StatusOr<std::unique_ptr<RecordedGraph>>& g) {
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() && (*g)->Value("v0")->defined();
  };
  // A value a call or a return value names is kept.
  const std::vector<absl::string_view> keep_v0 = {"loss", "x", "w", "v0"};
  EXPECT_TRUE(runs_plain(RecordedGraph::Record(std::make_shared<const Graph>(base), Limits(),
                                               nullptr, &keep_v0, nullptr, true)));
  // Without the caller's promise (a session, several calls, create_graph, anomaly mode).
  EXPECT_TRUE(runs_plain(RecordedGraph::Record(std::make_shared<const Graph>(base), Limits(),
                                               nullptr, &kKeep, nullptr, false)));
  // A value read by two ops.
  Graph read_twice = base;
  read_twice.ops.push_back({"neg", {"v0"}, {"again"}, {}, false, nullptr});
  EXPECT_TRUE(runs_plain(RecordChained(read_twice)));
  // In-graph grad anywhere: a Node there may be differentiated again.
  Graph with_grad = base;
  with_grad.ops.push_back({"grad",
                           {"loss"},
                           {"dx"},
                           ops::Attrs({{"wrt", std::vector<std::string>{"x"}}}),
                           false,
                           nullptr});
  EXPECT_TRUE(runs_plain(RecordChained(with_grad)));
  // Operands that broadcast, of another dtype, or with alpha.
  Graph broadcast = base;
  broadcast.leaves[2].value = Random(rng, {1}, DType::kFloat32);
  broadcast.ops[0] = {"mul", {"x", "c"}, {"v0"}, {}, false, nullptr};
  EXPECT_TRUE(runs_plain(RecordChained(broadcast)));
  Graph mixed = base;
  mixed.leaves[2].value = Random(rng, {8}, DType::kFloat64);
  mixed.ops[0] = {"add", {"x", "c"}, {"v0"}, {}, false, nullptr};
  EXPECT_TRUE(runs_plain(RecordChained(mixed)));
  Graph alpha = base;
  alpha.ops[0] = {"add", {"x", "w"}, {"v0"}, ops::Attrs({{"alpha", 2.0}}), false, nullptr};
  EXPECT_TRUE(runs_plain(RecordChained(alpha)));
}

TEST(ElementwiseChainTest, AChainStopsWhereItsOutputsWouldNotFitOneTensor) {
  // Six ops on [8]: under max_tensor_elements = 40 a chain holds five ops' outputs at most.
  std::mt19937 rng(13);
  const Graph graph = RandomChain(rng, 6, {8}, DType::kFloat32);
  Limits small;
  small.max_tensor_elements = 40;
  auto chained = RecordChained(graph, small);
  auto plain = RecordedGraph::Record(graph, small);
  ASSERT_TRUE(chained.ok() && plain.ok()) << chained.status() << plain.status();
  EXPECT_FALSE((*chained)->Value("v3")->defined());
  EXPECT_TRUE((*chained)->Value("v4")->defined()) << "the chain's last value";
  EXPECT_EQ(NodeUnderSum(**chained),
            (*plain)->Value("loss")->grad_fn()->next_edges()[0].function->name())
      << "the sixth op runs alone";
  BackwardCall call = GradCall("loss", {"x", "w"});
  call.allow_unused = true;
  absl::StatusOr<CallResult> got = (*chained)->Backward(call);
  absl::StatusOr<CallResult> want = (*plain)->Backward(call);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(got->grads[i].defined(), want->grads[i].defined()) << i;
    if (want->grads[i].defined()) EXPECT_EQ(Bytes(got->grads[i]), Bytes(want->grads[i])) << i;
  }
}

TEST(ElementwiseChainTest, AChainDifferentiatedAgainIsAnErrorNotAWrongGradient) {
  // The caller broke its promise (create_graph after elementwise_chains).
  std::mt19937 rng(3);
  auto chained = RecordChained(RandomChain(rng, 5, {8}, DType::kFloat64));
  ASSERT_TRUE(chained.ok()) << chained.status();
  BackwardCall call = GradCall("loss", {"x"});
  call.create_graph = true;
  absl::StatusOr<CallResult> result = (*chained)->Backward(call);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_TRUE(MessageHas(result.status(), "elementwise chain"));
}

TEST(ElementwiseChainTest, AReleasedChainRefusesASecondPass) {
  std::mt19937 rng(5);
  auto chained = RecordChained(RandomChain(rng, 5, {8}, DType::kFloat32));
  ASSERT_TRUE(chained.ok()) << chained.status();
  ASSERT_TRUE((*chained)->Backward(GradCall("loss", {"x"})).ok());
  absl::StatusOr<CallResult> again = (*chained)->Backward(GradCall("loss", {"x"}));
  EXPECT_FALSE(again.ok());
  EXPECT_TRUE(MessageHas(again.status(), "ElementwiseChainBackward")) << again.status();
}

}  // namespace
}  // namespace gradserve::graph
