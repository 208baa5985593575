// Named server-side gradient hooks: what a graph's `hook` op installs, since clients cannot send
// code. Each changes the gradient that flows into one value during every later backward.
//
//   scale       factor:            grad * factor
//   clamp       min and/or max:    grad clamped to [min, max]
//   zero                           zeros
//   nan_to_num  nan, posinf, neginf (optional): NaN, +inf and -inf replaced
//
// The hooks compute with the registry's differentiable ops, so a hooked gradient can be
// differentiated again under create_graph.

#ifndef GRADSERVE_ENGINE_GRAPH_HOOKS_H_
#define GRADSERVE_ENGINE_GRAPH_HOOKS_H_

#include <memory>

#include "engine/autograd/function_hook.h"
#include "engine/ops/attributes.h"

namespace gradserve::graph {

// Builds the hook a `hook` op's attributes describe. Errors: throws StatusError
// (INVALID_ARGUMENT) naming the attribute for an unknown kind, a missing or mistyped
// parameter, or a parameter that does not apply to the kind. Validation calls it too, so a bad
// hook is rejected before anything runs.
// Thread safety: the hook is immutable; it may run on several Engine threads at once.
std::shared_ptr<autograd::TensorHook> MakeGradientHook(const ops::Attrs& attrs);

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_HOOKS_H_
