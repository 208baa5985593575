// The graph-level constructs of the interpreter: checkpoint, grad inside the graph, hooks,
// detach and no_grad (engine/graph/graph.h).

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/graph/interpreter.h"
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

// The gradients of root with respect to inputs under grad (or backward) semantics.
TensorList Gradients(RecordedGraph& graph, const std::string& root, std::vector<std::string> inputs,
                     bool accumulate_grad = false) {
  BackwardCall call = GradCall(root, std::move(inputs), /*retain_graph=*/true);
  call.accumulate_grad = accumulate_grad;
  auto result = graph.Backward(call);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->grads : TensorList();
}

void ExpectNear(const Tensor& actual, const std::vector<double>& expected, double tol = 1e-12) {
  const std::vector<double> values = Values(actual);
  ASSERT_EQ(values.size(), expected.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(values[i], expected[i], tol) << "element " << i;
  }
}

// --- checkpoint ---

constexpr int kDepth = 100;
const std::vector<double> kX = {0.3, -0.7, 1.1, 0.05};

std::vector<double> LevelWeights(int level) {
  std::vector<double> w;
  for (int j = 0; j < 4; ++j) w.push_back(1.2 + 0.3 * std::sin(level * 4 + j));
  return w;
}

// a_k = tanh(a_{k-1} * w_k) for k = 1..kDepth, from a_0 = x; loss = sum(a_kDepth).
Graph PlainChain() {
  GraphBuilder b;
  b.Leaf("x", F64(kX), true);
  std::string a = "x";
  for (int k = 1; k <= kDepth; ++k) {
    const std::string w = absl::StrCat("w", k), m = absl::StrCat("m", k), t = absl::StrCat("t", k);
    b.Leaf(w, F64(LevelWeights(k)), true).Op("mul", {a, w}, {m}).Op("tanh", {m}, {t});
    a = t;
  }
  return b.Op("sum", {a}, {"loss"}).Build();
}

// The same chain with level k's body checkpointed inside level k-1's: kDepth nested checkpoints.
// Each level's weight is a leaf of its body.
Graph NestedCheckpointChain() {
  std::shared_ptr<const Graph> inner;
  for (int k = kDepth; k >= 1; --k) {
    GraphBuilder body;
    body.Inputs({"a"})
        .Leaf("w", F64(LevelWeights(k)), true)
        .Op("mul", {"a", "w"}, {"m"})
        .Op("tanh", {"m"}, {"t"});
    if (inner != nullptr) {
      body.Op("checkpoint", {"t"}, {"o"}).last().body = inner;
      body.Outputs({"o"});
    } else {
      body.Outputs({"t"});
    }
    inner = body.BuildShared();
  }
  GraphBuilder top;
  top.Leaf("x", F64(kX), true).Op("checkpoint", {"x"}, {"y"}).last().body = inner;
  return top.Op("sum", {"y"}, {"loss"}).Build();
}

TEST(CheckpointTest, Nested100DeepMatchesThePlainGraph) {
  auto plain = MustRecord(PlainChain());
  auto nested = MustRecord(NestedCheckpointChain());
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(Values(*plain->Value("loss")), Values(*nested->Value("loss")));
  const Tensor expected = Gradients(*plain, "loss", {"x"})[0];
  EXPECT_EQ(Values(Gradients(*nested, "loss", {"x"})[0]), Values(expected));
  EXPECT_EQ(Values(Gradients(*nested, "loss", {"x"}, /*accumulate_grad=*/true)[0]),
            Values(expected));
}

TEST(CheckpointTest, ReleasedAfterABackwardWithoutRetainGraph) {
  auto nested = MustRecord(NestedCheckpointChain());
  ASSERT_NE(nested, nullptr);
  ASSERT_TRUE(nested->Backward(GradCall("loss", {"x"}, /*retain_graph=*/false)).ok());
  auto again = nested->Backward(GradCall("loss", {"x"}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
}

TEST(CheckpointTest, BodyErrorsNameTheBodyOp) {
  GraphBuilder body;
  body.Inputs({"a"}).Leaf("v", F64({1, 2})).Op("add", {"a", "v"}, {"s"}).Outputs({"s"});
  GraphBuilder top;
  top.Leaf("x", F64(kX), true).Op("checkpoint", {"x"}, {"y"}).last().body = body.BuildShared();
  auto recorded = RecordedGraph::Record(top.Build(), {});
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      MessageHas(recorded.status(), "op #0 (checkpoint -> 'y') body: op #0 (add -> 's'): "));
}

// --- grad inside the graph ---

// x^T A x: its gradient (A + A^T) x comes from an in-graph grad with create_graph, and the
// gradient of <g, v> with respect to x is the Hessian-vector product (A + A^T) v.
TEST(GradOpTest, HessianVectorProductOfAQuadraticForm) {
  const std::vector<double> a = {2, -1, 0.5, 3, 1, -2, 0.25, 4, -3};
  const std::vector<double> x = {0.5, -1.5, 2}, v = {1, 0.5, -2};
  auto recorded =
      MustRecord(GraphBuilder()
                     .Leaf("A", F64(a, {3, 3}))
                     .Leaf("x", F64(x), true)
                     .Leaf("v", F64(v))
                     .Op("matmul", {"A", "x"}, {"Ax"})
                     .Op("mul", {"x", "Ax"}, {"q"})
                     .Op("sum", {"q"}, {"f"})
                     .Op("grad", {"f"}, {"g"}, ops::Attrs({{"wrt", std::vector<std::string>{"x"}}}))
                     .Op("mul", {"g", "v"}, {"gv"})
                     .Op("sum", {"gv"}, {"s"})
                     .Build());
  ASSERT_NE(recorded, nullptr);
  auto sym_times = [&](const std::vector<double>& u) {
    std::vector<double> out(3, 0.0);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) out[i] += (a[i * 3 + j] + a[j * 3 + i]) * u[j];
    }
    return out;
  };
  ExpectNear(*recorded->Value("g"), sym_times(x));
  ExpectNear(Gradients(*recorded, "s", {"x"})[0], sym_times(v));
}

