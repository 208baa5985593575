// The graph interpreter: validates a Graph, runs it forward recording the autograd graph, and
// runs backward calls over the result.

#ifndef GRADSERVE_ENGINE_GRAPH_INTERPRETER_H_
#define GRADSERVE_ENGINE_GRAPH_INTERPRETER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/autograd/cancellation.h"
#include "engine/graph/graph.h"
#include "engine/graph/value_slots.h"
#include "engine/tensor/memory_budget.h"

namespace gradserve::graph {

struct Program;  // interpreter.cc: what every run of a recorded graph's ops shares

// Limits a caller (the server) sets on what one request may ask for. Every one is checked
// before the work it bounds; passing one is RESOURCE_EXHAUSTED naming the limit
// (max_name_bytes: INVALID_ARGUMENT).
struct Limits {
  int64_t max_ops = 100'000;  // ops in the graph, sub-graphs included
  int64_t max_leaves = 10'000;
  int64_t max_tensor_elements = int64_t{1} << 28;  // any one tensor, leaf or computed
  int64_t max_memory_bytes = int64_t{4} << 30;     // all tensors of the request at once
  int64_t max_nesting = 128;                       // sub-graphs within sub-graphs
  int64_t max_backward_calls = 64;
  // Bytes of any one string the client names something with: value, leaf, op, hook and
  // attribute names, string attributes (Note [Quoting client strings] in engine/util/quote.h).
  // A longer one is malformed rather than big: INVALID_ARGUMENT naming the limit.
  int64_t max_name_bytes = 256;

