// The limits of one request as the graph interpreter enforces them on work that used to escape
// them (issue 24): deadlines and cancels stop one long op (Note [Stopping a running op]), and a
// tensor over max_tensor_elements is refused before the op allocates or computes it (Note
// [Tensors over max_tensor_elements]), and the kernels' working buffers and the Nodes of nested
// backwards are charged to the request's memory budget (Note [Working buffers], Note [Nodes on
// the budget]).
//
// These tests use only the interpreter's interface, so they also build against the engine as it
// was before those changes, where each of them fails. Their time bounds are generous: a noisy
// machine of two cores runs them beside other tests; docs/benchmarks.md has the figures.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/autograd/node.h"
#include "engine/graph/interpreter.h"
#include "engine/ops/attributes.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph {
namespace {

using ::gradserve::graph::testing::F64;
using ::gradserve::graph::testing::GradCall;
using ::gradserve::graph::testing::GraphBuilder;
using ::gradserve::graph::testing::MessageHas;

// How long after the deadline (or the cancel) a stopped op may still hold its thread, in these
// tests. The goal is 100 ms (DESIGN.md section 8); the slack is for a loaded machine.
constexpr absl::Duration kStopBound = absl::Milliseconds(1500);

// An [n, n] matrix of one value; made outside any request, so it is charged to no budget.
Tensor Square(int64_t n, double value, DType dtype) { return Tensor::Full({n, n}, value, dtype); }

// a @ b as a one-op graph, leaves a and b.
Graph MatmulGraph(Tensor a, Tensor b, bool requires_grad = false) {
  return GraphBuilder()
      .Leaf("a", std::move(a), requires_grad)
      .Leaf("b", std::move(b))
      .Op("matmul", {"a", "b"}, {"m"})
      .Build();
}

// Records graph under a token whose deadline is `after` from now; expects DEADLINE_EXCEEDED
// naming the op within kStopBound of the deadline.
void ExpectStopsAtTheDeadline(const Graph& graph, absl::Duration after, const std::string& op) {
  const absl::Time deadline = absl::Now() + after;
  auto token = std::make_shared<autograd::CancellationToken>(deadline);
  auto recorded = RecordedGraph::Record(graph, {}, token);
  const absl::Duration late = absl::Now() - deadline;
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kDeadlineExceeded) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(), op));
  EXPECT_LT(late, kStopBound) << "the op ran on " << late << " past its deadline";
}

TEST(RequestLimitsTest, DeadlineStopsOneFloatMatmulInsideTheOp) {
  // 6144^3 multiply-adds: several seconds of sgemm on two cores.
  ExpectStopsAtTheDeadline(
      MatmulGraph(Square(6144, 0.5, DType::kFloat32), Square(6144, 0.25, DType::kFloat32)),
      absl::Milliseconds(200), "op #0 (matmul -> 'm')");
}

TEST(RequestLimitsTest, DeadlineStopsOneInt64MatmulInsideTheOp) {
  // 1536^3 multiply-adds in the int64 product's own loop: seconds.
  ExpectStopsAtTheDeadline(
      MatmulGraph(Square(1536, 3, DType::kInt64), Square(1536, 2, DType::kInt64)),
      absl::Milliseconds(200), "op #0 (matmul -> 'm')");
}

TEST(RequestLimitsTest, DeadlineStopsOneConv2dInsideTheOp) {
  // [2, 64, 192, 192] by [64, 64, 7, 7], padding 3: 2 * 64 * 3136 * 36864 multiply-adds.
  GraphBuilder b;
  b.Leaf("x", Tensor::Full({2, 64, 192, 192}, 0.5, DType::kFloat32))
      .Leaf("w", Tensor::Full({64, 64, 7, 7}, 0.01, DType::kFloat32))
      .Op("conv2d", {"x", "w"}, {"y"}, ops::Attrs({{"padding", int64_t{3}}}));
  ExpectStopsAtTheDeadline(b.Build(), absl::Milliseconds(100), "op #0 (conv2d -> 'y')");
}

TEST(RequestLimitsTest, CancelFromAnotherThreadStopsOneMatmul) {
  const Graph graph =
      MatmulGraph(Square(6144, 0.5, DType::kFloat32), Square(6144, 0.25, DType::kFloat32));
  auto token = std::make_shared<autograd::CancellationToken>();
  absl::Time cancelled_at;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancelled_at = absl::Now();
    token->Cancel(absl::CancelledError("the client cancelled the call"));
  });
  auto recorded = RecordedGraph::Record(graph, {}, token);
  const absl::Time stopped_at = absl::Now();
  canceller.join();
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kCancelled) << recorded.status();
  // Cancelled inside the op, not before it.
  EXPECT_TRUE(
      MessageHas(recorded.status(), "op #0 (matmul -> 'm'): the client cancelled the call"));
  EXPECT_LT(stopped_at - cancelled_at, kStopBound);
}

