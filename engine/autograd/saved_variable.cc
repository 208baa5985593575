#include "engine/autograd/saved_variable.h"

#include "absl/strings/str_cat.h"
#include "engine/autograd/autograd_meta.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"

namespace gradserve::autograd {

SavedVariable::SavedVariable(const Tensor& t, bool is_output) : was_defined_(t.defined()) {
  if (!t.defined()) return;
  // As PyTorch's SavedVariable: only an output of the saving Node loses its grad_fn (that
  // would be a reference cycle); anything else is kept as it is, with its place in the graph.
  if (!is_output || !t.requires_grad() || t.is_leaf()) {
    data_ = t;
    saved_original_ = true;
    return;
  }
  data_ = t.detach();
  output_nr_ = t.output_nr();
}

Tensor SavedVariable::unpack(const Node* saved_for) const {
  if (released_) {
    ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
        "trying to backward through the graph a second time: the saved tensors of ",
        saved_for != nullptr ? saved_for->DebugName() : std::string("a node"),
        " were freed after the first backward; set retain_graph on the earlier call to "
        "keep them")));
  }
  // Unless the backward is itself recorded (create_graph), the data alone will do.
  if (!was_defined_ || saved_original_ || !GradMode::is_enabled()) return data_;
  // An output of saved_for: the saving Node is alive (it is running), so its shared_ptr can
  // be recovered.
  Tensor out = data_.detach();
  AutogradMeta& meta = MutableMetaOf(out);
  meta.output_nr_ = output_nr_;
  meta.grad_fn_ = const_cast<Node*>(saved_for)->shared_from_this();
  return out;
}

void SavedVariable::reset() {
  data_ = Tensor();
  released_ = true;
}

}  // namespace gradserve::autograd
