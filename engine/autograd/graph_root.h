// GraphRoot: the Node that starts a backward with several roots.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_GRAPH_ROOT_H_
#define GRADSERVE_ENGINE_AUTOGRAD_GRAPH_ROOT_H_

#include <string>

#include "engine/autograd/node.h"

namespace gradserve::autograd {

// Its next edges are the roots' gradient edges; apply() hands out the seed gradients. The
// Engine uses it only when there is more than one root: a single root's own Node starts the
// backward directly with the seed in its InputBuffer.
class GraphRoot final : public Node {
 public:
  GraphRoot(EdgeList roots, TensorList seeds) : Node(std::move(roots)), seeds_(std::move(seeds)) {}

  TensorList apply(TensorList&& /*grads*/) override { return seeds_; }
  std::string name() const override { return "GraphRoot"; }

 private:
  TensorList seeds_;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_GRAPH_ROOT_H_
