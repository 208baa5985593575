// The graph a thread last validated, kept so that a request with the same graph and new leaf
// values skips building and checking it again.
//
// Note [Reusing a validated graph]
// Clients send one graph again and again with new leaf values: one request per training step,
// per sample, per parameter update. For a small graph, building the engine's Graph from the
// wire (every op's names and attributes) and checking it (graph::Validate) were about a tenth of
// what the server spends on the whole request (docs/benchmarks.md). So each thread that runs
// requests keeps the last small graph it validated, with the value slots Validate returned for
// it. A request whose graph has its structure (SameStructure in server/wire/wire.h: the same leaf
// names and flags, the same ops with the same names, attributes and flags) takes it: only the
// leaves' values are built from the wire, into it, and checked (ValidateLeafValues), and it is
// recorded with the kept slots (RecordedGraph::RecordValidated), and FromProto's census does not
// check its names against max_name_bytes again (they are the kept graph's, checked under the
// same limits). Everything Validate's verdict depends on is compared, under the same limits,
// and the one thing that is not compared, the leaves' values, is checked again, so a request
// gets the same errors and the same gradients from a reused graph as from a new one.
//
// The ops are most of that comparison (about 2.5k of the 3k instructions of a ten-op graph),
// and a client that repeats a graph repeats its ops' bytes (Note [Ops parsed once] in
// server/wire/unary_messages.h). So the cache also keeps the op records of the request the kept
// graph was last taken by, when the request's parse knew them: records whose parse is the
// kept graph's ops, or ops SameStructure found equal to them. A request whose op records are
// byte for byte those is compared on the rest alone (inputs, outputs, leaf names and flags,
// the op count), since equal bytes parse to equal ops; any other request is compared whole.
//
// Ownership: a request takes the graph out of its thread's cache (a GraphLease) and gives it
// back when it ends, so two requests never share one. It is kept only if nothing else holds it
// by then (no Node of its backward still alive elsewhere), because its leaves are written on
// the next reuse.
//
// Bounds: one graph per thread; kept only without checkpoint bodies, with at most kMaxOps ops,
// and at most kMaxStructureBytes in its strings (names, op names, string attributes; each
// counted with its std::string object) and its list attributes. With the ops' fixed size and
// the slots, a kept graph takes under about 0.2 MiB, and its op records at most the 8 KiB of
// a request that is split (UnaryMessages::kMaxReusedBytes). Its leaves' values are dropped
// before it is kept, so no client data outlives its request.

#ifndef GRADSERVE_SERVER_RUN_GRAPH_CACHE_H_
#define GRADSERVE_SERVER_RUN_GRAPH_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/autograd/cancellation.h"
#include "engine/graph/graph.h"
#include "engine/graph/interpreter.h"
#include "engine/graph/value_slots.h"
#include "gradserve/v1/gradserve.pb.h"

namespace gradserve::server {

// One request's use of its thread's kept graph (Note [Reusing a validated graph]).
//
// Thread safety: a lease is made, used and destroyed on one thread; each thread has its own
// cache.
class GraphLease {
 public:
  // Graphs larger than these are not kept.
  static constexpr int64_t kMaxOps = 256;
  static constexpr int64_t kMaxStructureBytes = int64_t{64} << 10;

  // Takes the thread's kept graph if wire has its structure and it was validated under limits.
  // A disabled lease neither takes nor keeps anything. op_records, if not null, are the
  // serialized records of wire's ops as the request carried them (UnaryMessages::op_records);
  // they must stay alive until Record returns.
  GraphLease(const v1::Graph& wire, const graph::Limits& limits, bool enabled = true,
             const std::string* op_records = nullptr);
  // Keeps the recorded graph for the thread's next request, if it qualifies (see above).
  ~GraphLease();

  GraphLease(const GraphLease&) = delete;
  GraphLease& operator=(const GraphLease&) = delete;

  // The kept graph to build the request into (FromProto's same_structure), or null.
  const std::shared_ptr<graph::Graph>& reusable() const { return reused_; }

  // Records graph, FromProto's result: with the kept slots if it is the reusable() one
  // (RecordedGraph::RecordValidated), else validating it (RecordedGraph::Record). Once this
  // succeeded, the destructor may keep graph. Call it at most once. keep_only, budget and
  // elementwise_chains are Record's (engine/graph/interpreter.h).
  absl::StatusOr<std::unique_ptr<graph::RecordedGraph>> Record(
      std::shared_ptr<graph::Graph> graph, std::shared_ptr<autograd::CancellationToken> cancel,
      const std::vector<absl::string_view>* keep_only = nullptr,
      std::shared_ptr<MemoryBudget> budget = nullptr, bool elementwise_chains = false);

 private:
  const graph::Limits limits_;
  const bool enabled_;
  std::shared_ptr<graph::Graph> reused_;
  std::shared_ptr<const graph::ValueSlots> reused_slots_;
  // What Record recorded, to keep at the end.
  std::shared_ptr<graph::Graph> recorded_;
  std::shared_ptr<const graph::ValueSlots> recorded_slots_;
  // The request's op records, until Record; null if unknown.
  const std::string* op_records_;
  // The op records to keep with the graph, if known: taken from the cache with a graph they
  // belong to, or copied from the request by Record.
  std::string kept_op_records_;
  bool kept_op_records_known_ = false;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_RUN_GRAPH_CACHE_H_
