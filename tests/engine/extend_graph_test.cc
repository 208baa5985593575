// RecordedGraph::Extend (Note [Extending a recorded graph]): ops appended to a recorded graph
// read its values by name and record into the same autograd graph; bad extensions leave the
// graph as it was, but for a failed one that wrote in place, which spoils it.

#include <memory>
#include <vector>

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

// x [3] requires grad; h = x * x.
std::unique_ptr<RecordedGraph> Squares() {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2, 3}), true).Op("mul", {"x", "x"}, {"h"});
  return MustRecord(b.Build());
}

TEST(ExtendGraphTest, ExtensionsRecordIntoTheSameGraph) {
  std::unique_ptr<RecordedGraph> g = Squares();
  ASSERT_NE(g, nullptr);
  const int64_t nodes = g->num_nodes();
  // loss = sum(h * w), w a new leaf that requires grad.
  GraphBuilder e1;
  e1.Leaf("w", F64({1, -1, 2}), true).Op("mul", {"h", "w"}, {"hw"}).Op("sum", {"hw"}, {"loss"});
  absl::StatusOr<int64_t> added = g->Extend(e1.BuildShared(), nullptr);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 2);
  EXPECT_EQ(g->num_nodes(), nodes + 2);
  // A second extension reads the first's value and the recorded one.
  GraphBuilder e2;
  e2.Op("sum", {"h"}, {"hs"}).Op("add", {"loss", "hs"}, {"total"});
  ASSERT_TRUE(g->Extend(e2.BuildShared(), nullptr).ok());
  EXPECT_EQ(Values(*g->Value("total")), (std::vector<double>{(1 - 4 + 18) + 14}));

  absl::StatusOr<CallResult> grads = g->Backward(GradCall("total", {"x", "w"}, true));
  ASSERT_TRUE(grads.ok()) << grads.status();
  // d total / dx = 2x(w + 1); d total / dw = x^2.
  EXPECT_EQ(Values(grads->grads[0]), (std::vector<double>{4, 0, 18}));
  EXPECT_EQ(Values(grads->grads[1]), (std::vector<double>{1, 4, 9}));
  // backward() with no inputs: every leaf that requires grad, the extension's too.
  BackwardCall all;
  all.roots = {"total"};
  all.accumulate_grad = true;
  absl::StatusOr<CallResult> accumulated = g->Backward(all);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  EXPECT_EQ(accumulated->names, (std::vector<std::string>{"x", "w"}));
}

TEST(ExtendGraphTest, ACheckpointInAnExtension) {
  std::unique_ptr<RecordedGraph> g = Squares();
  ASSERT_NE(g, nullptr);
  GraphBuilder body;
  body.Inputs({"a"}).Leaf("k", F64({3}), true).Op("mul", {"a", "k"}, {"m"}).Outputs({"m"});
  GraphBuilder e;
  e.Op("checkpoint", {"h"}, {"c"}).last().body = body.BuildShared();
  e.Op("sum", {"c"}, {"loss"});
  ASSERT_TRUE(g->Extend(e.BuildShared(), nullptr).ok());
  absl::StatusOr<CallResult> grads = g->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(Values(grads->grads[0]), (std::vector<double>{6, 12, 18}));  // 3 * 2x
}

