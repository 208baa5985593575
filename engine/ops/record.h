// Autograd recording for the ops: whether an op's call is recorded, and the Node it makes.
// The kernels an op runs (engine/kernels/) know nothing of autograd; every op that records
// history goes through these.
//
// Thread safety: stateless; grad mode is per thread (engine/autograd/grad_mode.h).

#ifndef GRADSERVE_ENGINE_OPS_RECORD_H_
#define GRADSERVE_ENGINE_OPS_RECORD_H_

#include <memory>
#include <utility>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// --- Autograd recording ---

using autograd::TensorRefs;

// True if grad mode is on and any input requires grad.
inline bool ShouldRecordAny(TensorRefs inputs) { return autograd::ShouldRecord(inputs); }

// If grad mode is on and any input requires grad: makes the node make() returns, gives it edges
// to inputs (undefined or no-grad inputs get invalid edges), makes it out's grad_fn and returns
// it, so the caller can then save what its backward needs (an output is saved after this call,
// with SavedVariable(out, /*is_output=*/true), or the node would own its own output).
// Otherwise returns null and calls nothing, so forward-only calls save nothing.
// After an in-place op recorded its Node `fn` as the grad_fn of `view`, a tracked view that it
// wrote: makes its base's grad_fn a CopySlices over fn and the view's a view-replay Node
// (Note [Views written in place] in engine/autograd/variable.h). In inplace.cc.
void RebaseViewHistory(Tensor& view, const std::shared_ptr<autograd::Node>& fn);

template <typename Inputs, typename MakeFn>
auto RecordIfNeeded(Tensor& out, const Inputs& inputs, MakeFn&& make) -> decltype(make()) {
  if (!autograd::ShouldRecord(inputs)) return nullptr;
  auto node = make();
  node->set_next_edges(autograd::CollectNextEdges(inputs));
  autograd::SetHistory(out, node);
  if (out.is_view()) [[unlikely]]
    RebaseViewHistory(out, node);
  return node;
}
template <typename MakeFn>
auto RecordIfNeeded(Tensor& out, TensorRefs inputs, MakeFn&& make) -> decltype(make()) {
  return RecordIfNeeded<TensorRefs>(out, inputs, std::forward<MakeFn>(make));
}

// RecordIfNeeded for a node made from constructor arguments: NodeT(args...).
template <typename NodeT, typename... Args>
std::shared_ptr<NodeT> RecordOp(Tensor& out, TensorRefs inputs, Args&&... args) {
  return RecordIfNeeded(out, inputs,
                        [&] { return autograd::MakeNode<NodeT>(std::forward<Args>(args)...); });
}

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_RECORD_H_