TEST(RequestLimitsTest, CancelDuringTheBackwardStopsTheMatmulNode) {
  auto token = std::make_shared<autograd::CancellationToken>();
  auto recorded = RecordedGraph::Record(GraphBuilder()
                                            .Leaf("a", Square(3072, 0.5, DType::kFloat64), true)
                                            .Leaf("b", Square(3072, 0.25, DType::kFloat64), true)
                                            .Op("matmul", {"a", "b"}, {"m"})
                                            .Op("sum", {"m"}, {"loss"})
                                            .Build(),
                                        {}, token);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  absl::Time cancelled_at;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    cancelled_at = absl::Now();
    token->Cancel(absl::CancelledError("the client cancelled the call"));
  });
  auto result = (*recorded)->Backward(GradCall("loss", {"a", "b"}));
  const absl::Time stopped_at = absl::Now();
  canceller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_LT(stopped_at - cancelled_at, kStopBound);
}

TEST(RequestLimitsTest, OutputOverMaxTensorElementsIsRefusedBeforeTheWork) {
  // The product [16384, 1024] @ [1024, 16384] has 2^28 elements (1 GiB of float32) and costs
  // 2^38 multiply-adds; the limit refuses it before either.
  Limits limits;
  limits.max_tensor_elements = int64_t{1} << 26;
  const Graph graph = MatmulGraph(Tensor::Full({16384, 1024}, 0.5, DType::kFloat32),
                                  Tensor::Full({1024, 16384}, 0.5, DType::kFloat32));
  const absl::Time start = absl::Now();
  auto recorded = RecordedGraph::Record(graph, limits);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kResourceExhausted) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(),
                         "op #0 (matmul -> 'm'): output 'm' float32[16384, "
                         "16384] on cpu has 268435456 elements, over the "
                         "limit of 67108864 (max_tensor_elements)"));
  EXPECT_LT(took, absl::Milliseconds(500)) << "the product was computed before it was refused";
}

TEST(RequestLimitsTest, Conv2dWorkingBufferIsChargedBeforeItIsAllocated) {
  // A 4 MiB input, a 4 MiB output, and an im2col buffer of 16 * 16 * 16 * 256 * 256 floats:
  // 1 GiB, under a budget of 16 MiB.
  Limits limits;
  limits.max_memory_bytes = int64_t{16} << 20;
  GraphBuilder b;
  b.Leaf("x", Tensor::Full({1, 16, 256, 256}, 0.5, DType::kFloat32))
      .Leaf("w", Tensor::Full({16, 16, 16, 16}, 0.01, DType::kFloat32))
      .Op("conv2d", {"x", "w"}, {"y"}, ops::Attrs({{"padding", std::string("same")}}));
  const absl::Time start = absl::Now();
  auto recorded = RecordedGraph::Record(b.Build(), limits);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kResourceExhausted) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(), "op #0 (conv2d -> 'y')"));
  EXPECT_TRUE(MessageHas(recorded.status(), "request memory limit exceeded"));
  EXPECT_LT(took, absl::Milliseconds(500)) << "the convolution ran before it was refused";
}

// Note [Nodes on the budget]: each level of in-graph grad with create_graph records the
// backward of the level below, a graph several times its size, of one-element tensors whose
// bytes are nothing but whose Nodes are hundreds of bytes each.
Graph NestedGrads(int levels) {
  GraphBuilder b;
  b.Leaf("x", F64({0.5}), true).Op("sin", {"x"}, {"g0"}).Op("mul", {"g0", "x"}, {"g0x"});
  std::string last = "g0x";
  for (int i = 1; i <= levels; ++i) {
    const std::string g = absl::StrCat("g", i);
    b.Op("grad", {last}, {g}, ops::Attrs({{"wrt", std::vector<std::string>{"x"}}}));
    b.Op("mul", {g, "x"}, {absl::StrCat(g, "x")});
    last = absl::StrCat(g, "x");
  }
  return b.Build();
}

TEST(RequestLimitsTest, NestedGradLevelsAreChargedToTheBudget) {
  Limits limits;
  limits.max_memory_bytes = int64_t{16} << 20;
  ASSERT_TRUE(RecordedGraph::Record(NestedGrads(3), limits).ok());
  auto recorded = RecordedGraph::Record(NestedGrads(13), limits);
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kResourceExhausted) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(), "(grad -> 'g"));
  EXPECT_TRUE(MessageHas(recorded.status(), "request memory limit exceeded"));
}