// An extension whose nested checkpoints ran and which then failed leaves no body behind;
// the same extension without the failing op then runs.
TEST(ExtendGraphTest, AFailedExtensionsCheckpointsAreForgotten) {
  std::unique_ptr<RecordedGraph> g = Squares();
  ASSERT_NE(g, nullptr);
  auto extension = [](bool fail) {
    GraphBuilder inner;
    inner.Inputs({"b"}).Leaf("k", F64({3}), true).Op("mul", {"b", "k"}, {"m"}).Outputs({"m"});
    GraphBuilder outer;
    outer.Inputs({"a"}).Op("checkpoint", {"a"}, {"o"}).last().body = inner.BuildShared();
    outer.Outputs({"o"});
    GraphBuilder e;
    e.Leaf("z", F64({1, 2})).Op("checkpoint", {"h"}, {"c"}).last().body = outer.BuildShared();
    e.Op("sum", {"c"}, {"loss"});
    if (fail) e.Op("add", {"c", "z"}, {"cz"});
    return e.BuildShared();
  };
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(g->Extend(extension(true), nullptr).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(g->Extend(extension(false), nullptr).ok());
  absl::StatusOr<CallResult> grads = g->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(Values(grads->grads[0]), (std::vector<double>{6, 12, 18}));
}

TEST(ExtendGraphTest, BadExtensionsLeaveTheGraphAsItWas) {
  std::unique_ptr<RecordedGraph> g = Squares();
  ASSERT_NE(g, nullptr);
  GraphBuilder unknown;
  unknown.Op("exp", {"nope"}, {"e"});
  absl::StatusOr<int64_t> s = g->Extend(unknown.BuildShared(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(s.status(), "input 'nope' is not defined before use"));
  GraphBuilder repeated;
  repeated.Op("exp", {"h"}, {"x"});
  s = g->Extend(repeated.BuildShared(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(s.status(), "the name 'x' is already defined"));
  // Fails while running, after its first op ran.
  GraphBuilder fails;
  fails.Leaf("z", F64({1, 2})).Op("exp", {"h"}, {"e"}).Op("add", {"e", "z"}, {"ez"});
  s = g->Extend(fails.BuildShared(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(g->Value("e").status().code(), absl::StatusCode::kNotFound);
  // The same names are free, and the graph works.
  GraphBuilder good;
  good.Leaf("z", F64({1, 1, 1})).Op("exp", {"z"}, {"e"}).Op("mul", {"h", "e"}, {"he"});
  good.Op("sum", {"he"}, {"loss"});
  ASSERT_TRUE(g->Extend(good.BuildShared(), nullptr).ok());
  absl::StatusOr<CallResult> grads = g->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_NEAR(Values(grads->grads[0])[0], 2 * 1 * 2.718281828459045, 1e-12);
}

TEST(ExtendGraphTest, LimitsCountTheGraphWithItsExtensions) {
  Limits limits;
  limits.max_ops = 3;
  GraphBuilder b;
  b.Leaf("x", F64({1, 2, 3}), true).Op("mul", {"x", "x"}, {"h"}).Op("sum", {"h"}, {"s"});
  absl::StatusOr<std::unique_ptr<RecordedGraph>> g = RecordedGraph::Record(b.Build(), limits);
  ASSERT_TRUE(g.ok()) << g.status();
  GraphBuilder one;
  one.Op("exp", {"s"}, {"e"});
  ASSERT_TRUE((*g)->Extend(one.BuildShared(), nullptr).ok());
  GraphBuilder more;
  more.Op("exp", {"e"}, {"e2"});
  absl::StatusOr<int64_t> s = (*g)->Extend(more.BuildShared(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(MessageHas(s.status(), "max_ops"));
}

TEST(ExtendGraphTest, AFailedExtensionThatWroteInPlaceSpoilsTheGraph) {
  std::unique_ptr<RecordedGraph> g = Squares();
  ASSERT_NE(g, nullptr);
  // h.add_(1), then an op that fails: h stays written.
  GraphBuilder e;
  ops::Attrs one;
  one.set("other", 1.0);
  e.Leaf("z", F64({1, 2})).Op("add_", {"h"}, {}, one).Op("add", {"h", "z"}, {"hz"});
  absl::StatusOr<int64_t> s = g->Extend(e.BuildShared(), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  absl::StatusOr<CallResult> grads = g->Backward(GradCall("h", {"x"}));
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageHas(grads.status(), "wrote a value in place and then failed"));
  GraphBuilder next;
  next.Op("sum", {"h"}, {"s"});
  EXPECT_EQ(g->Extend(next.BuildShared(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gradserve::graph
