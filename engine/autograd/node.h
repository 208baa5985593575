// Node: one backward function of the recorded graph (PyTorch's grad_fn).
//
// Note [Node numbering]
// sequence_nr counts Nodes in creation order, per thread, as in PyTorch; the ReadyQueue runs the
// ready Node with the highest sequence_nr first, which approximates reverse creation order.
// topological_nr is the length of the longest path from the Node to any leaf (AccumulateGrad and
// other Nodes without next edges have 0). If a Node X is reachable from Y then
// X.topological_nr < Y.topological_nr, which lets the Engine prune whole sub-graphs that cannot
// reach the requested outputs (min_topo_nr). It is fixed once the Node's edges are set, which
// must happen before anything depends on the Node.
//
// Note [Node thread safety]
// Several GraphTasks may run the same Node at once (backward calls over a retained graph run on
// different threads). The Engine holds the Node's mutex() while it calls the Node's hooks,
// apply() and release_variables(), so a Node's own state (saved variables) needs no other
// guard. A reentrant Node (one whose apply runs a nested backward) holds its mutex through the
// nested backward; MAX_DEPTH bounds how many such mutexes one thread holds. A pass whose
// caller promises it is the only one over its Nodes (ExecuteOptions::sole_pass) runs them
// without it (Note [Fewer atomics per Node] in engine.cc).
//
// Note [Node labels]
// A label describes the forward op that made a Node ("op #3 'h' = mul"), for the errors that
// name the Node during backward. Almost no label is ever read, and formatting one cost more
// than recording a small op, so a Node holds the means to make its label instead: a
// NodeLabeler, shared by all the Nodes one graph recorded, and the Node's key in it. The label
// is formatted only when asked for.
//
// Note [Tearing down long chains]
// Destroying a Node releases its next edges, which may destroy the next Node, and so on: a
// chain of a million Nodes would overflow the stack if that recursed. Nodes are therefore made
// with MakeNode, whose deleter (DeleteNode) unlinks such chains iteratively.
//
// Note [Nodes on the budget]
// A recorded graph is memory the server holds for a request beside its tensors' bytes: each
// Node, its edges and input metadata, and the tensors it describes (their TensorImpl, Storage
// and autograd metadata, which a storage's charge of its bytes leaves out). None of it was
// counted, and in-graph grad with create_graph records the backward of each level, a graph
// several times the size of the one it differentiates, of one-element tensors whose bytes are
// next to nothing: 13 nested levels in a 935-byte request took 418 MB under a budget of 16 MiB.
// So MakeNode charges an estimate of each Node to the MemoryBudget current on the thread that
// makes it (Note [Memory budget]) before making it: sizeof its class plus kNodeOverheadBytes
// (the shared_ptr's control block, and up to kEdgesCovered edges and kInputsCovered inputs),
// and set_next_edges and add_input_metadata charge kEdgeBytes and kInputBytes for each one
// past those, before adding it. An input's estimate includes a share of the tensor it
// describes (an output of the op). A charge over the limit throws RESOURCE_EXHAUSTED, and the
// Node or its edges are not made. The Node keeps the budget and gives the whole charge back
// when it is destroyed, on whatever thread. With no budget current (tests, benchmarks) nothing
// is charged; the cost of the charge is then one thread-local read per Node. The Engine
// charges its table of a backward pass's Nodes too (Note [GraphTask node table]). The
// estimates were set against glibc's heap on nested in-graph grads of one-element tensors,
// where they charge a little more than the heap grows (0.8 to 0.95 bytes of heap per byte
// charged, 6 to 11 levels: docs/benchmarks.md).

#ifndef GRADSERVE_ENGINE_AUTOGRAD_NODE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_NODE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine/autograd/edge.h"
#include "engine/autograd/function_hook.h"
#include "engine/autograd/input_metadata.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

// Note [Node labels]: makes the labels of the Nodes of one recorded graph. Immutable, and
// called from any thread.
class NodeLabeler {
 public:
  virtual ~NodeLabeler() = default;
  // The label of the Node that was given `key`.
  virtual std::string Label(int64_t key) const = 0;
};