  friend bool operator==(const Limits&, const Limits&) = default;
};

// Checks a graph without running it: names defined before use, unique and at most
// max_name_bytes long (string attributes too), ops known, input counts and attribute names per
// the op's schema, leaves' dtypes, shape products and element counts within limits. Errors
// are INVALID_ARGUMENT (RESOURCE_EXHAUSTED for limits) naming the op (its index and first
// output) and the value. Returns the graph's value slots (Note [Value slots]), which view
// graph's names: graph must outlive them.
absl::StatusOr<std::unique_ptr<const ValueSlots>> Validate(const Graph& graph,
                                                           const Limits& limits);

// Validate's checks of the leaves' values alone, those of checkpoint bodies included: each has
// a tensor, a floating dtype where it requires grad, and its elements and all leaves' bytes
// within limits. Errors are Validate's. Validate runs them too; they are all of it that a
// graph whose leaves alone changed needs again (Note [Reusing a validated graph] in
// server/run/graph_cache.h).
absl::Status ValidateLeafValues(const Graph& graph, const Limits& limits);

// Validate for extension, a top-level graph whose ops may also read the values that extended
// (a recorded graph's slots, RecordedGraph::Extend) names: its names must differ from those,
// and max_ops and max_leaves bound both together. The slots returned hold extended's names
// too, and view its keys: what they view must outlive them.
absl::StatusOr<std::unique_ptr<const ValueSlots>> ValidateExtension(const Graph& extension,
                                                                    const ValueSlots& extended,
                                                                    const Limits& limits);

// Note [Values freed after their last use]
// The interpreter holds a graph's values by slot (Note [Value slots]), and it used to hold
// every one of them until the recorded graph went, while most are read only by the next op or
// two: the autograd graph keeps what a backward needs (its Nodes' saved tensors and edges),
// and PyTorch frees the rest as the Python names that hold them go. A request's tensors, all
// charged to its budget (max_memory_bytes), therefore peaked at the sum of its values where
// PyTorch's peak is the saved tensors and a few in flight: a chain of scalar products of a
// 4 MiB tensor held 4 MiB more per link. Validate writes down the last op that reads each
// value an op computes (ValueSlots::last_reads), and Record, given the names that a one-shot
// request's calls and return values use (keep_only), drops every other computed value after
// the op that reads it last, once the request's budget holds 1 MiB (below that the memory is
// no matter, and a ten-op request would pay about 1.4k instructions for it; its values go with
// the graph, as before). A leaf is never dropped. Dropping is a reference gone, no more: a
// Node that saved the tensor, or a view of it, keeps its bytes. A graph that a session holds
// keeps every value (its later calls and extensions may name any), and so does a graph that
// writes in place, whose destructor must reach every value's history to break the cycles such
// writes make (Note [Cycles through in-place writes] in interpreter.cc). A dropped value is
// undefined in the graph from then on, as an unreached gradient is: a call that names one is
// refused (INVALID_ARGUMENT), and Value() returns it undefined.

// The budget a request's tensors are charged to: limits.max_memory_bytes within the budget
// current on the calling thread (Note [Budgets within a budget]), refusing any tensor over
// limits.max_tensor_elements before it is allocated. Record makes one unless it is given one;
// a caller that builds the graph's leaves itself makes it first, so that they count too.
std::shared_ptr<MemoryBudget> RequestBudget(const Limits& limits);

// A graph run forward in grad mode, holding its autograd graph.
//
// Thread safety: Backward calls may run at once on different threads when each retains the
// graph (Jacobian rows); results do not depend on their order. Anything else is serialized by
// the caller.
class RecordedGraph {
 public:
  // Validates, then runs the forward pass. cancel, if given, is checked between ops and, being
  // current on the thread, inside long kernels (Note [Stopping a running op]); it is passed
  // to every backward. The memory of all tensors is charged to one budget of
  // limits.max_memory_bytes, which also refuses any tensor over limits.max_tensor_elements
  // before it is allocated (Note [Tensors over max_tensor_elements]).
  // The recorded Nodes share graph for their labels (Note [Node labels]).
  // With keep_only, the values that none of its names name are dropped after their last read
  // (Note [Values freed after their last use]); names that are no value are ignored.
  // budget, if given, is RequestBudget(limits), made by the caller (above).
  // elementwise_chains, with keep_only, lets runs of elementwise ops whose values keep_only
  // does not name run as one (Note [Elementwise chains] in engine/ops/elementwise.h): the
  // caller's promise that at most one backward call will run, without create_graph or anomaly
  // mode.
  static absl::StatusOr<std::unique_ptr<RecordedGraph>> Record(
      std::shared_ptr<const Graph> graph, const Limits& limits,
      std::shared_ptr<CancellationToken> cancel = nullptr,
      const std::vector<absl::string_view>* keep_only = nullptr,
      std::shared_ptr<MemoryBudget> budget = nullptr, bool elementwise_chains = false);
  // The same on a copy of graph.
  static absl::StatusOr<std::unique_ptr<RecordedGraph>> Record(
      const Graph& graph, const Limits& limits,
      std::shared_ptr<CancellationToken> cancel = nullptr);
  // Record for a graph that passed Validate(*graph, limits), which returned slots, and whose
  // leaves' values alone may have been replaced since: checks only those (ValidateLeafValues),
  // then runs the forward pass as Record does. Giving slots of another graph, or limits other
  // than those Validate passed it with, is a programming error (Note [Reusing a validated
  // graph] in server/run/graph_cache.h).
  static absl::StatusOr<std::unique_ptr<RecordedGraph>> RecordValidated(
      std::shared_ptr<const Graph> graph, std::shared_ptr<const ValueSlots> slots,
      const Limits& limits, std::shared_ptr<CancellationToken> cancel = nullptr,
      const std::vector<absl::string_view>* keep_only = nullptr,
      std::shared_ptr<MemoryBudget> budget = nullptr, bool elementwise_chains = false);

  // Frees the saved tensors of a graph that wrote in place (Note [Cycles through in-place
  // writes] in interpreter.cc).
  ~RecordedGraph();

  // Runs one backward call.
  absl::StatusOr<CallResult> Backward(const BackwardCall& call);
  // The caller's promise that it runs one call (Backward, Extend) at a time on this graph, and
  // that no other graph shares its Nodes, as the server's requests and sessions do: each
  // backward then runs its Nodes without their locks (autograd::BackwardOptions::sole_pass).
  // Without it, Backward calls that retain the graph may run at once (see above).
  void PromiseOneCallAtATime() { one_call_at_a_time_ = true; }
  // The same, stopped by cancel instead of the token Record was given, which stays its token
  // from then on: for a graph held across calls (the server's sessions).
  //
  // Note [A held graph's token]
  // A graph recorded for one call and run over by later ones (server/session) must stop when
  // the later call is cancelled or passes its deadline, not the call that recorded it: each
  // backward call installs its own token, for the engine and for the checkpoint bodies it
  // recomputes (Program::cancel). So this overload writes shared state: the caller runs no
  // other call on the graph meanwhile.
  absl::StatusOr<CallResult> Backward(const BackwardCall& call,
                                      std::shared_ptr<CancellationToken> cancel);