// The norm of a gradient, differentiated again: n = |d/dx sum(sin(w * x))| = |w cos(w x)|.
// dn/dx_i = g_i * (-w_i^2 sin(w_i x_i)) / n and dn/dw_i = g_i * (cos(w_i x_i) - w_i x_i
// sin(w_i x_i)) / n, with g_i = w_i cos(w_i x_i).
struct PenaltyExpectation {
  std::vector<double> dx, dw;
};
PenaltyExpectation ExpectedPenaltyGradients(const std::vector<double>& x,
                                            const std::vector<double>& w) {
  double n2 = 0;
  for (size_t i = 0; i < x.size(); ++i) n2 += std::pow(w[i] * std::cos(w[i] * x[i]), 2);
  const double n = std::sqrt(n2);
  PenaltyExpectation e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double g = w[i] * std::cos(w[i] * x[i]);
    e.dx.push_back(g * -w[i] * w[i] * std::sin(w[i] * x[i]) / n);
    e.dw.push_back(g * (std::cos(w[i] * x[i]) - w[i] * x[i] * std::sin(w[i] * x[i])) / n);
  }
  return e;
}

// The penalty graph, with sin(w * x) computed directly or inside a checkpoint.
Graph PenaltyGraph(const std::vector<double>& x, const std::vector<double>& w, bool checkpointed) {
  GraphBuilder b;
  b.Leaf("x", F64(x), true).Leaf("w", F64(w), true);
  if (checkpointed) {
    GraphBuilder body;
    body.Inputs({"a", "b"}).Op("mul", {"b", "a"}, {"m"}).Op("sin", {"m"}, {"s"}).Outputs({"s"});
    b.Op("checkpoint", {"x", "w"}, {"s"}).last().body = body.BuildShared();
  } else {
    b.Op("mul", {"w", "x"}, {"m"}).Op("sin", {"m"}, {"s"});
  }
  return b.Op("sum", {"s"}, {"f"})
      .Op("grad", {"f"}, {"g"}, ops::Attrs({{"wrt", std::vector<std::string>{"x"}}}))
      .Op("mul", {"g", "g"}, {"g2"})
      .Op("sum", {"g2"}, {"n2"})
      .Op("sqrt", {"n2"}, {"penalty"})
      .Build();
}

TEST(GradOpTest, GradientPenaltyMatchesTheHandDerivedValue) {
  const std::vector<double> x = {0.3, -1.2, 2.0}, w = {1.5, 0.7, -0.4};
  const PenaltyExpectation expected = ExpectedPenaltyGradients(x, w);
  for (bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed" : "plain");
    auto recorded = MustRecord(PenaltyGraph(x, w, checkpointed));
    ASSERT_NE(recorded, nullptr);
    TensorList grads = Gradients(*recorded, "penalty", {"x", "w"});
    ASSERT_EQ(grads.size(), 2u);
    ExpectNear(grads[0], expected.dx);
    ExpectNear(grads[1], expected.dw);
  }
}

TEST(GradOpTest, UnreachedGradientIsUsableOnlyWhenMaterialized) {
  auto graph_with = [](const char* flag) {
    return GraphBuilder()
        .Leaf("x", F64({1, 2}), true)
        .Leaf("u", F64({3, 4}), true)
        .Op("sum", {"x"}, {"f"})
        .Op("grad", {"f"}, {"gx", "gu"},
            ops::Attrs({{"wrt", std::vector<std::string>{"x", "u"}}, {flag, true}}))
        .Op("mul", {"gu", "x"}, {"p"})
        .Build();
  };
  auto unused = RecordedGraph::Record(graph_with("allow_unused"), {});
  EXPECT_EQ(unused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(unused.status(), "op #2 (mul -> 'p'): input 'gu' has no value"));
  auto materialized = MustRecord(graph_with("materialize_grads"));
  ASSERT_NE(materialized, nullptr);
  EXPECT_EQ(Values(*materialized->Value("p")), (std::vector<double>{0, 0}));
}