// Note [Nodes on the budget]: the estimates a Node is charged.
inline constexpr int64_t kEdgeBytes = sizeof(Edge) + 8;  // in a vector, with slack
// An input's metadata, malloc's header, and a share of the tensor it describes: a TensorImpl,
// Storage and autograd metadata are some 470 bytes, but many outputs of a recorded graph's ops
// are freed while their Nodes live, since only the saved ones are held. (The first input's
// metadata lies inside the Node, so sizeof counts it too: about 80 bytes over, per Node.)
inline constexpr int64_t kInputBytes = sizeof(InputMetadata) + 16 + 128;
inline constexpr uint32_t kEdgesCovered = 2;
inline constexpr uint32_t kInputsCovered = 1;
// The shared_ptr's control block with its deleter and malloc's headers, and the edges and
// inputs covered.
inline constexpr int64_t kNodeOverheadBytes =
    96 + kEdgesCovered * kEdgeBytes + kInputsCovered * kInputBytes;

class Node : public std::enable_shared_from_this<Node> {
 public:
  // Takes the next sequence number of this thread.
  explicit Node(EdgeList next_edges = EdgeList());
  // Gives back what the Node was charged (Note [Nodes on the budget]).
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // The backward function: from the gradients of the forward op's outputs (one per input of
  // this Node; an undefined tensor means zero) to the gradients of the forward op's inputs (one
  // per next edge; undefined where none is needed). Called by the Engine with mutex() held.
  // Errors: throws StatusError (Note [Errors inside the engine]).
  virtual TensorList apply(TensorList&& grads) = 0;

  // PyTorch's name of the backward function, e.g. "MulBackward0".
  virtual std::string name() const = 0;

  // Frees what the backward needs (saved tensors). Called by the Engine after apply() unless the
  // graph is kept; a later apply() then throws FAILED_PRECONDITION.
  virtual void release_variables() {}

  // --- Edges: where the gradients this Node makes go. ---
  const EdgeList& next_edges() const { return next_edges_; }
  const Edge& next_edge(size_t i) const { return next_edges_[i]; }
  uint32_t num_outputs() const { return static_cast<uint32_t>(next_edges_.size()); }
  // True if gradient output i is needed by anything.
  bool should_compute_output(size_t i) const { return next_edges_[i].is_valid(); }
  // Sets the edges and, from them, topological_nr (Note [Node numbering]). Edges past
  // kEdgesCovered are charged to the Node's budget first: throws RESOURCE_EXHAUSTED, leaving
  // the Node as it was, over the limit (Note [Nodes on the budget]).
  void set_next_edges(EdgeList next_edges);

  // --- Inputs: the gradients this Node receives. ---
  // Records the metadata of a forward output; returns its input number. Inputs past
  // kInputsCovered are charged as set_next_edges charges edges.
  uint32_t add_input_metadata(const InputMetadata& metadata);
  uint32_t num_inputs() const { return static_cast<uint32_t>(input_metadata_.size()); }
  const InputMetadata& input_metadata(size_t i) const { return input_metadata_[i]; }
  // The stream this Node's backward runs on: that of its first input on a device with streams,
  // none if no input has one (Note [Streams in the backward pass]), as PyTorch's Node::stream.
  // Kept as the metadata is added, so the Engine reads it without a loop per Node.
  Stream stream() const { return stream_; }

  uint64_t sequence_nr() const { return sequence_nr_; }
  uint64_t topological_nr() const { return topological_nr_; }

  // A description of the forward op that made this Node, for error messages (e.g.
  // "op #3 'h' = mul"); empty if none was given. Formatted on each call (Note [Node labels]).
  std::string label() const { return labeler_ == nullptr ? "" : labeler_->Label(label_key_); }
  bool has_label() const { return labeler_ != nullptr; }
  // The label is labeler->Label(key).
  void set_label(std::shared_ptr<const NodeLabeler> labeler, int64_t key) {
    labeler_ = std::move(labeler);
    label_key_ = key;
  }
  // A fixed label.
  void set_label(std::string label);
  // name(), with the label if any: what error messages call this Node.
  std::string DebugName() const;

  // --- Hooks (function_hook.h says in which order they run). Not thread-safe against a
  // backward that is running; register them while the graph is being built. ---
  void add_tensor_pre_hook(uint32_t input_nr, std::shared_ptr<TensorHook> hook) {
    mutable_hooks().tensor_pre.emplace_back(input_nr, std::move(hook));
  }
  void add_pre_hook(std::unique_ptr<FunctionPreHook> hook) {
    mutable_hooks().pre.push_back(std::move(hook));
  }
  void add_post_hook(std::unique_ptr<FunctionPostHook> hook) {
    mutable_hooks().post.push_back(std::move(hook));
  }
  const std::vector<std::pair<uint32_t, std::shared_ptr<TensorHook>>>& tensor_pre_hooks() const {
    return hooks().tensor_pre;
  }
  const std::vector<std::unique_ptr<FunctionPreHook>>& pre_hooks() const { return hooks().pre; }
  const std::vector<std::unique_ptr<FunctionPostHook>>& post_hooks() const { return hooks().post; }

