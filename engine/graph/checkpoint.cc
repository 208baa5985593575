#include "engine/graph/checkpoint.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/saved_variable.h"
#include "engine/autograd/variable.h"
#include "engine/ops/shape.h"
#include "engine/util/status_error.h"

namespace gradserve::graph {
namespace {

using autograd::GradModeGuard;
using autograd::Node;
using autograd::SavedVariable;

class CheckpointBackward final : public Node {
 public:
  // output_of_input[k] is the body output whose gradient arrives as this Node's input k.
  CheckpointBackward(const TensorList& inputs, TensorList params, CheckpointBody body,
                     std::vector<size_t> output_of_input, size_t num_body_outputs)
      : params_(std::move(params)),
        body_(std::move(body)),
        output_of_input_(std::move(output_of_input)),
        num_body_outputs_(num_body_outputs) {
    saved_inputs_.reserve(inputs.size());
    for (const Tensor& input : inputs) saved_inputs_.emplace_back(input, /*is_output=*/false);
  }

  std::string name() const override { return "CheckpointFunctionBackward"; }

  void release_variables() override {
    for (SavedVariable& saved : saved_inputs_) saved.reset();
  }

  TensorList apply(TensorList&& grads) override {
    // The Engine turns grad mode on while it runs a Node exactly when it records the backward.
    const bool create_graph = autograd::GradMode::is_enabled();
    const size_t num_inputs = saved_inputs_.size();

    // wrt[j] is the tensor whose gradient becomes this Node's output wrt_slot[j].
    TensorList inputs(num_inputs), wrt;
    std::vector<size_t> wrt_slot;
    for (size_t i = 0; i < num_inputs; ++i) {
      // Without create_graph the saved input comes back without history, so whether it needs
      // a gradient is read from its edge.
      const Tensor saved = saved_inputs_[i].unpack(this);
      inputs[i] = saved;
      if (!should_compute_output(i)) continue;
      if (!create_graph) {
        inputs[i] = saved.detach();
        inputs[i].set_requires_grad(true);
        inputs[i].set_name(saved.name());
      } else {
        // Note [Capturing a checkpoint input's gradient]
        // Under create_graph the body recomputes from the saved input itself, so that the
        // gradients stay connected to it; but the nested grad would then capture the input's
        // gradient after the input's own hooks (captures follow tensor pre-hooks), and this
        // Node's output flows into the same grad_fn, where they run again. The body gets an
        // alias of the input with a grad_fn of its own (an identity permute), and the gradient
        // is captured there, before the input's hooks, which then run once, downstream.
        std::vector<int64_t> identity(static_cast<size_t>(saved.dim()));
        for (size_t d = 0; d < identity.size(); ++d) identity[d] = static_cast<int64_t>(d);
        inputs[i] = ops::permute(saved, identity);
        inputs[i].set_name(saved.name());
      }
      wrt.push_back(inputs[i]);
      wrt_slot.push_back(i);
    }
    for (size_t p = 0; p < params_.size(); ++p) {
      if (should_compute_output(num_inputs + p)) {
        wrt.push_back(params_[p]);
        wrt_slot.push_back(num_inputs + p);
      }
    }

    TensorList outputs;
    {
      GradModeGuard grad_mode(true);
      outputs = body_(inputs);
    }
    GS_CHECK_INTERNAL(outputs.size() == num_body_outputs_, "the checkpoint body returned ",
                      outputs.size(), " outputs instead of ", num_body_outputs_);

    // Roots: the recomputed outputs that received a gradient and have history to carry it.
    TensorList roots, seeds;
    for (size_t k = 0; k < grads.size(); ++k) {
      const Tensor& output = outputs[output_of_input_[k]];
      if (grads[k].defined() && output.requires_grad()) {
        roots.push_back(output);
        seeds.push_back(grads[k]);
      }
    }
    TensorList result(num_outputs());
    if (roots.empty() || wrt.empty()) return result;

    autograd::BackwardOptions options;
    options.retain_graph = create_graph;
    options.create_graph = create_graph;
    options.allow_unused = true;  // not every input need reach every output
    TensorList wrt_grads = ValueOrThrow(autograd::Grad(roots, seeds, wrt, options));
    for (size_t j = 0; j < wrt_grads.size(); ++j) result[wrt_slot[j]] = std::move(wrt_grads[j]);
    return result;
  }

 private:
  std::vector<SavedVariable> saved_inputs_;
  const TensorList params_;  // leaves: held as they are, never freed
  const CheckpointBody body_;
  const std::vector<size_t> output_of_input_;
  const size_t num_body_outputs_;
};

}  // namespace

TensorList Checkpoint(const TensorList& inputs, const TensorList& params, CheckpointBody body) {
  TensorList outputs;
  {
    autograd::NoGradGuard no_grad;
    outputs = body(inputs);
  }
  // New impls, so that history is never attached to a tensor the body merely passed through.
  for (Tensor& output : outputs) output = output.detach();

  TensorList edge_tensors = inputs;
  edge_tensors.insert(edge_tensors.end(), params.begin(), params.end());
  if (!autograd::ShouldRecord(edge_tensors)) return outputs;

  std::vector<size_t> output_of_input;
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (IsFloating(outputs[j].dtype())) output_of_input.push_back(j);
  }
  auto node = autograd::MakeNode<CheckpointBackward>(inputs, params, std::move(body),
                                                     output_of_input, outputs.size());
  node->set_next_edges(autograd::CollectNextEdges(edge_tensors));
  for (size_t j : output_of_input) autograd::SetHistory(outputs[j], node);
  return outputs;
}

}  // namespace gradserve::graph
