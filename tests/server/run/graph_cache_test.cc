// Note [Reusing a validated graph]: SameStructure compares everything of a wire graph that
// Validate's verdict depends on, and nothing else; a GraphLease reuses a kept graph only when
// SameStructure holds under the same limits, and a reused graph gives the results and errors a
// new one gives.

#include "server/run/graph_cache.h"

#include <functional>
#include <string>
#include <vector>

#include "client/library/gradserve_client.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "server/wire/wire.h"

namespace gradserve::server {
namespace {

using client::FloatAttr;
using client::HostTensor;
using client::RequestBuilder;

// loss = sum(relu(tanh(x * w) + x * 0.5)) over leaves named with prefix, so that each test has
// graphs of its own in the thread's cache.
v1::GradRequest Request(const std::string& prefix, HostTensor x, HostTensor w) {
  const std::string xn = prefix + "x", wn = prefix + "w";
  RequestBuilder b;
  b.Leaf(xn, x, /*requires_grad=*/true)
      .Leaf(wn, w)
      .Op("mul", {xn, wn}, {"a"})
      .Op("tanh", {"a"}, {"b"})
      .Op("mul", {xn}, {"c"}, {{"other", FloatAttr(0.5)}})
      .Op("add", {"b", "c"}, {"d"})
      .Op("relu", {"d"}, {"e"})
      .Op("sum", {"e"}, {"loss"});
  b.Grad({"loss"}, {xn});
  return b.request();
}

v1::GradRequest Request(const std::string& prefix, float scale = 1) {
  return Request(prefix, HostTensor::Float32({1 * scale, -2 * scale, 3 * scale}, {3}),
                 HostTensor::Float32({0.5f, 0.25f, -1}, {3}));
}

// What one request gives: its status and, on success, the gradient's values.
struct Outcome {
  absl::Status status;
  std::vector<double> grad;
  bool reused = false;
};

// Runs request as request_runner does, under limits, with op_records as its parse gave them.
Outcome RunLeased(const v1::GradRequest& request, const graph::Limits& limits = {},
                  bool enabled = true, const std::string* op_records = nullptr) {
  Outcome out;
  GraphLease lease(request.graph(), limits, enabled, op_records);
  out.reused = lease.reusable() != nullptr;
  if (out.reused) {
    // Kept graphs hold no client data.
    for (const graph::Leaf& leaf : lease.reusable()->leaves) EXPECT_FALSE(leaf.value.defined());
  }
  absl::StatusOr<EngineRequest> converted = FromProto(request, limits, nullptr, lease.reusable());
  if (!converted.ok()) {
    out.status = converted.status();
    return out;
  }
  auto recorded = lease.Record(converted->graph, nullptr);
  if (!recorded.ok()) {
    out.status = recorded.status();
    return out;
  }
  absl::StatusOr<graph::CallResult> result = (*recorded)->Backward(converted->calls[0]);
  out.status = result.status();
  if (result.ok()) {
    const Tensor grad = result->grads[0].To(DType::kFloat64).contiguous();
    out.grad.assign(grad.data<double>(), grad.data<double>() + grad.numel());
  }
  return out;
}

// The same request on a thread whose cache cannot hold it: what a new graph gives.
Outcome Fresh(const v1::GradRequest& request, const graph::Limits& limits = {}) {
  return RunLeased(request, limits, /*enabled=*/false);
}

TEST(GraphLeaseTest, SecondRequestReusesTheGraphAndGetsTheSameGradients) {
  EXPECT_FALSE(RunLeased(Request("reuse_")).reused);
  for (float scale : {2.0f, -1.0f, 0.0f}) {
    SCOPED_TRACE(scale);
    const v1::GradRequest request = Request("reuse_", scale);
    const Outcome reused = RunLeased(request);
    EXPECT_TRUE(reused.reused);
    ASSERT_TRUE(reused.status.ok()) << reused.status;
    EXPECT_EQ(reused.grad, Fresh(request).grad);
  }
  // New shapes and dtypes in the same structure.
  const v1::GradRequest f64 = Request("reuse_", HostTensor::Float64({1, 2, 3, 4}, {2, 2}),
                                      HostTensor::Float64({-1, 0.5, 2, 1}, {2, 2}));
  const Outcome reused = RunLeased(f64);
  EXPECT_TRUE(reused.reused);
  ASSERT_TRUE(reused.status.ok()) << reused.status;
  EXPECT_EQ(reused.grad, Fresh(f64).grad);
  EXPECT_EQ(reused.grad.size(), 4u);
}

TEST(GraphLeaseTest, BadValuesInAReusedGraphFailAsInANewOne) {
  ASSERT_TRUE(RunLeased(Request("bad_")).status.ok());
  std::vector<v1::GradRequest> bad;
  // An integer leaf that requires grad (checked again by ValidateLeafValues).
  bad.push_back(Request("bad_", HostTensor::Int64({1, 2, 3}, {3}), HostTensor::Int64({1}, {1})));
  // Shapes that do not broadcast (found when the op runs).
  bad.push_back(
      Request("bad_", HostTensor::Float32({1, 2, 3}, {3}), HostTensor::Float32({1, 2}, {2})));
  for (const v1::GradRequest& request : bad) {
    const Outcome reused = RunLeased(request);
    EXPECT_TRUE(reused.reused);
    EXPECT_FALSE(reused.status.ok());
    EXPECT_EQ(reused.status, Fresh(request).status);
  }
  // The structure is still kept, and good values work again.
  const Outcome after = RunLeased(Request("bad_", 3));
  EXPECT_TRUE(after.reused);
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.grad, Fresh(Request("bad_", 3)).grad);
}

// A reused graph's names are not checked again (Census's strings_known): they are the kept
// graph's, which passed under the same limits. Under other limits nothing is reused, so a name
// over a tighter limit is refused as in a new graph.
TEST(GraphLeaseTest, NamesCheckedOnceAreNotCheckedAgainOnlyUnderTheSameLimits) {
  const std::string prefix = std::string(40, 'n') + "_";
  const graph::Limits roomy;
  ASSERT_GT(roomy.max_name_bytes, 64);
  ASSERT_TRUE(RunLeased(Request(prefix), roomy).status.ok());
  const Outcome reused = RunLeased(Request(prefix, 2), roomy);
  EXPECT_TRUE(reused.reused);
  ASSERT_TRUE(reused.status.ok()) << reused.status;
  EXPECT_EQ(reused.grad, Fresh(Request(prefix, 2), roomy).grad);

  graph::Limits tight = roomy;
  tight.max_name_bytes = 16;
  for (int i = 0; i < 2; ++i) {
    const Outcome refused = RunLeased(Request(prefix, 2), tight);
    EXPECT_FALSE(refused.reused);
    EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
    EXPECT_EQ(refused.status, Fresh(Request(prefix, 2), tight).status);
  }
}

TEST(GraphLeaseTest, KeepsOnlyWhatQualifies) {
  graph::Limits other;
  other.max_ops = 1000;
  ASSERT_TRUE(RunLeased(Request("limits_")).status.ok());
  EXPECT_FALSE(RunLeased(Request("limits_"), other).reused) << "the limits are part of the key";

  ASSERT_TRUE(RunLeased(Request("off_"), {}, /*enabled=*/false).status.ok());
  EXPECT_FALSE(RunLeased(Request("off_")).reused) << "a disabled lease keeps nothing";

  // A graph that fails Validate is not kept.
  v1::GradRequest unknown = Request("unknown_");
  unknown.mutable_graph()->mutable_ops(1)->set_op("frobnicate");
  EXPECT_FALSE(RunLeased(unknown).status.ok());
  EXPECT_FALSE(RunLeased(unknown).reused);

  // Too many ops.
  RequestBuilder big;
  big.Leaf("big_x", HostTensor::Float32({1}, {1}), true);
  std::string last = "big_x";
  for (int i = 0; i <= GraphLease::kMaxOps; ++i) {
    big.Op("neg", {last}, {"big_" + std::to_string(i)});
    last = "big_" + std::to_string(i);
  }
  big.Grad({last}, {"big_x"});
  ASSERT_TRUE(RunLeased(big.request()).status.ok());
  EXPECT_FALSE(RunLeased(big.request()).reused);

  // Too many bytes of names (under limits that let names be that long).
  v1::GradRequest long_names = Request("long_");
  long_names.mutable_graph()->mutable_ops(0)->set_outputs(
      0, std::string(GraphLease::kMaxStructureBytes, 'a'));
  long_names.mutable_graph()->mutable_ops(1)->set_inputs(
      0, std::string(GraphLease::kMaxStructureBytes, 'a'));
  graph::Limits long_names_allowed;
  long_names_allowed.max_name_bytes = GraphLease::kMaxStructureBytes;
  ASSERT_TRUE(RunLeased(long_names, long_names_allowed).status.ok());
  EXPECT_FALSE(RunLeased(long_names, long_names_allowed).reused);

  // A checkpoint body.
  v1::GradRequest body = Request("body_");
  v1::Op* checkpoint = body.mutable_graph()->mutable_ops(1);  // tanh a -> b, in a body
  checkpoint->set_op("checkpoint");
  checkpoint->mutable_body()->add_inputs("in");
  v1::Op* inner = checkpoint->mutable_body()->add_ops();
  inner->set_op("tanh");
  inner->add_inputs("in");
  inner->add_outputs("out");
  checkpoint->mutable_body()->add_outputs("out");
  ASSERT_TRUE(RunLeased(body).status.ok()) << RunLeased(body).status;
  EXPECT_FALSE(RunLeased(body).reused);
}

TEST(GraphLeaseTest, NotKeptWhileSomethingElseHoldsIt) {
  const v1::GradRequest request = Request("held_");
  std::shared_ptr<graph::Graph> held;
  {
    GraphLease lease(request.graph(), {});
    absl::StatusOr<EngineRequest> converted = FromProto(request, {}, nullptr, lease.reusable());
    ASSERT_TRUE(converted.ok());
    held = converted->graph;
    ASSERT_TRUE(lease.Record(converted->graph, nullptr).ok());
  }
  EXPECT_FALSE(RunLeased(request).reused);
  EXPECT_TRUE(held->leaves[0].value.defined()) << "a graph someone holds is left untouched";
}

// The records of request's ops as a serializer writes them (UnaryMessages::op_records).
std::string OpRecords(const v1::GradRequest& request) {
  v1::Graph ops_only;
  *ops_only.mutable_ops() = request.graph().ops();
  return ops_only.SerializeAsString();
}

TEST(GraphLeaseTest, EqualOpRecordsStandInForTheOps) {
  const v1::GradRequest request = Request("records_");
  const std::string records = OpRecords(request);
  ASSERT_TRUE(RunLeased(request, {}, true, &records).status.ok());
  for (float scale : {2.0f, -3.0f}) {
    const v1::GradRequest again = Request("records_", scale);
    const Outcome reused = RunLeased(again, {}, true, &records);
    EXPECT_TRUE(reused.reused);
    ASSERT_TRUE(reused.status.ok()) << reused.status;
    EXPECT_EQ(reused.grad, Fresh(again).grad);
  }

  // Other ops (tanh becomes sigmoid) given under the kept records: the records alone decide,
  // so the ops are not compared. This is why a caller must pass the request's own records.
  v1::GradRequest sigmoid = Request("records_");
  sigmoid.mutable_graph()->mutable_ops(1)->set_op("sigmoid");
  EXPECT_TRUE(RunLeased(sigmoid, {}, true, &records).reused);
  // With its own records it is compared whole, and is not the kept graph.
  const std::string sigmoid_records = OpRecords(sigmoid);
  const Outcome own = RunLeased(sigmoid, {}, true, &sigmoid_records);
  EXPECT_FALSE(own.reused);
  ASSERT_TRUE(own.status.ok()) << own.status;
  EXPECT_EQ(own.grad, Fresh(sigmoid).grad);
  // The cache now holds the sigmoid graph, with its records.
  EXPECT_TRUE(RunLeased(sigmoid, {}, true, &sigmoid_records).reused);

  // The rest of the structure and the limits are still compared under equal records.
  v1::GradRequest frozen = sigmoid;
  frozen.mutable_graph()->mutable_leaves(0)->set_requires_grad(false);
  EXPECT_FALSE(RunLeased(frozen, {}, true, &sigmoid_records).reused);
  ASSERT_TRUE(RunLeased(sigmoid, {}, true, &sigmoid_records).status.ok());
  graph::Limits other;
  other.max_ops = 1000;
  EXPECT_FALSE(RunLeased(sigmoid, other, true, &sigmoid_records).reused);

  // A request whose records are unknown is compared whole, and leaves the kept graph's
  // records unknown: the next request is compared whole too, whatever its records.
  ASSERT_TRUE(RunLeased(sigmoid, {}, true, &sigmoid_records).status.ok());
  EXPECT_TRUE(RunLeased(sigmoid).reused);
  EXPECT_FALSE(RunLeased(request, {}, true, &sigmoid_records).reused);
}

// SameStructure against the graph FromProto built from the same wire graph, mutated one field at
// a time.
TEST(SameStructureTest, EveryFieldButLeafValuesCounts) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1, 2}, {2}), true)
      .Leaf("k", HostTensor::Int64({1}, {1}))
      .Op("mul", {"x", "x"}, {"a"},
          {{"i", client::IntAttr(3)},
           {"f", FloatAttr(0.0)},
           {"b", client::BoolAttr(true)},
           {"s", client::StringAttr("s")},
           {"ints", client::IntsAttr({1, 2})},
           {"floats", client::FloatsAttr({1.5, -2})},
           {"strings", client::StringsAttr({"p", "q"})}})
      .Op("sum", {"a"}, {"loss"});
  const v1::Graph wire = b.request().graph();
  v1::GradRequest request;
  *request.mutable_graph() = wire;
  absl::StatusOr<EngineRequest> built = FromProto(request, {});
  ASSERT_TRUE(built.ok()) << built.status();
  const graph::Graph& g = *built->graph;
  EXPECT_TRUE(SameStructure(wire, g));

  // Leaf values are not structure.
  v1::Graph values = wire;
  HostTensor::Float64({7}, {}).ToProto(values.mutable_leaves(0)->mutable_value());
  values.mutable_leaves(1)->mutable_value()->Clear();
  EXPECT_TRUE(SameStructure(values, g));

  auto attr = [](v1::Graph& w, const std::string& name) -> v1::AttrValue& {
    return (*w.mutable_ops(0)->mutable_attrs())[name];
  };
  std::vector<std::pair<std::string, std::function<void(v1::Graph&)>>> mutations = {
      {"leaf name", [](v1::Graph& w) { w.mutable_leaves(1)->set_name("k2"); }},
      {"requires_grad", [](v1::Graph& w) { w.mutable_leaves(1)->set_requires_grad(true); }},
      {"one more leaf", [](v1::Graph& w) { w.add_leaves()->set_name("z"); }},
      {"op", [](v1::Graph& w) { w.mutable_ops(1)->set_op("mean"); }},
      {"op input", [](v1::Graph& w) { w.mutable_ops(0)->set_inputs(1, "k"); }},
      {"one more input", [](v1::Graph& w) { w.mutable_ops(1)->add_inputs("x"); }},
      {"op output", [](v1::Graph& w) { w.mutable_ops(1)->set_outputs(0, "total"); }},
      {"no_grad", [](v1::Graph& w) { w.mutable_ops(1)->set_no_grad(true); }},
      {"body", [](v1::Graph& w) { w.mutable_ops(1)->mutable_body(); }},
      {"one more op", [](v1::Graph& w) { w.add_ops()->set_op("neg"); }},
      {"graph input", [](v1::Graph& w) { w.add_inputs("in"); }},
      {"graph output", [](v1::Graph& w) { w.add_outputs("loss"); }},
      {"attr name",
       [&](v1::Graph& w) {
         w.mutable_ops(0)->mutable_attrs()->erase("i");
         attr(w, "j").set_i(3);
       }},
      {"one more attr", [&](v1::Graph& w) { attr(w, "extra").set_b(false); }},
      {"one attr less", [](v1::Graph& w) { w.mutable_ops(0)->mutable_attrs()->erase("s"); }},
      {"int", [&](v1::Graph& w) { attr(w, "i").set_i(4); }},
      {"int as float", [&](v1::Graph& w) { attr(w, "i").set_f(3); }},
      {"float -0", [&](v1::Graph& w) { attr(w, "f").set_f(-0.0); }},
      {"bool", [&](v1::Graph& w) { attr(w, "b").set_b(false); }},
      {"string", [&](v1::Graph& w) { attr(w, "s").set_s("t"); }},
      {"ints", [&](v1::Graph& w) { attr(w, "ints").mutable_ints()->set_values(1, 3); }},
      {"ints longer", [&](v1::Graph& w) { attr(w, "ints").mutable_ints()->add_values(3); }},
      {"floats", [&](v1::Graph& w) { attr(w, "floats").mutable_floats()->set_values(0, 1.25); }},
      {"floats as ints", [&](v1::Graph& w) { attr(w, "floats").mutable_ints()->add_values(1); }},
      {"strings", [&](v1::Graph& w) { attr(w, "strings").mutable_strings()->set_values(1, "r"); }},
      {"no value", [&](v1::Graph& w) { attr(w, "s").Clear(); }},
  };
  for (auto& [name, mutate] : mutations) {
    SCOPED_TRACE(name);
    v1::Graph changed = wire;
    mutate(changed);
    EXPECT_FALSE(SameStructure(changed, g));
  }
}

// A field added to these messages must be compared by SameStructure (server/wire/wire.cc) unless it
// is a leaf's value, and this count then updated.
TEST(SameStructureTest, KnowsEveryFieldOfTheGraphMessages) {
  EXPECT_EQ(v1::Graph::descriptor()->field_count(), 4);
  EXPECT_EQ(v1::Leaf::descriptor()->field_count(), 3);
  EXPECT_EQ(v1::Op::descriptor()->field_count(), 6);
  EXPECT_EQ(v1::AttrValue::descriptor()->field_count(), 7);
}

}  // namespace
}  // namespace gradserve::server