  // Note [Node thread safety].
  FastMutex& mutex() const { return mutex_; }

  // Bytes this Node was charged to a budget (Note [Nodes on the budget]); 0 if none.
  int64_t charged_bytes() const { return charged_; }

 private:
  friend void DeleteNode(Node* node);
  friend class NodeCharge;

  // A Node's hooks, made when the first is added. Most Nodes have none; three empty vectors in
  // every Node would make each 72 bytes bigger, and a backward over Nodes too big for the
  // cache slower (Note [Nodes on the budget]).
  struct Hooks {
    std::vector<std::pair<uint32_t, std::shared_ptr<TensorHook>>> tensor_pre;
    std::vector<std::unique_ptr<FunctionPreHook>> pre;
    std::vector<std::unique_ptr<FunctionPostHook>> post;
  };
  static inline const Hooks kNoHooks{};
  const Hooks& hooks() const { return hooks_ != nullptr ? *hooks_ : kNoHooks; }
  Hooks& mutable_hooks() {
    if (hooks_ == nullptr) hooks_ = std::make_unique<Hooks>();
    return *hooks_;
  }

  // Charges bytes more to budget_, if any (Note [Nodes on the budget]); throws
  // RESOURCE_EXHAUSTED over the limit, charging nothing.
  void Charge(int64_t bytes);

  const uint64_t sequence_nr_;
  uint64_t topological_nr_ = 0;
  EdgeList next_edges_;
  // Inline for the one input most Nodes have (an op's one output): no heap block of its own.
  absl::InlinedVector<InputMetadata, 1> input_metadata_;
  Stream stream_;                               // stream(): the first input's stream that is one
  std::shared_ptr<const NodeLabeler> labeler_;  // null: no label
  int64_t label_key_ = 0;
  std::unique_ptr<Hooks> hooks_;  // null: none
  mutable FastMutex mutex_;
  // Note [Nodes on the budget]: the budget charged (null: none) and how much. Set while the
  // Node is built, on one thread. A plain pointer: the charge keeps the budget alive (Note [A
  // budget outlives its charges]).
  MemoryBudget* budget_ = nullptr;
  int64_t charged_ = 0;
};

// Charges a Node's estimate to the current budget before the Node is made, and hands the charge
// to it (Note [Nodes on the budget]); gives it back if the Node never gets it.
class NodeCharge {
 public:
  // Charges node_bytes to the budget current on this thread, if any; throws
  // RESOURCE_EXHAUSTED over its limit. Inline, as MakeNode is.
  explicit NodeCharge(int64_t node_bytes) {
    const std::shared_ptr<MemoryBudget>& budget = CurrentMemoryBudget();
    if (budget == nullptr) return;
    budget->Charge(node_bytes);
    budget_ = budget.get();
    bytes_ = node_bytes;
  }
  ~NodeCharge() {
    if (budget_ != nullptr) budget_->Release(bytes_);
  }
  NodeCharge(const NodeCharge&) = delete;
  NodeCharge& operator=(const NodeCharge&) = delete;

  // The Node now holds the charge, and gives it back when destroyed.
  void HandTo(Node& node) {
    node.budget_ = std::exchange(budget_, nullptr);
    node.charged_ = std::exchange(bytes_, 0);
  }

 private:
  MemoryBudget* budget_ = nullptr;  // charged bytes_, which keep it alive
  int64_t bytes_ = 0;
};

// Deletes a Node, unlinking chains of Nodes that die with it without recursion
// (Note [Tearing down long chains]).
void DeleteNode(Node* node);

// Makes a Node of type T owned by a shared_ptr whose deleter is DeleteNode. Every Node must be
// made this way. Charges the Node to the current budget first (Note [Nodes on the budget]):
// throws RESOURCE_EXHAUSTED over its limit.
template <typename T, typename... Args>
std::shared_ptr<T> MakeNode(Args&&... args) {
  NodeCharge charge(static_cast<int64_t>(sizeof(T)) + kNodeOverheadBytes);
  std::shared_ptr<T> node(new T(std::forward<Args>(args)...), DeleteNode);
  charge.HandTo(*node);
  return node;
}

// The next sequence number on this thread (Note [Node numbering]).
uint64_t NextSequenceNr();

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_NODE_H_
