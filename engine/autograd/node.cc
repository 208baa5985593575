#include "engine/autograd/node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/autograd/grad_mode.h"

namespace gradserve::autograd {

namespace {
thread_local uint64_t next_sequence_nr = 0;

}  // namespace

uint64_t NextSequenceNr() { return next_sequence_nr++; }

Node::Node(EdgeList next_edges) : sequence_nr_(NextSequenceNr()) {
  set_next_edges(std::move(next_edges));
}

Node::~Node() {
  if (budget_ != nullptr) budget_->Release(charged_);
}

void Node::Charge(int64_t bytes) {
  if (budget_ == nullptr) return;
  budget_->Charge(bytes);
  charged_ += bytes;
}

void Node::set_next_edges(EdgeList next_edges) {
  // Edges are set once, after MakeNode (the constructor's come before the charge).
  if (next_edges.size() > kEdgesCovered) {
    Charge(static_cast<int64_t>(next_edges.size() - kEdgesCovered) * kEdgeBytes);
  }
  next_edges_ = std::move(next_edges);
  uint64_t topo = 0;
  for (const Edge& edge : next_edges_) {
    if (edge.function) topo = std::max(topo, edge.function->topological_nr() + 1);
  }
  topological_nr_ = topo;
}

uint32_t Node::add_input_metadata(const InputMetadata& metadata) {
  if (input_metadata_.size() >= kInputsCovered) Charge(kInputBytes);
  if (!stream_.has_stream()) stream_ = metadata.stream;
  input_metadata_.push_back(metadata);
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

void Node::set_label(std::string label) {
  // The one label of a Node made outside a recorded graph.
  struct Fixed final : NodeLabeler {
    explicit Fixed(std::string l) : label(std::move(l)) {}
    std::string Label(int64_t) const override { return label; }
    const std::string label;
  };
  set_label(std::make_shared<const Fixed>(std::move(label)), 0);
}

std::string Node::DebugName() const {
  if (labeler_ == nullptr) return name();
  return absl::StrCat(name(), " (", label(), ")");
}

// Note [Tearing down long chains]: the first DeleteNode on a thread becomes the drain loop;
// Nodes whose last reference dies while it deletes (through next edges, saved tensors or
// anything else) are queued and deleted by the loop, never by recursion.
void DeleteNode(Node* node) {
  thread_local std::vector<Node*>* pending = nullptr;
  if (pending != nullptr) {
    pending->push_back(node);
    return;
  }
  std::vector<Node*> queue{node};
  pending = &queue;
  while (!queue.empty()) {
    Node* next = queue.back();
    queue.pop_back();
    delete next;
  }
  pending = nullptr;
}

}  // namespace gradserve::autograd
