#include "engine/autograd/autograd.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/autograd/accumulate_grad.h"
#include "engine/autograd/engine.h"
#include "engine/autograd/variable.h"
#include "engine/util/quote.h"

namespace gradserve::autograd {
namespace {

// What error messages call tensor i of a list: its name if it has one.
std::string Describe(const char* what, size_t i, const Tensor& t) {
  if (t.defined() && !t.name().empty()) return absl::StrCat(what, " ", Quote(t.name()));
  return absl::StrCat(what, " ", i);
}

// Checks the roots and makes their edges and seeds (ones for implicit seeds of one-element
// roots), as torch.autograd does before it calls the engine.
void PrepareRoots(const TensorList& roots, const TensorList& seeds, EdgeList& edges,
                  TensorList& grads) {
  GS_CHECK_ARG(!roots.empty(), "backward needs at least one root");
  GS_CHECK_ARG(seeds.empty() || seeds.size() == roots.size(), "got ", seeds.size(),
               " seed gradients for ", roots.size(), " roots");
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    GS_CHECK_ARG(root.defined(), Describe("root", i, root), " is undefined");
    Edge edge = GradientEdge(root);
    GS_CHECK_ARG(edge.is_valid(), Describe("root", i, root),
                 " does not require grad and has no grad_fn");
    Tensor seed = seeds.empty() ? Tensor() : seeds[i];
    if (!seed.defined()) {
      GS_CHECK_ARG(root.numel() == 1, "a seed gradient can be implicitly created only for ",
                   "one-element roots, but ", Describe("root", i, root), " has shape ",
                   ShapeToString(root.shape()));
      seed = Tensor::Full(root.shape(), 1.0, root.dtype(), root.device());
    } else {
      GS_CHECK_ARG(seed.shape() == root.shape(), "mismatch in shape: the seed of ",
                   Describe("root", i, root), " has shape ", ShapeToString(seed.shape()),
                   " but the root has shape ", ShapeToString(root.shape()));
      GS_CHECK_ARG(IsFloating(seed.dtype()), "the seed of ", Describe("root", i, root),
                   " must be floating, got ", DTypeName(seed.dtype()));
      GS_CHECK_ARG(seed.device() == root.device(), "the seed of ", Describe("root", i, root),
                   " is on ", DeviceName(seed.device()), " but the root is on ",
                   DeviceName(root.device()));
      seed = seed.To(root.dtype());
    }
    edges.push_back(std::move(edge));
    grads.push_back(std::move(seed));
  }
}

absl::StatusOr<TensorList> RunBackward(const TensorList& roots, const TensorList& seeds,
                                       const TensorList& inputs, const BackwardOptions& options,
                                       bool accumulate_grad) {
  try {
    std::optional<MemoryBudgetScope> budget_scope;
    if (options.budget != nullptr) budget_scope.emplace(options.budget);
    std::optional<CancellationScope> cancel_scope;
    if (options.cancel != nullptr) cancel_scope.emplace(options.cancel.get());
    EdgeList root_edges;
    TensorList grads;
    PrepareRoots(roots, seeds, root_edges, grads);
    EdgeList output_edges;
    output_edges.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& input = inputs[i];
      GS_CHECK_ARG(input.defined() && input.requires_grad(), Describe("input", i, input),
                   " does not require grad, so it has no gradient");
      // Note [backward() into a non-leaf] (accumulate_grad.cc).
      if (accumulate_grad && !input.is_leaf()) RetainGrad(input);
      output_edges.push_back(GradientEdge(input));
    }
    ExecuteOptions execute_options;
    execute_options.keep_graph = options.retain_graph;
    execute_options.create_graph = options.create_graph;
    execute_options.accumulate_grad = accumulate_grad;
    execute_options.anomaly_mode = options.anomaly_mode;
    execute_options.cancel = options.cancel;
    execute_options.budget = options.budget;
    execute_options.stats = options.stats;
    execute_options.sole_pass = options.sole_pass;
    absl::StatusOr<TensorList> result =
        Engine::Get().execute(root_edges, std::move(grads), execute_options, output_edges);
    if (!result.ok() || accumulate_grad) return result;
    TensorList& captured = *result;
    for (size_t i = 0; i < captured.size(); ++i) {
      if (captured[i].defined()) continue;
      if (options.materialize_grads) {
        captured[i] = inputs[i].ZerosLike();
      } else if (!options.allow_unused) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe("input", i, inputs[i]),
            " was not used to compute the roots, so it has no gradient; set allow_unused "
            "to get an empty gradient for it, or materialize_grads to get zeros"));
      }
    }
    return result;
  } catch (const StatusError& e) {
    return e.status();
  }
}

}  // namespace

absl::StatusOr<TensorList> Grad(const TensorList& roots, const TensorList& seeds,
                                const TensorList& inputs, const BackwardOptions& options) {
  return RunBackward(roots, seeds, inputs, options, /*accumulate_grad=*/false);
}

absl::Status Backward(const TensorList& roots, const TensorList& seeds, const TensorList& inputs,
                      const BackwardOptions& options) {
  return RunBackward(roots, seeds, inputs, options, /*accumulate_grad=*/true).status();
}

}  // namespace gradserve::autograd
