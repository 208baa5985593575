// Building graphs and reading results in the graph interpreter's tests.

#ifndef GRADSERVE_TESTS_ENGINE_GRAPH_TEST_UTIL_H_
#define GRADSERVE_TESTS_ENGINE_GRAPH_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "engine/graph/graph.h"
#include "engine/graph/interpreter.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"

namespace gradserve::graph::testing {

// A float64 tensor of the given shape (default: a vector of the values).
inline Tensor F64(std::vector<double> values, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return Tensor::FromVector<double>(values, shape);
}

// The values of a tensor of any floating dtype and strides, as doubles.
inline std::vector<double> Values(const Tensor& t) {
  const Tensor packed = t.contiguous().To(DType::kFloat64);
  const double* data = packed.data<double>();
  return std::vector<double>(data, data + packed.numel());
}

// Builds a Graph op by op: GraphBuilder b; b.Leaf("x", F64({1, 2}), true); b.Op("mul", {"x",
// "x"}, {"h"}); ...
class GraphBuilder {
 public:
  GraphBuilder& Leaf(std::string name, Tensor value, bool requires_grad = false) {
    graph_.leaves.push_back({std::move(name), std::move(value), requires_grad});
    return *this;
  }
  GraphBuilder& Op(std::string op, std::vector<std::string> inputs,
                   std::vector<std::string> outputs, ops::Attrs attrs = {}) {
    graph::Op o;
    o.op = std::move(op);
    o.inputs = std::move(inputs);
    o.outputs = std::move(outputs);
    o.attrs = std::move(attrs);
    graph_.ops.push_back(std::move(o));
    return *this;
  }
  // The last op added, to set no_grad or body.
  graph::Op& last() { return graph_.ops.back(); }
  GraphBuilder& Inputs(std::vector<std::string> names) {
    graph_.inputs = std::move(names);
    return *this;
  }
  GraphBuilder& Outputs(std::vector<std::string> names) {
    graph_.outputs = std::move(names);
    return *this;
  }
  Graph Build() const { return graph_; }
  std::shared_ptr<const Graph> BuildShared() const { return std::make_shared<Graph>(graph_); }

 private:
  Graph graph_;
};

// Records graph (with default limits unless given), failing the test on error.
inline std::unique_ptr<RecordedGraph> MustRecord(const Graph& graph, const Limits& limits = {}) {
  auto recorded = RecordedGraph::Record(graph, limits);
  EXPECT_TRUE(recorded.ok()) << recorded.status();
  return recorded.ok() ? *std::move(recorded) : nullptr;
}

// A grad-semantics call of one root with respect to inputs.
inline BackwardCall GradCall(std::string root, std::vector<std::string> inputs,
                             bool retain_graph = false) {
  BackwardCall call;
  call.roots = {std::move(root)};
  call.inputs = std::move(inputs);
  call.retain_graph = retain_graph;
  return call;
}

// Passes if status's message contains part.
inline ::testing::AssertionResult MessageHas(const absl::Status& status, const std::string& part) {
  if (absl::StrContains(status.message(), part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << status.ToString() << "\" lacks \"" << part << "\"";
}

// True if a and b hold bit-identical data of the same dtype and shape.
inline bool BitIdentical(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor pa = a.contiguous(), pb = b.contiguous();
  return std::memcmp(pa.raw_data(), pb.raw_data(), pa.nbytes()) == 0;
}

}  // namespace gradserve::graph::testing

#endif  // GRADSERVE_TESTS_ENGINE_GRAPH_TEST_UTIL_H_
