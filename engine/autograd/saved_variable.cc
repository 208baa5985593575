#include "engine/autograd/saved_variable.h"

#include "absl/strings/str_cat.h"
#include "engine/autograd/autograd_meta.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/util/quote.h"

namespace gradserve::autograd {

SavedVariable::SavedVariable(const Tensor& t, bool is_output) : was_defined_(t.defined()) {
  if (!t.defined()) return;
  saved_version_ = t.version();
  // As PyTorch's SavedVariable: only an output of the saving Node loses its grad_fn (that
  // would be a reference cycle); anything else is kept as it is, with its place in the graph.
  if (!is_output || !t.requires_grad() || t.is_leaf()) {
    data_ = t;
    saved_original_ = true;
    return;
  }
  data_ = t.detach();
  output_nr_ = t.output_nr();
  if (t.is_view() && ViewBaseOf(t) != nullptr) {
    is_inplace_on_view_ = true;
    MutableMetaOf(data_).saved_view_grad_fn_ = t.grad_fn();
  }
}

Tensor SavedVariable::unpack(const Node* saved_for) const {
  if (released_) {
    ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
        "trying to backward through the graph a second time: the saved tensors of ",
        saved_for != nullptr ? saved_for->DebugName() : std::string("a node"),
        " were freed after the first backward; set retain_graph on the earlier call to "
        "keep them")));
  }
  if (was_defined_ && data_.version() != saved_version_) [[unlikely]]
    ThrowModified(saved_for);
  // Unless the backward is itself recorded (create_graph), the data alone will do.
  if (!was_defined_ || saved_original_ || !GradMode::is_enabled()) return data_;
  // An output of saved_for: the saving Node is alive (it is running), so its shared_ptr can
  // be recovered.
  Tensor out = data_.detach();
  AutogradMeta& meta = MutableMetaOf(out);
  meta.output_nr_ = output_nr_;
  if (is_inplace_on_view_) [[unlikely]] {
    // As PyTorch: the view's history, or the saving Node's once the view and its history are
    // gone (then nothing else can reach that history either).
    meta.grad_fn_ = MetaOf(data_)->saved_view_grad_fn_.lock();
    if (meta.grad_fn_ != nullptr) return out;
  }
  meta.grad_fn_ = const_cast<Node*>(saved_for)->shared_from_this();
  return out;
}

void SavedVariable::ThrowModified(const Node* saved_for) const {
  // PyTorch's words, then which value it was: a saved output by its place among the saving
  // Node's outputs (its alias here has no name), anything else by its value name and the Node
  // that made it.
  const std::string node = saved_for != nullptr ? saved_for->DebugName() : std::string("a node");
  std::string which;
  if (!saved_original_) {
    which = absl::StrCat("output ", output_nr_, " of ", node);
  } else {
    which = data_.name().empty() ? std::string("a tensor") : Quote(data_.name());
    // The history it had when saved, read as it is: a view's is not remade here, on a
    // backward's thread (Note [Views written in place]).
    const AutogradMeta* meta = MetaOf(data_);
    if (meta != nullptr && meta->grad_fn_ != nullptr) {
      absl::StrAppend(&which, ", output ", meta->output_nr_, " of ", meta->grad_fn_->DebugName(),
                      ",");
    }
  }
  ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
      "one of the variables needed for gradient computation has been modified by an inplace "
      "operation: ",
      which, " ", data_.DebugString(), " saved by ", node, " is at version ", data_.version(),
      "; expected version ", saved_version_,
      " instead (the value was written in place after the op that saved it)")));
}

void SavedVariable::reset() {
  data_ = Tensor();
  released_ = true;
}

}  // namespace gradserve::autograd