// --- hooks ---

TEST(HookTest, ScaleOnAValue) {
  auto recorded = MustRecord(
      GraphBuilder()
          .Leaf("x", F64({1, 2, 3}), true)
          .Op("mul", {"x", "x"}, {"h"})
          .Op("hook", {"h"}, {}, ops::Attrs({{"kind", std::string("scale")}, {"factor", 3.0}}))
          .Op("sum", {"h"}, {"loss"})
          .Build());
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ(Values(Gradients(*recorded, "loss", {"x"})[0]), (std::vector<double>{6, 12, 18}));
}

TEST(HookTest, OnALeafBeforeItsFirstUse) {
  auto recorded = MustRecord(
      GraphBuilder()
          .Leaf("x", F64({1, 2, 3}), true)
          .Leaf("c", F64({4, 5, 6}))
          .Op("hook", {"x"}, {}, ops::Attrs({{"kind", std::string("scale")}, {"factor", -1}}))
          .Op("mul", {"x", "c"}, {"h"})
          .Op("sum", {"h"}, {"loss"})
          .Build());
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ(Values(Gradients(*recorded, "loss", {"x"})[0]), (std::vector<double>{-4, -5, -6}));
  EXPECT_EQ(Values(Gradients(*recorded, "loss", {"x"}, /*accumulate_grad=*/true)[0]),
            (std::vector<double>{-4, -5, -6}));
}

// h = 10 x; loss = sum(h * c): the gradient reaching h is c, which the hook changes.
Graph HookedScaledGraph(ops::Attrs hook) {
  return GraphBuilder()
      .Leaf("x", F64({1, 2, 3}), true)
      .Leaf("ten", F64({10, 10, 10}))
      .Leaf("c", F64({5, -5, 0.5}))
      .Op("mul", {"x", "ten"}, {"h"})
      .Op("hook", {"h"}, {}, std::move(hook))
      .Op("mul", {"h", "c"}, {"m"})
      .Op("sum", {"m"}, {"loss"})
      .Build();
}

TEST(HookTest, ClampAndZero) {
  auto clamped = MustRecord(
      HookedScaledGraph(ops::Attrs({{"kind", std::string("clamp")}, {"min", -1.0}, {"max", 1.0}})));
  ASSERT_NE(clamped, nullptr);
  EXPECT_EQ(Values(Gradients(*clamped, "loss", {"x"})[0]), (std::vector<double>{10, -10, 5}));
  auto zeroed = MustRecord(HookedScaledGraph(ops::Attrs({{"kind", std::string("zero")}})));
  ASSERT_NE(zeroed, nullptr);
  EXPECT_EQ(Values(Gradients(*zeroed, "loss", {"x"})[0]), (std::vector<double>{0, 0, 0}));
}

TEST(HookTest, NanToNum) {
  // d/dx sum(sqrt(x) * c) = c / (2 sqrt(x)): [0/0, 1/4, 1/0] = [NaN, 0.25, inf].
  auto recorded = MustRecord(
      GraphBuilder()
          .Leaf("x", F64({0, 4, 0}), true)
          .Leaf("c", F64({0, 1, 1}))
          .Op("hook", {"x"}, {},
              ops::Attrs({{"kind", std::string("nan_to_num")}, {"nan", -1.0}, {"posinf", 9.0}}))
          .Op("sqrt", {"x"}, {"r"})
          .Op("mul", {"r", "c"}, {"m"})
          .Op("sum", {"m"}, {"loss"})
          .Build());
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ(Values(Gradients(*recorded, "loss", {"x"})[0]), (std::vector<double>{-1, 0.25, 9}));
}

// --- detach and no_grad ---

TEST(DetachTest, DetachAndNoGradCutTheGraph) {
  // z = y * x with y = x * x cut from the graph: dz/dx = y = x^2, not 3 x^2.
  for (bool use_no_grad : {false, true}) {
    SCOPED_TRACE(use_no_grad ? "no_grad" : "detach");
    GraphBuilder b;
    b.Leaf("x", F64({1, 2, 3}), true);
    if (use_no_grad) {
      b.Op("mul", {"x", "x"}, {"y"}).last().no_grad = true;
    } else {
      b.Op("mul", {"x", "x"}, {"y0"}).Op("detach", {"y0"}, {"y"});
    }
    auto recorded = MustRecord(b.Op("mul", {"y", "x"}, {"z"}).Op("sum", {"z"}, {"loss"}).Build());
    ASSERT_NE(recorded, nullptr);
    EXPECT_FALSE(recorded->Value("y")->requires_grad());
    EXPECT_EQ(Values(Gradients(*recorded, "loss", {"x"})[0]), (std::vector<double>{1, 4, 9}));
    auto cut = recorded->Backward(GradCall("y", {"x"}));
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageHas(cut.status(), "root 'y' does not require grad"));
  }
}

}  // namespace
}  // namespace gradserve::graph
