#include "engine/graph/grad_op.h"

#include "engine/autograd/autograd.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/status_error.h"

namespace gradserve::graph {

TensorList RunGradOp(const TensorList& roots, const TensorList& seeds, const TensorList& wrt,
                     const ops::Attrs& attrs, const std::shared_ptr<CancellationToken>& cancel) {
  const bool materialize = attrs.GetBool("materialize_grads", false);
  autograd::BackwardOptions options;
  options.create_graph = attrs.GetBool("create_graph", true);
  options.retain_graph = attrs.GetBool("retain_graph", true);
  options.allow_unused = attrs.GetBool("allow_unused", false) || materialize;
  options.materialize_grads = materialize;
  options.cancel = cancel;
  options.budget = CurrentMemoryBudget();
  return ValueOrThrow(autograd::Grad(roots, seeds, wrt, options));
}

}  // namespace gradserve::graph