// Note [Values freed after their last use]: x (4 MiB) scaled eight times, then summed. Held to
// the end, the eight products (4 MiB each, none saved by its Node) pass a 16 MiB budget; each
// dropped once the next link has read it, no more than two are alive at once.
Graph ScaledChain() {
  GraphBuilder b;
  b.Leaf("x", Tensor::Full({1 << 20}, 0.5, DType::kFloat32), true);
  std::string last = "x";
  for (int i = 0; i < 8; ++i) {
    const std::string y = absl::StrCat("y", i);
    b.Op("mul", {last}, {y}, ops::Attrs({{"other", 2.0}}));
    last = y;
  }
  b.Op("sum", {last}, {"loss"});
  return b.Build();
}

// x ([n] float32 of varied values) * scale, summed; x requires grad.
Graph ScaledSumGraph(int64_t n, double scale, DType dtype = DType::kFloat32) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = 0.001 * static_cast<double>((i * 7919) % 2003 - 1001);
  return GraphBuilder()
      .Leaf("x", Tensor::FromVector<double>(values, {n}).To(dtype), true)
      .Op("mul", {"x"}, {"y"}, ops::Attrs({{"other", scale}}))
      .Op("sum", {"y"}, {"loss"})
      .Build();
}

// The bits of a float32 0-d tensor or of each element of a float32 tensor.
std::vector<uint32_t> Bits(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint32_t> bits(static_cast<size_t>(c.numel()));
  std::memcpy(bits.data(), c.raw_data(), bits.size() * 4);
  return bits;
}

TEST(ScaledSumTest, AScaledSumRunsInOnePassWithTheSameBitsAndNodes) {
  // Note [A scaled sum in one pass]: 1.5M elements (6 MiB, over the 1 MiB the dropper needs,
  // cut into chunks and lanes), at scales whose products round and at 1.
  const std::vector<absl::string_view> keep = {"loss", "x"};
  for (double scale : {1.0, 3.0, -0.1, 1e-30}) {
    const int64_t n = 1500001;
    Limits limits;
    auto fused = RecordedGraph::Record(std::make_shared<const Graph>(ScaledSumGraph(n, scale)),
                                       limits, nullptr, &keep);
    auto plain = RecordedGraph::Record(ScaledSumGraph(n, scale), limits);  // keeps every value
    ASSERT_TRUE(fused.ok() && plain.ok()) << fused.status() << plain.status();
    EXPECT_FALSE((*fused)->Value("y")->defined()) << "the product was stored";
    EXPECT_TRUE((*plain)->Value("y")->defined());
    // x was made outside the request: its budget sees the product alone.
    EXPECT_LT((*fused)->budget()->peak(), int64_t{1} << 20) << "the product was allocated";
    EXPECT_GE((*plain)->budget()->peak(), n * 4);
    const Tensor loss = *(*fused)->Value("loss");
    EXPECT_EQ(Bits(loss), Bits(*(*plain)->Value("loss"))) << scale;
    EXPECT_EQ(loss.name(), "loss");
    // The same Nodes, with the same labels, and the same gradient.
    const std::shared_ptr<autograd::Node> sum_fn = loss.grad_fn();
    const std::shared_ptr<autograd::Node> plain_sum_fn = (*plain)->Value("loss")->grad_fn();
    ASSERT_NE(sum_fn, nullptr);
    EXPECT_EQ(sum_fn->name(), "SumBackward0");
    EXPECT_EQ(sum_fn->label(), plain_sum_fn->label());
    const std::shared_ptr<autograd::Node> mul_fn = sum_fn->next_edges()[0].function;
    ASSERT_NE(mul_fn, nullptr);
    EXPECT_EQ(mul_fn->name(), "MulBackward0");
    EXPECT_EQ(mul_fn->label(), plain_sum_fn->next_edges()[0].function->label());
    EXPECT_EQ((*fused)->num_nodes(), (*plain)->num_nodes());
    absl::StatusOr<CallResult> g = (*fused)->Backward(GradCall("loss", {"x"}));
    absl::StatusOr<CallResult> want = (*plain)->Backward(GradCall("loss", {"x"}));
    ASSERT_TRUE(g.ok() && want.ok()) << g.status() << want.status();
    EXPECT_EQ(Bits(g->grads[0]), Bits(want->grads[0])) << scale;
  }
}

