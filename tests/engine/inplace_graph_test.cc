// In-place ops in graphs (Note [Graph values], Note [In-place ops], Note [Leaves written in
// place]): how names refer to written tensors, what they cost, and where they are refused.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/autograd/node.h"
#include "engine/graph/interpreter.h"
#include "engine/tensor/memory_budget.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph {
namespace {

using ::gradserve::graph::testing::F64;
using ::gradserve::graph::testing::GradCall;
using ::gradserve::graph::testing::GraphBuilder;
using ::gradserve::graph::testing::MessageHas;
using ::gradserve::graph::testing::MustRecord;
using ::gradserve::graph::testing::Values;

ops::Attrs Scalar(const std::string& name, double value) {
  ops::Attrs attrs;
  attrs.set(name, value);
  return attrs;
}

std::vector<double> GradOf(RecordedGraph& graph, const std::string& root,
                           const std::string& input) {
  auto result = graph.Backward(GradCall(root, {input}, /*retain_graph=*/true));
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? Values(result->grads[0]) : std::vector<double>();
}

void ExpectNear(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-12) << i;
}

TEST(InPlaceGraphTest, ANameRefersToTheWrittenTensor) {
  // h = x * 2; h.add_(1); y = h.mul_(w); loss = h.sum(): d loss / dx = 2w.
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true).Leaf("w", F64({3, -1}), true);
  b.Op("mul", {"x"}, {"h"}, Scalar("other", 2));
  b.Op("add_", {"h"}, {}, Scalar("other", 1));
  b.Op("mul_", {"h", "w"}, {"y"});
  b.Op("sum", {"h"}, {"loss"});
  auto graph = MustRecord(b.Build());
  ASSERT_NE(graph, nullptr);
  EXPECT_TRUE(graph->Value("h")->is_same(*graph->Value("y")));
  ExpectNear(Values(*graph->Value("h")), {9, -5});
  ExpectNear(GradOf(*graph, "loss", "x"), {6, -2});
  ExpectNear(GradOf(*graph, "loss", "w"), {3, 5});
  // The value h names now is the output of mul_, and its gradient flows from the root.
  ExpectNear(GradOf(*graph, "loss", "h"), {1, 1});
}

TEST(InPlaceGraphTest, TheClientsLeavesAreNeverWritten) {
  const Tensor data = F64({1, -2});
  GraphBuilder b;
  b.Leaf("x", data).Op("relu_", {"x"}, {});
  Graph graph = b.Build();
  auto first = MustRecord(graph);
  auto second = MustRecord(graph);
  ASSERT_NE(second, nullptr);
  ExpectNear(Values(*second->Value("x")), {1, 0});
  ExpectNear(Values(data), {1, -2});
}

TEST(InPlaceGraphTest, LeafThatRequiresGradIsRefusedOutsideNoGrad) {
  GraphBuilder b;
  b.Leaf("w", F64({1, 2}), true).Op("add_", {"w"}, {}, Scalar("other", 1));
  auto refused = RecordedGraph::Record(b.Build(), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(refused.status(), "a leaf Variable that requires grad"));
  EXPECT_TRUE(MessageHas(refused.status(), "add_"));

  b.last().no_grad = true;  // an optimizer's step
  b.Op("mul", {"w", "w"}, {"sq"}).Op("sum", {"sq"}, {"loss"});
  auto graph = MustRecord(b.Build());
  ASSERT_NE(graph, nullptr);
  ExpectNear(GradOf(*graph, "loss", "w"), {4, 6});
}

// PyTorch's test_no_grad_modifies_version: z = (x * y).sum(); with no_grad: x *= 2; then
// z.backward() fails, since mul saved x.
TEST(InPlaceGraphTest, NoGradWriteOfALeafAfterUseFailsTheBackward) {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true).Leaf("y", F64({3, 4}), true);
  b.Op("mul", {"x", "y"}, {"p"}).Op("sum", {"p"}, {"z"});
  b.Op("mul_", {"x"}, {}, Scalar("other", 2)).last().no_grad = true;
  auto graph = MustRecord(b.Build());
  ASSERT_NE(graph, nullptr);
  auto result = graph->Backward(GradCall("z", {"x", "y"}));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageHas(result.status(), "'x'"));
  EXPECT_TRUE(MessageHas(result.status(), "MulBackward0"));
}