  // Note [Extending a recorded graph]
  // A session's client may look at the outputs of its forward pass and only then write the
  // rest (a loss chosen from the outputs), as a PyTorch program goes on after a print. Extend
  // runs more ops after the recorded ones, as if they had come at the end of the graph: they
  // read any value recorded so far by name, define new names (a name already defined is
  // INVALID_ARGUMENT, as within one graph), may have leaves of their own, and record their
  // Nodes into the same autograd graph, so a later Backward may start from their values and
  // reach every earlier one. The extension is validated against every name defined so far
  // (ValidateExtension); its tensors and Nodes are charged to the graph's own budget, the one
  // Record made, within its limits, and max_ops and max_leaves bound the graph with all its
  // extensions. Values share one slot vector: an extension's values take the slots after the
  // last ones (Note [Value slots]). An extension that fails leaves the graph as it was (its
  // values, leaves and checkpoint bodies are dropped), except in one case: if it wrote a
  // recorded value in place before failing, that write cannot be undone (as in PyTorch, where
  // a failed line's earlier in-place write stays) and a graph half extended is no graph a
  // client described; from then on the graph refuses every call with FAILED_PRECONDITION,
  // and keeps what the extension made until it is freed.

  // Runs extension's ops after the ones recorded (Note [Extending a recorded graph]), stopped
  // by cancel, which becomes the graph's token (Note [A held graph's token]). Returns the
  // number of Nodes its ops recorded. Errors: ValidateExtension's, then those of running ops
  // as Record's; FAILED_PRECONDITION on a graph an earlier failed extension spoiled. The
  // caller runs no other call on the graph meanwhile.
  absl::StatusOr<int64_t> Extend(std::shared_ptr<const Graph> extension,
                                 std::shared_ptr<CancellationToken> cancel);

  // A forward value by name; NOT_FOUND if no value has that name. Undefined for a value
  // dropped after its last use (Note [Values freed after their last use]) and for an unreached
  // gradient of a grad op.
  absl::StatusOr<Tensor> Value(absl::string_view name) const;

  // Nodes recorded by the forward pass.
  int64_t num_nodes() const { return num_nodes_; }
  // The graph's value slots, as Validate returned them (Note [Value slots]); those of its
  // extensions are not among them.
  const std::shared_ptr<const ValueSlots>& slots() const { return slots_; }
  const std::shared_ptr<MemoryBudget>& budget() const { return budget_; }

 private:
  RecordedGraph() = default;
  friend class Interpreter;

  // One Extend that succeeded: the graph as validated, its slots, and its first slot.
  struct Extension {
    std::shared_ptr<const Graph> graph;
    std::shared_ptr<const ValueSlots> slots;
    int64_t first_slot = 0;
  };
  // Every name's slot: the latest extension's slots, or slots_.
  const ValueSlots& AllSlots() const {
    return extensions_.empty() ? *slots_ : *extensions_.back().slots;
  }

  // The graph as validated, and its values by slot (Note [Value slots]); the top level has no
  // formal inputs, so its leaves are the first slots.
  std::shared_ptr<const Graph> graph_;
  std::shared_ptr<const ValueSlots> slots_;
  std::vector<Tensor> values_;
  std::shared_ptr<MemoryBudget> budget_;
  std::shared_ptr<CancellationToken> cancel_;
  std::shared_ptr<Program> program_;
  Limits limits_;
  int64_t num_nodes_ = 0;
  // Note [Extending a recorded graph]: the extensions in order.
  std::vector<Extension> extensions_;
  // Whether an op of the graph or of an extension wrote in place (Note [Cycles through
  // in-place writes] in interpreter.cc).
  bool writes_in_place_ = false;
  // PromiseOneCallAtATime was called.
  bool one_call_at_a_time_ = false;
  // Set when a failed extension had written in place; the status every call then returns, and
  // what that extension made, kept alive for the Nodes that may still refer to it.
  absl::Status spoiled_;
  std::vector<Extension> failed_;
};

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_INTERPRETER_H_
