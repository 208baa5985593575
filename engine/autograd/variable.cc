#include "engine/autograd/variable.h"

#include <atomic>

#include "engine/autograd/accumulate_grad.h"
#include "engine/autograd/autograd_meta.h"
#include "engine/autograd/grad_mode.h"

namespace gradserve::autograd {

namespace {

// One walk for both kinds of input list.
template <typename Tensors>
bool AnyRequiresGrad(const Tensors& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

template <typename Tensors>
EdgeList EdgesOf(const Tensors& inputs) {
  EdgeList edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(GradientEdge(t));
  return edges;
}

}  // namespace

bool ShouldRecord(absl::Span<const Tensor> inputs) { return AnyRequiresGrad(inputs); }
bool ShouldRecord(TensorRefs inputs) { return AnyRequiresGrad(inputs); }

Edge GradientEdge(const Tensor& t) {
  if (!t.defined()) return Edge();
  if (const auto& fn = t.grad_fn()) return Edge(fn, t.output_nr());
  if (auto acc = GradAccumulator(t)) return Edge(std::move(acc), 0);
  return Edge();
}

EdgeList CollectNextEdges(absl::Span<const Tensor> inputs) { return EdgesOf(inputs); }
EdgeList CollectNextEdges(TensorRefs inputs) { return EdgesOf(inputs); }

void SetHistory(Tensor& out, const std::shared_ptr<Node>& node) {
  AutogradMeta& meta = MutableMetaOf(out);
  meta.output_nr_ = node->add_input_metadata(InputMetadata(out));
  meta.grad_fn_ = node;
}

void SetGradientEdge(Tensor& t, Edge edge) {
  if (!edge.is_valid()) return;
  AutogradMeta& meta = MutableMetaOf(t);
  meta.output_nr_ = edge.input_nr;
  meta.grad_fn_ = std::move(edge.function);
}

std::shared_ptr<Node> GradAccumulator(const Tensor& leaf) {
  AutogradMeta* meta = MetaOf(leaf);
  if (meta == nullptr || !meta->requires_grad_ || meta->grad_fn_ != nullptr) return nullptr;
  MutexLock lock(&meta->mutex_);
  if (auto existing = meta->grad_accumulator_.lock()) return existing;
  std::shared_ptr<Node> made = MakeNode<AccumulateGrad>(leaf);
  meta->grad_accumulator_ = made;
  return made;
}

void TrackView(Tensor& view, const Tensor& base) {
  const Tensor* root = ViewBaseOf(base);
  if (root == nullptr) {
    // A view of an untracked view stays untracked: its base is not known.
    // (A tensor without elements has no layout to speak of: any will do.)
    if (base.is_view() || !(base.is_contiguous() || base.numel() == 0)) return;
    root = &base;
  }
  AutogradMeta& meta = MutableMetaOf(view);
  meta.view_base_ = *root;
  meta.tracks_view_ = true;
  meta.view_version_ = view.version();
}

void MarkViewMadeUnderNoGrad(Tensor& view) { MutableMetaOf(view).view_made_under_no_grad_ = true; }

bool IsViewMadeUnderNoGrad(const Tensor& t) {
  const AutogradMeta* meta = MetaOf(t);
  return meta != nullptr && meta->view_made_under_no_grad_;
}

const Tensor* ViewBaseOf(const Tensor& t) {
  const AutogradMeta* meta = MetaOf(t);
  return meta != nullptr && meta->tracks_view_ ? &meta->view_base_ : nullptr;
}

namespace {
std::atomic<ViewReplayMaker> view_replay_maker{nullptr};
}  // namespace

void SetViewReplayMaker(ViewReplayMaker maker) { view_replay_maker.store(maker); }

std::shared_ptr<Node> MakeViewReplay(const Tensor& view, const Tensor& base) {
  const ViewReplayMaker maker = view_replay_maker.load();
  GS_CHECK_INTERNAL(maker != nullptr,
                    "no view-replay Node maker installed (Note [Views written in place])");
  return maker(view, base);
}

void ReplayViewFromBase(const Tensor& view) {
  AutogradMeta& meta = MutableMetaOf(view);
  GS_CHECK_INTERNAL(meta.tracks_view_, "ReplayViewFromBase of an untracked view");
  meta.view_version_ = view.version();
  meta.grad_fn_ = MakeViewReplay(view, meta.view_base_);
  meta.output_nr_ = 0;
}

void RegisterHook(const Tensor& t, std::shared_ptr<TensorHook> hook) {
  GS_CHECK_ARG(t.requires_grad(), "cannot register a hook on a tensor that does not require grad");
  if (const auto& fn = t.grad_fn()) {
    fn->add_tensor_pre_hook(t.output_nr(), std::move(hook));
  } else {
    GradAccumulator(t)->add_tensor_pre_hook(0, std::move(hook));
  }
}

}  // namespace gradserve::autograd