// PyTorch's test_requires_grad_inplace: a += b makes a constant a require grad.
TEST(InPlaceGraphTest, AConstantWrittenWithAGradValueTakesItsHistory) {
  GraphBuilder b;
  b.Leaf("a", F64({1, 2})).Leaf("b", F64({3, 4}), true);
  b.Op("add_", {"a", "b"}, {}).Op("mul", {"a", "a"}, {"sq"}).Op("sum", {"sq"}, {"loss"});
  auto graph = MustRecord(b.Build());
  ASSERT_NE(graph, nullptr);
  EXPECT_TRUE(graph->Value("a")->requires_grad());
  ExpectNear(GradOf(*graph, "loss", "b"), {8, 12});
}

TEST(InPlaceGraphTest, WritingASavedValueFailsTheBackward) {
  GraphBuilder b;
  b.Leaf("x", F64({0.5, 1}), true);
  b.Op("mul", {"x"}, {"h"}, Scalar("other", 1));
  b.Op("exp", {"h"}, {"e"});  // saves its result e
  b.Op("mul_", {"e"}, {}, Scalar("other", 2));
  b.Op("sigmoid", {"h"}, {"s"});
  b.Op("mul", {"s", "s"}, {"p"});  // saves s
  b.Op("add_", {"s"}, {}, Scalar("other", 1));
  b.Op("sum", {"e"}, {"loss"});
  b.Op("sum", {"p"}, {"loss2"});
  auto graph = MustRecord(b.Build());
  ASSERT_NE(graph, nullptr);
  auto result = graph->Backward(GradCall("loss", {"x"}, true));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageHas(result.status(), "modified by an inplace operation"));
  EXPECT_TRUE(MessageHas(result.status(), "ExpBackward0"));
  EXPECT_TRUE(MessageHas(result.status(), "is at version 1; expected version 0"));
  auto second = graph->Backward(GradCall("loss2", {"x"}, true));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageHas(second.status(), "'s'"));
}

// Note [In-place ops]: a chain of in-place ops writes one tensor; its out-of-place form keeps
// every intermediate. Measured through the request's memory budget.
int64_t PeakBytes(int chain_length, bool in_place) {
  constexpr int64_t kSize = 1 << 16;  // 512 KiB of float64
  GraphBuilder b;
  b.Leaf("x", Tensor::Full({kSize}, 0.5, DType::kFloat64), true);
  b.Op("mul", {"x"}, {"h0"}, Scalar("other", 2));
  std::string h = "h0";
  for (int i = 1; i <= chain_length; ++i) {
    const std::string op = i % 2 == 0 ? "mul" : "add";
    if (in_place) {
      b.Op(op + "_", {"h0"}, {}, Scalar("other", 1.5));
    } else {
      const std::string next = absl::StrCat("h", i);
      b.Op(op, {h}, {next}, Scalar("other", 1.5));
      h = next;
    }
  }
  b.Op("tanh", {h}, {"t"}).Op("sum", {"t"}, {"loss"});
  auto graph = MustRecord(b.Build());
  if (graph == nullptr) return -1;
  return graph->budget()->peak();
}

TEST(InPlaceGraphTest, InPlaceOpsAllocateNoOutput) {
  constexpr int64_t kTensorBytes = (1 << 16) * 8;
  const int64_t two = PeakBytes(2, true);
  const int64_t eight = PeakBytes(8, true);
  // Six more in-place ops: six more Nodes, no tensor.
  EXPECT_LT(eight - two, kTensorBytes / 8);
  // The out-of-place chain keeps each of its eight intermediates.
  const int64_t out_of_place = PeakBytes(8, false);
  EXPECT_GT(out_of_place - eight, 6 * kTensorBytes);
  EXPECT_LT(eight, out_of_place);
}

