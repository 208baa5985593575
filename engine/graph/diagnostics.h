// How the graph interpreter names ops, values and nodes in error messages and node labels.
//
// Note [Naming ops in errors]
// Every error about a graph names the op by its index in its graph and its first output, e.g.
// "op #3 (mul -> 'h'): input 'x2' is not defined before use". An op inside a checkpoint body is
// named by its path: "op #2 (checkpoint -> 'c') body: op #0 (mul -> 'h'): ...". Indices count
// from 0, as the ops are listed in the request. The grad_fn an op records is labelled
// "op #3 'h' = mul" (Node::set_label), so that errors the Engine raises during backward name the
// node, the op and the value together.

#ifndef GRADSERVE_ENGINE_GRAPH_DIAGNOSTICS_H_
#define GRADSERVE_ENGINE_GRAPH_DIAGNOSTICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/graph/graph.h"

namespace gradserve::graph {

// "<scope>op #3 (mul -> 'h')", or "<scope>op #5 (hook on 'x')" for an op without outputs.
// scope is "" for the top-level graph and ends in ": " otherwise (BodyScope).
std::string DescribeOp(absl::string_view scope, int64_t index, const Op& op);

// The scope of the ops of a checkpoint body: "<scope>op #2 (checkpoint -> 'c') body: ".
std::string BodyScope(absl::string_view scope, int64_t index, const Op& op);

// The label of the grad_fn that op records: "<scope>op #3 'h' = mul"; for an in-place op that
// names no output, the value it writes: "<scope>op #4 'h' = relu_".
std::string NodeLabel(absl::string_view scope, int64_t index, const Op& op);

// status with "<context>: " before its message; same code. OK stays OK.
absl::Status WithContext(const absl::Status& status, absl::string_view context);

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_DIAGNOSTICS_H_
