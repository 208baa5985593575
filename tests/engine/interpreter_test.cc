// The graph interpreter: validation errors, recording, backward calls, determinism,
// concurrency and cancellation. The graph-level constructs are in graph_constructs_test.cc.

#include "engine/graph/interpreter.h"

#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/autograd/node.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph {
namespace {

using ::gradserve::graph::testing::BitIdentical;
using ::gradserve::graph::testing::F64;
using ::gradserve::graph::testing::GradCall;
using ::gradserve::graph::testing::GraphBuilder;
using ::gradserve::graph::testing::MessageHas;
using ::gradserve::graph::testing::MustRecord;
using ::gradserve::graph::testing::Values;

// x (requires grad) and c, both float64[3].
GraphBuilder Base() {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2, 3}), true).Leaf("c", F64({4, 5, 6}));
  return b;
}

// loss = sum(x * c): a graph that must always record and differentiate.
Graph GoodGraph() { return Base().Op("mul", {"x", "c"}, {"h"}).Op("sum", {"h"}, {"loss"}).Build(); }

void ExpectInterpreterUsable() {
  auto recorded = MustRecord(GoodGraph());
  ASSERT_NE(recorded, nullptr);
  auto result = recorded->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Values(result->grads[0]), (std::vector<double>{4, 5, 6}));
}