// Writes through views (Note [Views written in place]) and index_put_ (Note [Indexed writes])
// allocate no tensor either: a CopySlices Node keeps the view's geometry, not its elements.
int64_t ViewWritesPeakBytes(int writes) {
  constexpr int64_t kSize = 1 << 15;
  GraphBuilder b;
  b.Leaf("x", Tensor::Full({2, kSize}, 0.5, DType::kFloat64), true);
  b.Leaf("y", Tensor::Full({kSize}, 0.25, DType::kFloat64), true);
  b.Leaf("rows", Tensor::FromVector<int64_t>({1}, {1}), false);
  b.Op("mul", {"x"}, {"h"}, Scalar("other", 2));
  for (int i = 0; i < writes; ++i) {
    const std::string row = absl::StrCat("r", i);
    ops::Attrs select;
    select.set("dim", int64_t{0});
    select.set("index", int64_t{i % 2});
    b.Op("select", {"h"}, {row}, select);
    if (i % 3 == 0) {
      b.Op("copy_", {row, "y"}, {});  // h[i % 2] = y
    } else if (i % 3 == 1) {
      b.Op("mul_", {row, "y"}, {});
    } else {
      b.Op("index_put_", {"h", "y", "rows"}, {});  // h[[1]] = y
    }
  }
  b.Op("tanh", {"h"}, {"t"}).Op("sum", {"t"}, {"loss"});
  auto graph = MustRecord(b.Build());
  if (graph == nullptr) return -1;
  EXPECT_EQ(graph->Value("h")->grad_fn()->name(), "CopySlices");
  return graph->budget()->peak();
}

TEST(InPlaceGraphTest, WritesThroughViewsAllocateNoOutput) {
  constexpr int64_t kTensorBytes = (1 << 15) * 8;  // one row
  const int64_t two = ViewWritesPeakBytes(2);
  const int64_t eight = ViewWritesPeakBytes(8);
  ASSERT_GT(two, 0);
  // mul_ saves a copy of the row it writes (its backward reads the old values) as PyTorch's
  // does; the rest saves nothing. Two of six more writes are mul_: under three rows.
  EXPECT_LT(eight - two, 3 * kTensorBytes);
}

TEST(InPlaceGraphTest, InPlaceChainGivesTheOutOfPlaceGradients) {
  auto build = [](bool in_place) {
    GraphBuilder b;
    b.Leaf("x", F64({0.3, -0.8, 1.7}), true).Leaf("w", F64({0.9, 1.1, -0.4}), true);
    b.Op("mul", {"x", "w"}, {"h"});
    if (in_place) {
      b.Op("add_", {"h", "x"}, {}).Op("mul_", {"h", "w"}, {}).Op("tanh_", {"h"}, {"out"});
    } else {
      b.Op("add", {"h", "x"}, {"a"}).Op("mul", {"a", "w"}, {"m"}).Op("tanh", {"m"}, {"out"});
    }
    return b.Op("sum", {"out"}, {"loss"}).Build();
  };
  auto in_place = MustRecord(build(true));
  auto out_of_place = MustRecord(build(false));
  ASSERT_NE(in_place, nullptr);
  ASSERT_NE(out_of_place, nullptr);
  for (const char* input : {"x", "w"}) {
    ExpectNear(GradOf(*in_place, "loss", input), GradOf(*out_of_place, "loss", input));
  }
}

