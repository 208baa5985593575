// Edge: one input of one Node, the place a gradient flows to.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_EDGE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_EDGE_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace gradserve::autograd {

class Node;

struct Edge {
  Edge() = default;
  Edge(std::shared_ptr<Node> function, uint32_t input_nr)
      : function(std::move(function)), input_nr(input_nr) {}

  // An invalid edge stands for an input that needs no gradient.
  bool is_valid() const { return function != nullptr; }

  std::shared_ptr<Node> function;
  // Which input of `function` the gradient feeds.
  uint32_t input_nr = 0;
};

using EdgeList = std::vector<Edge>;

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_EDGE_H_