struct BadGraphCase {
  std::string name;
  Graph graph;
  Limits limits;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

std::shared_ptr<const Graph> Body(GraphBuilder b) { return b.BuildShared(); }

std::vector<BadGraphCase> BadGraphCases() {
  std::vector<BadGraphCase> cases;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode kExhausted = absl::StatusCode::kResourceExhausted;
  cases.push_back({"UnknownOp",
                   Base().Op("frobnicate", {"x"}, {"y"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (frobnicate -> 'y'): unknown op 'frobnicate'"}});
  cases.push_back({"DanglingReference",
                   Base().Op("mul", {"x", "x"}, {"h"}).Op("mul", {"h", "x2"}, {"y"}).Build(),
                   {},
                   kInvalid,
                   {"op #1 (mul -> 'y'): input 'x2' is not defined before use"}});
  cases.push_back({"UseBeforeDefinition",
                   Base().Op("mul", {"x", "h"}, {"y"}).Op("mul", {"x", "x"}, {"h"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (mul -> 'y'): input 'h' is not defined before use"}});
  cases.push_back({"DuplicateOutputName",
                   Base().Op("mul", {"x", "x"}, {"c"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (mul -> 'c'): the name 'c' is already defined"}});
  cases.push_back({"DuplicateLeafName",
                   Base().Leaf("x", F64({1})).Build(),
                   {},
                   kInvalid,
                   {"leaf #2 'x': the name 'x' is already defined"}});
  cases.push_back({"IntLeafRequiresGrad",
                   GraphBuilder().Leaf("i", Tensor::FromVector<int64_t>({1, 2}, {2}), true).Build(),
                   {},
                   kInvalid,
                   {"leaf #0 'i': requires_grad needs a floating dtype", "int64"}});
  cases.push_back({"DTypeMismatch",
                   Base()
                       .Leaf("f", Tensor::FromVector<float>({1, 2, 3}, {3}))
                       .Op("where", {"x", "f", "c"}, {"w"})
                       .Build(),
                   {},
                   kInvalid,
                   {"op #0 (where -> 'w'): "}});
  cases.push_back({"ShapeMismatch",
                   Base().Leaf("v", F64({1, 2, 3, 4})).Op("add", {"x", "v"}, {"s"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (add -> 's'): ", "[3]", "[4]"}});
  cases.push_back(
      {"OverflowingShape",
       Base()
           .Op("reshape", {"x"}, {"r"},
               ops::Attrs({{"shape", std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40}}}))
           .Build(),
       {},
       kInvalid,
       {"op #0 (reshape -> 'r'): attribute 'shape'", "overflows"}});
  cases.push_back(
      {"NegativeDimension",
       Base()
           .Op("reshape", {"x"}, {"r"}, ops::Attrs({{"shape", std::vector<int64_t>{-3, 1}}}))
           .Build(),
       {},
       kInvalid,
       {"op #0 (reshape -> 'r'): attribute 'shape' [-3, 1] has a negative dimension -3"}});
  cases.push_back(
      {"WrongAttributeType",
       Base().Op("sum", {"x"}, {"s"}, ops::Attrs({{"keepdim", std::string("yes")}})).Build(),
       {},
       kInvalid,
       {"op #0 (sum -> 's'): attribute 'keepdim' must be bool, got string"}});
  cases.push_back(
      {"UnknownAttributeKeyword",
       Base()
           .Op("conv2d", {"x", "c"}, {"y"}, ops::Attrs({{"padding", std::string("full")}}))
           .Build(),
       {},
       kInvalid,
       {"op #0 (conv2d -> 'y'): attribute 'padding' must be int list or one of 'valid', 'same', "
        "got "
        "'full'"}});
  cases.push_back({"WrongAttributeTypeWithKeywords",
                   Base().Op("conv2d", {"x", "c"}, {"y"}, ops::Attrs({{"padding", 1.5}})).Build(),
                   {},
                   kInvalid,
                   {"op #0 (conv2d -> 'y'): attribute 'padding' must be int list or one of "
                    "'valid', 'same', got "
                    "float"}});
  cases.push_back({"UnknownAttribute",
                   Base().Op("mul", {"x", "c"}, {"h"}, ops::Attrs({{"bogus", int64_t{1}}})).Build(),
                   {},
                   kInvalid,
                   {"op #0 (mul -> 'h'): unknown attribute 'bogus'"}});
  cases.push_back({"MissingAttribute",
                   Base().Op("reshape", {"x"}, {"r"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (reshape -> 'r'): missing required attribute 'shape'"}});
  cases.push_back({"WrongInputCount",
                   Base().Op("tanh", {"x", "c"}, {"t"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (tanh -> 't'): tanh takes 1 input(s) (input), got 2"}});
  cases.push_back({"WrongOutputCount",
                   Base().Op("mul", {"x", "c"}, {"h", "k"}).Build(),
                   {},
                   kInvalid,
                   {"op #0 (mul -> 'h'): mul produces 1 output(s)"}});
  cases.push_back(
      {"GradWrtUndefined",
       Base()
           .Op("sum", {"x"}, {"s"})
           .Op("grad", {"s"}, {"g"}, ops::Attrs({{"wrt", std::vector<std::string>{"q"}}}))
           .Build(),
       {},
       kInvalid,
       {"op #1 (grad -> 'g'): attribute 'wrt': value 'q' is not defined before use"}});
  cases.push_back(
      {"UnknownHookKind",
       Base().Op("hook", {"x"}, {}, ops::Attrs({{"kind", std::string("double")}})).Build(),
       {},
       kInvalid,
       {"op #0 (hook on 'x'): attribute 'kind': unknown hook kind 'double'"}});
  cases.push_back(
      {"HookParameterOfAnotherKind",
       Base()
           .Op("hook", {"x"}, {},
               ops::Attrs({{"kind", std::string("scale")}, {"factor", 2.0}, {"min", 1.0}}))
           .Build(),
       {},
       kInvalid,
       {"op #0 (hook on 'x'): attribute 'min' does not apply to hook kind 'scale'"}});
  {
    GraphBuilder body;
    body.Inputs({"a"})
        .Op("sum", {"a"}, {"s"})
        .Op("grad", {"s"}, {"g"}, ops::Attrs({{"wrt", std::vector<std::string>{"a"}}}));
    body.Outputs({"g"});
    GraphBuilder outer = Base();
    outer.Op("checkpoint", {"x"}, {"y"}).last().body = Body(body);
    cases.push_back({"GradInsideCheckpoint",
                     outer.Build(),
                     {},
                     kInvalid,
                     {"op #0 (checkpoint -> 'y') body: op #1 (grad -> 'g'): grad is not allowed "
                      "inside a checkpoint body"}});
  }
  {
    GraphBuilder body;
    body.Inputs({"a"}).Op("mul", {"a", "b"}, {"m"}).Outputs({"m"});
    GraphBuilder outer = Base();
    outer.Op("checkpoint", {"x"}, {"y"}).last().body = Body(body);
    cases.push_back({"BodySeesOnlyItsInputs",
                     outer.Build(),
                     {},
                     kInvalid,
                     {"op #0 (checkpoint -> 'y') body: op #0 (mul -> 'm'): input 'b' is not "
                      "defined before use"}});
  }
  {
    GraphBuilder body;
    body.Inputs({"a"}).Op("neg", {"a"}, {"m"}).Outputs({"m"});
    GraphBuilder outer = Base();
    outer.Op("checkpoint", {"x", "c"}, {"y"}).last().body = Body(body);
    cases.push_back({"CheckpointInputCount",
                     outer.Build(),
                     {},
                     kInvalid,
                     {"op #0 (checkpoint -> 'y'): the body takes 1 input(s), got 2"}});
  }

  // Limits.
  Limits few_ops;
  few_ops.max_ops = 2;
  cases.push_back(
      {"OverMaxOps",
       Base().Op("neg", {"x"}, {"a"}).Op("neg", {"a"}, {"b"}).Op("neg", {"b"}, {"d"}).Build(),
       few_ops,
       kExhausted,
       {"op #2 (neg -> 'd'): the graph has more than 2 ops", "max_ops"}});
  Limits few_leaves;
  few_leaves.max_leaves = 1;
  cases.push_back({"OverMaxLeaves",
                   GoodGraph(),
                   few_leaves,
                   kExhausted,
                   {"leaf #1 'c'", "more than 1 leaves", "max_leaves"}});
  Limits small_tensors;
  small_tensors.max_tensor_elements = 2;
  cases.push_back({"LeafOverMaxTensorElements",
                   GoodGraph(),
                   small_tensors,
                   kExhausted,
                   {"leaf #0 'x'", "3 elements", "max_tensor_elements"}});
  Limits nine = small_tensors;
  nine.max_tensor_elements = 8;
  cases.push_back({"OutputOverMaxTensorElements",
                   GraphBuilder()
                       .Leaf("a", F64({1, 2, 3}, {3, 1}))
                       .Leaf("b", F64({1, 2, 3}, {1, 3}))
                       .Op("add", {"a", "b"}, {"s"})
                       .Build(),
                   nine,
                   kExhausted,
                   {"op #0 (add -> 's'): output 's' float64[3, 3]", "max_tensor_elements"}});
  cases.push_back(
      {"ShapeAttributeOverMaxTensorElements",
       Base()
           .Op("expand", {"c"}, {"e"}, ops::Attrs({{"size", std::vector<int64_t>{4, 3}}}))
           .Build(),
       nine,
       kExhausted,
       {"op #0 (expand -> 'e'): attribute 'size' [4, 3] has 12 elements", "max_tensor_elements"}});
  Limits small_memory;
  small_memory.max_memory_bytes = 40;
  cases.push_back({"LeavesOverMaxMemory",
                   GoodGraph(),
                   small_memory,
                   kExhausted,
                   {"leaf #1 'c'", "max_memory_bytes"}});
  Limits hundred_bytes;
  hundred_bytes.max_memory_bytes = 60;
  // Leaves that require no grad: the ops record no Nodes, whose charges (Note [Nodes on the
  // budget]) would pass 60 bytes at the first op.
  cases.push_back({"ForwardOverMaxMemory",
                   GraphBuilder()
                       .Leaf("x", F64({1, 2, 3}))
                       .Leaf("c", F64({4, 5, 6}))
                       .Op("mul", {"x", "c"}, {"a"})
                       .Op("mul", {"a", "c"}, {"b"})
                       .Op("mul", {"b", "c"}, {"d"})
                       .Op("mul", {"d", "c"}, {"e"})
                       .Build(),
                   hundred_bytes,
                   kExhausted,
                   {"op #2 (mul -> 'd'): request memory limit exceeded"}});
  {
    GraphBuilder inner;
    inner.Inputs({"a"}).Op("neg", {"a"}, {"n"}).Outputs({"n"});
    GraphBuilder middle;
    middle.Inputs({"a"}).Op("checkpoint", {"a"}, {"m"}).last().body = Body(inner);
    middle.Outputs({"m"});
    GraphBuilder outer = Base();
    outer.Op("checkpoint", {"x"}, {"y"}).last().body = Body(middle);
    Limits shallow;
    shallow.max_nesting = 1;
    cases.push_back({"OverMaxNesting",
                     outer.Build(),
                     shallow,
                     kExhausted,
                     {"op #0 (checkpoint -> 'y') body: op #0 (checkpoint -> 'm'): checkpoint "
                      "bodies are nested more than 1 deep",
                      "max_nesting"}});
  }
  return cases;
}

TEST(InterpreterTest, EachBadGraphGetsItsOwnStatusAndMessage) {
  for (const BadGraphCase& c : BadGraphCases()) {
    SCOPED_TRACE(c.name);
    auto recorded = RecordedGraph::Record(c.graph, c.limits);
    ASSERT_FALSE(recorded.ok());
    EXPECT_EQ(recorded.status().code(), c.code) << recorded.status();
    for (const std::string& part : c.message_parts) {
      EXPECT_TRUE(MessageHas(recorded.status(), part));
    }
    ExpectInterpreterUsable();
  }
}

TEST(InterpreterTest, ValidateAloneRejectsWithoutRunning) {
  EXPECT_TRUE(Validate(GoodGraph(), {}).ok());
  absl::Status s = Validate(Base().Op("frobnicate", {"x"}, {"y"}).Build(), {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Shape errors surface only when the op runs.
  EXPECT_TRUE(
      Validate(Base().Leaf("v", F64({1, 2})).Op("add", {"x", "v"}, {"s"}).Build(), {}).ok());
}

// Note [Reusing a validated graph] (server/run/graph_cache.h): once Validate passed a graph, new
// leaf values need only ValidateLeafValues, whose errors are Validate's, bodies' leaves
// included; RecordValidated then records with the slots Validate gave.
TEST(InterpreterTest, LeafValuesAloneCheckedAgainAsValidateChecksThem) {
  GraphBuilder body;
  body.Inputs({"a"}).Leaf("k", F64({2, 2, 2})).Op("mul", {"a", "k"}, {"m"}).Outputs({"m"});
  GraphBuilder top = Base();
  top.Op("checkpoint", {"x"}, {"y"}).last().body = body.BuildShared();
  top.Op("mul", {"y", "c"}, {"h"}).Op("sum", {"h"}, {"loss"});
  const Graph good = top.Build();
  ASSERT_TRUE(Validate(good, {}).ok());
  EXPECT_TRUE(ValidateLeafValues(good, {}).ok());

  struct Case {
    std::string name;
    Graph graph;
    Limits limits;
  };
  std::vector<Case> cases;
  Graph no_tensor = good;
  no_tensor.leaves[1].value = Tensor();
  cases.push_back({"NoTensor", no_tensor, {}});
  Graph integer = good;
  integer.leaves[0].value = Tensor::FromVector<int64_t>({1, 2, 3}, {3});
  cases.push_back({"IntegerRequiringGrad", integer, {}});
  Limits few_elements;
  few_elements.max_tensor_elements = 2;
  cases.push_back({"TooManyElements", good, few_elements});
  Limits few_bytes;
  few_bytes.max_memory_bytes = 60;  // x and c fit (48 bytes), the body's k does not
  cases.push_back({"BodyLeafOverTheBytes", good, few_bytes});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const absl::Status full = Validate(c.graph, c.limits).status();
    ASSERT_FALSE(full.ok());
    EXPECT_EQ(ValidateLeafValues(c.graph, c.limits), full);
  }

  // Recording with the slots of a validated graph whose leaves then changed.
  auto shared = std::make_shared<Graph>(good);
  absl::StatusOr<std::unique_ptr<const ValueSlots>> validated = Validate(*shared, {});
  ASSERT_TRUE(validated.ok());
  std::shared_ptr<const ValueSlots> slots = *std::move(validated);
  shared->leaves[0].value = F64({-1, 0.5, 7});
  auto reused = RecordedGraph::RecordValidated(shared, slots, {});
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_EQ((*reused)->slots(), slots);
  auto fresh = MustRecord(*shared);
  ASSERT_NE(fresh, nullptr);
  auto a = (*reused)->Backward(GradCall("loss", {"x"}));
  auto b = fresh->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(BitIdentical(a->grads[0], b->grads[0]));
  EXPECT_EQ(Values(a->grads[0]), (std::vector<double>{8, 10, 12}));  // 2 * c
  shared->leaves[0].value = Tensor::FromVector<int64_t>({1, 2, 3}, {3});
  EXPECT_EQ(RecordedGraph::RecordValidated(shared, slots, {}).status(),
            Validate(*shared, {}).status());
}

// Note [Value slots]: slots in definition order, reads in op order, a body's slots its own.
TEST(InterpreterTest, ValidateGivesEachValueASlot) {
  GraphBuilder body;
  body.Inputs({"a", "b"}).Leaf("k", F64({2, 2, 2})).Op("mul", {"a", "k"}, {"m"});
  body.Op("add", {"m", "b"}, {"r"}).Outputs({"r"});
  GraphBuilder top = Base();
  top.Op("mul", {"x", "c"}, {"h"});
  top.Op("checkpoint", {"h", "x"}, {"y"}).last().body = body.BuildShared();
  top.Op("sum", {"y"}, {"loss"});
  top.Op("grad", {"loss"}, {"gx", "gh"},
         ops::Attrs({{"wrt", std::vector<std::string>{"x", "h"}},
                     {"grad_outputs", std::vector<std::string>{""}}}));
  const Graph graph = top.Build();
  absl::StatusOr<std::unique_ptr<const ValueSlots>> slots = Validate(graph, {});
  ASSERT_TRUE(slots.ok()) << slots.status();
  // x c h y loss gx gh
  EXPECT_EQ((*slots)->num_values, 7);
  EXPECT_EQ((*slots)->reads, (std::vector<int64_t>{0, 1, 2, 0, 3, 4, 0, 2, ValueSlots::kNoSlot}));
  EXPECT_EQ((*slots)->by_name.at("gh"), 6);
  ASSERT_EQ((*slots)->bodies.size(), 1);
  const ValueSlots& inner = *(*slots)->bodies.at(graph.ops[1].body.get());
  // a b k m r
  EXPECT_EQ(inner.num_values, 5);
  EXPECT_EQ(inner.reads, (std::vector<int64_t>{0, 2, 3, 1}));
  EXPECT_EQ(inner.results, (std::vector<int64_t>{4}));
}

// num_nodes is the number of distinct grad_fns among the graph's values: one for each op that
// records, none for detach or a no-grad op, and those a grad op's create_graph records for its
// outputs. RunOps counts them as it labels them (Note [Value slots]).
TEST(InterpreterTest, CountsTheNodesOfTheGraphsValues) {
  GraphBuilder b = Base();  // x (requires grad), c
  b.Op("mul", {"x", "x"}, {"h"}).Op("sum", {"h"}, {"loss"});
  b.Op("grad", {"loss"}, {"gx"}, ops::Attrs({{"wrt", std::vector<std::string>{"x"}}}));
  b.Op("detach", {"h"}, {"d"});
  b.Op("mul", {"x", "c"}, {"n"}).last().no_grad = true;
  b.Op("add", {"gx", "loss"}, {"s"});
  auto recorded = MustRecord(b.Build());
  ASSERT_NE(recorded, nullptr);
  absl::flat_hash_set<const autograd::Node*> nodes;
  for (const char* name : {"x", "c", "h", "loss", "gx", "d", "n", "s"}) {
    absl::StatusOr<Tensor> value = recorded->Value(name);
    ASSERT_TRUE(value.ok()) << value.status();
    if (value->grad_fn() != nullptr) nodes.insert(value->grad_fn().get());
  }
  EXPECT_EQ(nodes.size(), 4u);  // h, loss, gx (create_graph), s
  EXPECT_EQ(recorded->num_nodes(), static_cast<int64_t>(nodes.size()));
}

TEST(InterpreterTest, RecordsNamedAndLabelledValues) {
  auto recorded = MustRecord(GoodGraph());
  ASSERT_NE(recorded, nullptr);
  absl::StatusOr<Tensor> h = recorded->Value("h");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->name(), "h");
  ASSERT_NE(h->grad_fn(), nullptr);
  EXPECT_EQ(h->grad_fn()->label(), "op #0 'h' = mul");
  EXPECT_EQ(Values(*recorded->Value("loss")), (std::vector<double>{32}));
  EXPECT_EQ(recorded->num_nodes(), 2);
  EXPECT_EQ(recorded->Value("nope").status().code(), absl::StatusCode::kNotFound);
  // The caller's leaf tensors are not touched.
  Graph graph = GoodGraph();
  auto again = MustRecord(graph);
  EXPECT_FALSE(graph.leaves[0].value.requires_grad());
  EXPECT_TRUE(graph.leaves[0].value.name().empty());
}

// A graph whose gradients involve matmul, broadcasting and reductions: loss = sum(tanh(W x + b)^2).
Graph MlpGraph() {
  std::vector<float> w(64 * 32), x(32), b(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>((i * 7919) % 101) - 0.5f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 13) - 0.6f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * static_cast<float>(i % 5);
  return GraphBuilder()
      .Leaf("W", Tensor::FromVector<float>(w, {64, 32}), true)
      .Leaf("x", Tensor::FromVector<float>(x, {32}), true)
      .Leaf("b", Tensor::FromVector<float>(b, {64}), true)
      .Op("matmul", {"W", "x"}, {"wx"})
      .Op("add", {"wx", "b"}, {"z"})
      .Op("tanh", {"z"}, {"h"})
      .Op("mul", {"h", "h"}, {"h2"})
      .Op("sum", {"h2"}, {"loss"})
      .Build();
}

TEST(InterpreterTest, SameRequestTwiceGivesBitIdenticalGradients) {
  std::vector<TensorList> runs;
  for (int run = 0; run < 2; ++run) {
    auto recorded = MustRecord(MlpGraph());
    ASSERT_NE(recorded, nullptr);
    auto result = recorded->Backward(GradCall("loss", {"W", "x", "b"}));
    ASSERT_TRUE(result.ok()) << result.status();
    runs.push_back(result->grads);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(BitIdentical(runs[0][i], runs[1][i])) << "input " << i;
  }
}

TEST(InterpreterTest, GradSemanticsUnusedInputs) {
  Graph graph = Base()
                    .Leaf("u", F64({7}), true)
                    .Op("mul", {"x", "x"}, {"h"})
                    .Op("sum", {"h"}, {"loss"})
                    .Build();
  auto recorded = MustRecord(graph);
  ASSERT_NE(recorded, nullptr);

  BackwardCall call = GradCall("loss", {"x", "u"}, /*retain_graph=*/true);
  auto strict = recorded->Backward(call);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument) << strict.status();

  call.allow_unused = true;
  auto unused = recorded->Backward(call);
  ASSERT_TRUE(unused.ok()) << unused.status();
  EXPECT_EQ(unused->names, (std::vector<std::string>{"x", "u"}));
  EXPECT_EQ(Values(unused->grads[0]), (std::vector<double>{2, 4, 6}));
  EXPECT_FALSE(unused->grads[1].defined());
  EXPECT_EQ(unused->connected, (std::vector<bool>{true, false}));

  call.allow_unused = false;
  call.materialize_grads = true;
  auto materialized = recorded->Backward(call);
  ASSERT_TRUE(materialized.ok()) << materialized.status();
  EXPECT_EQ(Values(materialized->grads[1]), (std::vector<double>{0}));
  EXPECT_EQ(materialized->connected, (std::vector<bool>{true, false}));
}

TEST(InterpreterTest, BackwardSemanticsAccumulatesIntoLeaves) {
  Graph graph = Base()
                    .Leaf("u", F64({7}), true)
                    .Op("mul", {"x", "x"}, {"h"})
                    .Op("sum", {"h"}, {"loss"})
                    .Build();
  auto recorded = MustRecord(graph);
  ASSERT_NE(recorded, nullptr);
  BackwardCall call;
  call.roots = {"loss"};
  call.accumulate_grad = true;
  call.retain_graph = true;
  auto first = recorded->Backward(call);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->names, (std::vector<std::string>{"x", "u"}));  // every leaf requiring grad
  EXPECT_EQ(Values(first->grads[0]), (std::vector<double>{2, 4, 6}));
  EXPECT_FALSE(first->grads[1].defined());
  EXPECT_EQ(first->connected, (std::vector<bool>{true, false}));

  call.materialize_grads = true;
  auto second = recorded->Backward(call);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Values(second->grads[0]), (std::vector<double>{4, 8, 12}));
  EXPECT_EQ(Values(second->grads[1]), (std::vector<double>{0}));

  // Note [backward() into a non-leaf]: h's .grad, as PyTorch's backward(inputs=[h]); x's is
  // left alone.
  call.materialize_grads = false;
  call.inputs = {"h"};
  auto non_leaf = recorded->Backward(call);
  ASSERT_TRUE(non_leaf.ok()) << non_leaf.status();
  EXPECT_EQ(Values(non_leaf->grads[0]), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(non_leaf->connected, (std::vector<bool>{true}));
  call.inputs = {"x", "h"};
  auto both = recorded->Backward(call);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(Values(both->grads[0]), (std::vector<double>{6, 12, 18}));
  EXPECT_EQ(Values(both->grads[1]), (std::vector<double>{2, 2, 2}));
  // h retains its gradient from then on, in calls that do not name it too.
  call.inputs = {"x"};
  ASSERT_TRUE(recorded->Backward(call).ok());
  call.inputs = {"h"};
  auto later = recorded->Backward(call);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(Values(later->grads[0]), (std::vector<double>{4, 4, 4}));
}

TEST(InterpreterTest, BadCallsNameTheValue) {
  auto recorded = MustRecord(GoodGraph());
  ASSERT_NE(recorded, nullptr);
  struct Case {
    BackwardCall call;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({GradCall("nope", {"x"}), "root 'nope' is not a value of the graph"});
  cases.push_back({GradCall("c", {"x"}), "root 'c' does not require grad"});
  cases.push_back({GradCall("h", {"x"}), "root 'h' has shape [3]"});
  cases.push_back({GradCall("loss", {"c"}), "input 'c' does not require grad"});
  BackwardCall bad_seed = GradCall("loss", {"x"});
  bad_seed.seeds = {F64({1, 2})};
  cases.push_back({bad_seed, "the seed of root 'loss' has shape [2] but the root has shape []"});
  BackwardCall no_roots;
  cases.push_back({no_roots, "at least one root"});
  for (const Case& c : cases) {
    auto result = recorded->Backward(c.call);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
    EXPECT_TRUE(MessageHas(result.status(), c.message));
  }
  // None of them harmed the graph.
  auto result = recorded->Backward(GradCall("loss", {"x"}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Values(result->grads[0]), (std::vector<double>{4, 5, 6}));
}

TEST(InterpreterTest, CallsInOrderWithRetainGraphThenReleased) {
  auto recorded = MustRecord(MlpGraph());
  ASSERT_NE(recorded, nullptr);
  auto reference = recorded->Backward(GradCall("loss", {"W", "x"}, /*retain_graph=*/true));
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int i = 0; i < 3; ++i) {
    auto again = recorded->Backward(GradCall("loss", {"W", "x"}, /*retain_graph=*/true));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(BitIdentical(again->grads[0], reference->grads[0]));
    EXPECT_TRUE(BitIdentical(again->grads[1], reference->grads[1]));
  }
  auto last = recorded->Backward(GradCall("loss", {"W", "x"}, /*retain_graph=*/false));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(BitIdentical(last->grads[0], reference->grads[0]));
  auto freed = recorded->Backward(GradCall("loss", {"W", "x"}));
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kFailedPrecondition) << freed.status();
}

// Note [Fewer atomics per Node]: a graph whose caller promises one call at a time runs its
// Nodes without their locks, to the same bits.
TEST(InterpreterTest, AGraphOfOneCallAtATimeGivesTheSameGradients) {
  auto shared = MustRecord(MlpGraph());
  auto promised = MustRecord(MlpGraph());
  ASSERT_NE(shared, nullptr);
  ASSERT_NE(promised, nullptr);
  promised->PromiseOneCallAtATime();
  for (const bool retain : {true, true, false}) {
    auto expected = shared->Backward(GradCall("loss", {"W", "x"}, retain));
    auto got = promised->Backward(GradCall("loss", {"W", "x"}, retain));
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(BitIdentical(got->grads[0], expected->grads[0]));
    EXPECT_TRUE(BitIdentical(got->grads[1], expected->grads[1]));
  }
  auto freed = promised->Backward(GradCall("loss", {"W", "x"}));
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kFailedPrecondition) << freed.status();
}

TEST(InterpreterTest, ConcurrentRetainedCallsMatchSequential) {
  constexpr int kRows = 8;
  std::vector<double> w(kRows * kRows);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<double>(i));
  auto recorded = MustRecord(GraphBuilder()
                                 .Leaf("W", F64(w, {kRows, kRows}))
                                 .Leaf("x", F64({1, -1, 2, -2, 0.5, -0.5, 0.25, 3}), true)
                                 .Op("matmul", {"W", "x"}, {"wx"})
                                 .Op("tanh", {"wx"}, {"y"})
                                 .Op("mul", {"y", "x"}, {"z"})
                                 .Build());
  ASSERT_NE(recorded, nullptr);
  // Row i of the Jacobian dz/dx: the gradient of z seeded with the i-th unit vector.
  auto row_call = [](int i) {
    BackwardCall call = GradCall("z", {"x"}, /*retain_graph=*/true);
    std::vector<double> seed(kRows, 0.0);
    seed[i] = 1;
    call.seeds = {F64(seed)};
    return call;
  };
  std::vector<Tensor> sequential(kRows);
  for (int i = 0; i < kRows; ++i) {
    auto result = recorded->Backward(row_call(i));
    ASSERT_TRUE(result.ok()) << result.status();
    sequential[i] = result->grads[0];
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<absl::StatusOr<CallResult>> results(kRows);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRows; ++i) {
      threads.emplace_back([&, i] { results[i] = recorded->Backward(row_call(i)); });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kRows; ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      EXPECT_TRUE(BitIdentical(results[i]->grads[0], sequential[i])) << "row " << i;
    }
  }
}

TEST(InterpreterTest, CancelledBeforeAnOpStops) {
  auto token = std::make_shared<autograd::CancellationToken>();
  token->Cancel(absl::CancelledError("client cancelled"));
  auto recorded = RecordedGraph::Record(GoodGraph(), {}, token);
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(MessageHas(recorded.status(), "stopped before op #0 (mul -> 'h'): client cancelled"));
  ExpectInterpreterUsable();
}

TEST(InterpreterTest, DeadlinePassingDuringTheForwardStopsBetweenOps) {
  GraphBuilder b;
  b.Leaf("v0", Tensor::Full({256}, 0.5, DType::kFloat64), true);
  constexpr int kOps = 20000;
  for (int i = 0; i < kOps; ++i) {
    b.Op("tanh", {absl::StrCat("v", i)}, {absl::StrCat("v", i + 1)});
  }
  auto token = std::make_shared<autograd::CancellationToken>(absl::Now() + absl::Milliseconds(5));
  auto recorded = RecordedGraph::Record(b.Build(), {}, token);
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kDeadlineExceeded) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(), "stopped before op #"));
  ExpectInterpreterUsable();
}

TEST(InterpreterTest, CancelledTokenStopsBackward) {
  auto token = std::make_shared<autograd::CancellationToken>();
  auto recorded = RecordedGraph::Record(GoodGraph(), {}, token);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  token->Cancel(absl::CancelledError("client cancelled"));
  auto result = (*recorded)->Backward(GradCall("loss", {"x"}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
}

TEST(InterpreterTest, AnomalyModeNamesTheNode) {
  auto recorded = MustRecord(GraphBuilder()
                                 .Leaf("x", F64({0, 1}), true)
                                 .Leaf("zero", F64({0, 0}))
                                 .Op("sqrt", {"x"}, {"r"})
                                 .Op("mul", {"r", "zero"}, {"m"})
                                 .Op("sum", {"m"}, {"loss"})
                                 .Build());
  ASSERT_NE(recorded, nullptr);
  BackwardCall call = GradCall("loss", {"x"});
  call.anomaly_mode = true;
  auto result = recorded->Backward(call);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_TRUE(MessageHas(result.status(), "op #0 'r' = sqrt"));
}

}  // namespace
}  // namespace gradserve::graph
