// The schemas of the ops with graph-level meaning (grad, checkpoint, hook, detach; see
// engine/graph/graph.h), in the op registry's form, so that validation treats every op alike.

#ifndef GRADSERVE_ENGINE_GRAPH_GRAPH_LEVEL_OPS_H_
#define GRADSERVE_ENGINE_GRAPH_GRAPH_LEVEL_OPS_H_

#include "absl/strings/string_view.h"
#include "engine/ops/op_registry.h"

namespace gradserve::graph {

inline constexpr absl::string_view kGradOp = "grad";
inline constexpr absl::string_view kCheckpointOp = "checkpoint";
inline constexpr absl::string_view kHookOp = "hook";
inline constexpr absl::string_view kDetachOp = "detach";

// The schema of a graph-level op; null for any other name. Their `run` is empty: the
// interpreter runs them itself. num_outputs is -1 where the count depends on the op (grad:
// one per wrt, checkpoint: one per body output).
const ops::OpSchema* FindGraphLevelOp(absl::string_view name);

// A graph-level op's schema, else the op registry's; null if neither knows the name.
const ops::OpSchema* FindOpSchema(absl::string_view name);

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_GRAPH_LEVEL_OPS_H_