TEST(ScaledSumTest, AProductSomethingElseNeedsIsStored) {
  // Returned (kept), read twice, float64, or too small to drop: the two ops run as two.
  const int64_t n = 1 << 19;  // 2 MiB of float32
  const std::vector<absl::string_view> keep_y = {"loss", "x", "y"};
  auto kept = RecordedGraph::Record(std::make_shared<const Graph>(ScaledSumGraph(n, 2)), Limits(),
                                    nullptr, &keep_y);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE((*kept)->Value("y")->defined());

  const std::vector<absl::string_view> keep = {"loss", "x", "twice"};
  Graph read_twice = ScaledSumGraph(n, 2);
  read_twice.ops.push_back(read_twice.ops[0]);  // twice = mul(y, 2): y read again after the sum
  read_twice.ops.back().inputs = {"y"};
  read_twice.ops.back().outputs = {"twice"};
  auto twice =
      RecordedGraph::Record(std::make_shared<const Graph>(read_twice), Limits(), nullptr, &keep);
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_TRUE((*twice)->Value("twice")->defined());
  EXPECT_GE((*twice)->budget()->peak(), int64_t{4} << 20) << "y and twice at once";

  for (const Graph& other : {ScaledSumGraph(n, 2, DType::kFloat64), ScaledSumGraph(1000, 2)}) {
    const std::vector<absl::string_view> keep_loss = {"loss", "x"};
    auto g =
        RecordedGraph::Record(std::make_shared<const Graph>(other), Limits(), nullptr, &keep_loss);
    ASSERT_TRUE(g.ok()) << g.status();
    const int64_t x_bytes = static_cast<int64_t>((*g)->Value("x")->nbytes());
    EXPECT_GE((*g)->budget()->peak(), x_bytes) << "the product was not stored";
  }
}

TEST(RequestLimitsTest, ValuesNoLaterOpReadsAreFreedWithinTheBudget) {
  Limits limits;
  limits.max_memory_bytes = int64_t{16} << 20;
  auto held = RecordedGraph::Record(ScaledChain(), limits);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kResourceExhausted) << held.status();
  EXPECT_TRUE(MessageHas(held.status(), "request memory limit exceeded"));

  const std::vector<absl::string_view> keep = {"loss", "x", "y5"};
  auto recorded =
      RecordedGraph::Record(std::make_shared<const Graph>(ScaledChain()), limits, nullptr, &keep);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  RecordedGraph& g = **recorded;
  EXPECT_LE(g.budget()->peak(), int64_t{13} << 20) << "more than x and two products at once";
  EXPECT_TRUE(g.Value("y5")->defined()) << "a kept value was dropped";
  EXPECT_TRUE(g.Value("x")->defined());
  EXPECT_FALSE(g.Value("y3")->defined()) << "a value no later op reads was kept";
  EXPECT_FALSE(g.Value("y7")->defined());
  // The gradient is the same: every Node kept what it needed.
  absl::StatusOr<CallResult> result = g.Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(result.ok()) << result.status();
  // One value expanded (Note [A gradient of one value]): packed to read it.
  const Tensor grad = result->grads[0].contiguous();
  EXPECT_EQ(grad.numel(), 1 << 20);
  EXPECT_EQ(grad.data<float>()[0], 256.0f);
  EXPECT_EQ(grad.data<float>()[(1 << 20) - 1], 256.0f);
  // A call that names a dropped value is refused, not run on nothing.
  absl::StatusOr<CallResult> dropped = g.Backward(GradCall("y7", {"x"}));
  EXPECT_EQ(dropped.status().code(), absl::StatusCode::kInvalidArgument) << dropped.status();
}

TEST(RequestLimitsTest, AGraphThatWritesInPlaceKeepsEveryValue) {
  // Note [Cycles through in-place writes]: its destructor walks every value's history.
  GraphBuilder b;
  b.Leaf("x", F64({1, 2, 3}), true)
      .Op("mul", {"x"}, {"y"}, ops::Attrs({{"other", 2.0}}))
      .Op("mul", {"y"}, {"z"}, ops::Attrs({{"other", 3.0}}))
      .Op("add_", {"z", "y"}, {"w"})
      .Op("sum", {"w"}, {"loss"});
  const std::vector<absl::string_view> keep = {"loss", "x"};
  auto recorded = RecordedGraph::Record(b.BuildShared(), Limits(), nullptr, &keep);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_TRUE((*recorded)->Value("y")->defined());
  EXPECT_TRUE((*recorded)->Value("z")->defined());
}

}  // namespace
}  // namespace gradserve::graph