TEST(InPlaceGraphTest, InsideACheckpointBody) {
  // body(a) = (a * w).add_(1).relu_(): the body writes only what it computes. (relu_ then
  // add_ would fail the backward, in PyTorch too: relu_ saved its result.)
  GraphBuilder body;
  body.Inputs({"a"}).Leaf("w", F64({2, -3}), true);
  body.Op("mul", {"a", "w"}, {"m"}).Op("add_", {"m"}, {}, Scalar("other", 1));
  body.Op("relu_", {"m"}, {});
  body.Outputs({"m"});
  GraphBuilder top;
  top.Leaf("x", F64({1.5, -0.5}), true).Op("checkpoint", {"x"}, {"y"}).last().body =
      body.BuildShared();
  top.Op("mul", {"y", "y"}, {"sq"}).Op("sum", {"sq"}, {"loss"});
  auto graph = MustRecord(top.Build());
  ASSERT_NE(graph, nullptr);
  // y = [4, 2.5]; d loss / dx = 2y * w where relu passes: [16, -15].
  ExpectNear(Values(*graph->Value("y")), {4, 2.5});
  ExpectNear(GradOf(*graph, "loss", "x"), {16, -15});

  // A view of what the body computes is written as anywhere; PyTorch's values for
  // body(a) = (a * w) with [0:1] += 1, then tanh: y = [tanh(4), 1.5], dy/dx = [2 (1 - y0^2),
  // -3]; loss = sum(y * y).
  GraphBuilder view_body;
  view_body.Inputs({"a"}).Leaf("w", F64({2, -3}), true);
  ops::Attrs head;
  head.set("dim", int64_t{0});
  head.set("start", int64_t{0});
  head.set("length", int64_t{1});
  view_body.Op("mul", {"a", "w"}, {"m"}).Op("narrow", {"m"}, {"m0"}, head);
  view_body.Op("add_", {"m0"}, {}, Scalar("other", 1)).Op("tanh_", {"m0"}, {});
  view_body.Outputs({"m"});
  GraphBuilder with_view;
  with_view.Leaf("x", F64({1.5, -0.5}), true).Op("checkpoint", {"x"}, {"y"}).last().body =
      view_body.BuildShared();
  with_view.Op("mul", {"y", "y"}, {"sq"}).Op("sum", {"sq"}, {"loss"});
  auto view_graph = MustRecord(with_view.Build());
  ASSERT_NE(view_graph, nullptr);
  const double t = std::tanh(4.0);
  ExpectNear(Values(*view_graph->Value("y")), {t, 1.5});
  ExpectNear(GradOf(*view_graph, "loss", "x"), {2 * t * (1 - t * t) * 2, 2 * 1.5 * -3});
  // ...but a view, or a detached alias, of the body's input shows the caller's elements.
  for (const char* alias : {"narrow", "detach"}) {
    GraphBuilder body_alias;
    body_alias.Inputs({"a"}).Op(alias, {"a"}, {"v"},
                                alias == std::string("narrow") ? head : ops::Attrs());
    body_alias.Op("relu_", {"v"}, {}).Outputs({"v"});
    GraphBuilder top_alias;
    top_alias.Leaf("x", F64({1, -1}), true).Op("checkpoint", {"x"}, {"y"}).last().body =
        body_alias.BuildShared();
    auto alias_status = RecordedGraph::Record(top_alias.Build(), {});
    ASSERT_FALSE(alias_status.ok()) << alias;
    EXPECT_EQ(alias_status.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageHas(alias_status.status(), "body's input or leaf")) << alias_status.status();
  }

  GraphBuilder writes_input;
  writes_input.Inputs({"a"}).Op("relu_", {"a"}, {}).Outputs({"a"});
  GraphBuilder refused;
  refused.Leaf("x", F64({1}), true).Op("checkpoint", {"x"}, {"y"}).last().body =
      writes_input.BuildShared();
  auto status = RecordedGraph::Record(refused.Build(), {});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(status.status(), "in-place op inside a checkpoint body"));
}

// Note [Cycles through in-place writes]: p = s * s saves s; s.add_(p) makes s's grad_fn reach
// MulBackward0, which holds s. The request's memory must still all come back.
TEST(InPlaceGraphTest, ACycleThroughAnInPlaceWriteIsFreed) {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true);
  b.Op("mul", {"x"}, {"s"}, Scalar("other", 1));
  b.Op("mul", {"s", "s"}, {"p"}).Op("add_", {"s", "p"}, {}).Op("sum", {"s"}, {"loss"});
  // An owner, so that the budget can be read after the graph is gone; a Node or tensor left
  // alive by the cycle would still be charged to it (Note [A budget outlives its charges]).
  std::shared_ptr<MemoryBudget> budget;
  {
    auto graph = MustRecord(b.Build());
    ASSERT_NE(graph, nullptr);
    budget = graph->budget();
    auto result = graph->Backward(GradCall("loss", {"x"}, true));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  }
  EXPECT_EQ(budget->used(), 0);
}

// The same cycle, then an op that is refused: the recording fails, and its memory still all
// comes back (the request fuzzer's find, docs/fuzzing.md).
TEST(InPlaceGraphTest, ACycleLeftByARecordingThatFailsIsFreed) {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true).Leaf("y", F64({1, 2, 3}));
  b.Op("mul", {"x"}, {"s"}, Scalar("other", 1));
  b.Op("mul", {"s", "s"}, {"p"}).Op("add_", {"s", "p"}, {}).Op("mul_", {"s", "y"}, {});
  auto outer = MemoryBudget::Make();
  {
    MemoryBudgetScope scope(outer);
    auto status = RecordedGraph::Record(b.Build(), {});
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument) << status.status();
  }
  EXPECT_EQ(outer->used(), 0);
}

TEST(InPlaceGraphTest, OutputCountIsChecked) {
  GraphBuilder b;
  b.Leaf("x", F64({1})).Op("relu_", {"x"}, {"a", "b"});
  auto status = RecordedGraph::Record(b.Build(), {});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradserve::graph
