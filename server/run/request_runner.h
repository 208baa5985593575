// Runs one GradRequest on the engine: converts it, records the graph, runs its backward calls
// and fills the response. The service runs it on gRPC's thread (inline) or on an engine worker.
//
// Note [Teardown after the reply]
// Once the response is filled, what the request made is garbage: the recorded graph with its
// tensors and Nodes, and the graph the thread may keep for its next request (Note [Reusing a
// validated graph]). Freeing it takes a few thousand instructions for a small request (6.9k of
// a grad_tiny call's 157k on the server) and, for a big one, giving back the memory of every
// large tensor. None of it needs to happen before the client has its answer, so a RequestRunner
// holds it and the service destroys the RequestRunner after handing the response to gRPC. On the
// worker pool that takes it off the latency path: Finish (or a streamed call's first StartWrite)
// called on a worker sends the bytes before it returns (measured: a 1 ms sleep after job.done, with
// workers to spare, left the p50 where it was), and the worker frees the rest while they
// travel. Inline it does not: gRPC sends an inline call's response only once the handler
// returns (a 1 ms sleep after FinishNow added over 1 ms to the p50), so there the teardown is
// still on the path; freeing it later, in a reactor's OnDone, was tried and cost more than it
// saved (docs/benchmarks.md, "Tried and dropped: freeing the request after the response").
// The accounting (counters, log line, admission) ends before Finish, so a client that reads
// the counters after its answer sees its call counted. Nothing a RequestRunner holds points into
// the call's messages: leaf tensors own their bytes (copied from a unary request, or adopting
// a streamed request's chunks), so the reactor may be gone by the time it is destroyed.

#ifndef GRADSERVE_SERVER_RUN_REQUEST_RUNNER_H_
#define GRADSERVE_SERVER_RUN_REQUEST_RUNNER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/autograd/cancellation.h"
#include "engine/graph/interpreter.h"
#include "engine/tensor/memory_budget.h"
#include "gradserve/v1/gradserve.pb.h"
#include "server/run/graph_cache.h"
#include "server/shared_memory/registry.h"
#include "server/wire/chunked_request.h"
#include "server/wire/wire.h"

namespace gradserve::server {

// One request's run, and what it leaves to free (Note [Teardown after the reply]).
//
// Thread safety: make, run and destroy a RequestRunner on one thread: the graph it may keep goes to
// that thread's cache.
class RequestRunner {
 public:
  RequestRunner();
  // Frees the recorded graph and gives the thread's kept graph back to its cache.
  ~RequestRunner();

  RequestRunner(const RequestRunner&) = delete;
  RequestRunner& operator=(const RequestRunner&) = delete;

  // Runs request; call it at most once. Blocks until the request is done. `cancel` (never
  // null) stops the work between ops and between nodes when the call is cancelled or its
  // deadline passes. `admitted` is when the server accepted the call, for the timings. On
  // success fills *response (calls, values, timings, num_nodes); on failure returns the status
  // for the client (every code of DESIGN.md section 5; never throws) and *response holds at
  // least num_nodes when the graph was recorded. For a streamed call (Note [Tensor bytes left
  // in the chunks]): chunked, if not null, is the request that request was parsed from (see
  // FromProto); it is cleared once the engine's tensors are made, which frees the chunks
  // nothing adopted. deferred, if not null, takes the bytes of big tensors of the response
  // (see ToProto). For a unary call: op_records, if not null, are the records of request's
  // ops as it carried them (UnaryMessages::op_records), for the graph cache (Note [Reusing a
  // validated graph]); they must stay alive while Run runs.
  absl::Status Run(const v1::GradRequest& request, const graph::Limits& limits,
                   const std::shared_ptr<autograd::CancellationToken>& cancel, absl::Time admitted,
                   v1::GradResponse* response, ChunkedRequest* chunked = nullptr,
                   ChunkedResponse* deferred = nullptr, const std::string* op_records = nullptr);

  // Runs request's graph forward as Run does (no backward calls), and keeps the recorded
  // graph for TakeRecorded: the forward pass of a session (server/session). The graph cache
  // is not used: the graph outlives the runner.
  absl::Status RunForward(const v1::GradRequest& request, const graph::Limits& limits,
                          const std::shared_ptr<autograd::CancellationToken>& cancel,
                          absl::Time admitted, v1::GradResponse* response);
  // The graph RunForward recorded (null if it failed), now the caller's. Its memory stays
  // charged to the budget that was current when it was recorded until it is freed.
  std::unique_ptr<graph::RecordedGraph> TakeRecorded();
  // Runs calls.calls (calls.graph is ignored) over g, a graph recorded earlier, stopped by
  // cancel (Note [A held graph's token]), and fills response's calls and timings. The caller
  // runs no other call on g meanwhile. Errors as Run's.
  absl::Status RunBackward(graph::RecordedGraph& g, const v1::GradRequest& calls,
                           const graph::Limits& limits,
                           const std::shared_ptr<autograd::CancellationToken>& cancel,
                           absl::Time admitted, v1::GradResponse* response);

  // Converts extension's graph and runs it over g, a graph recorded earlier (Note [Extending a
  // recorded graph] in engine/graph/interpreter.h), stopped by cancel; its leaves and what it
  // records are charged to g's budget. Fills response's values (extension.return_values, which
  // may name any of g's values), num_nodes (the extension's) and timings. extension's calls
  // are ignored. The caller runs no other call on g meanwhile. Errors as Run's.
  absl::Status RunExtend(graph::RecordedGraph& g, const v1::GradRequest& extension,
                         const graph::Limits& limits,
                         const std::shared_ptr<autograd::CancellationToken>& cancel,
                         absl::Time admitted, v1::GradResponse* response);

  // Charges bytes more of the response (its serialized form) to the request's memory budget,
  // or to fallback if the request recorded nothing, until the runner is destroyed (Note
  // [Budgets within a budget]). Run already charged the tensors it copied into the response
  // (ToProtoNewBytes: a deferred tensor is charged once, by its own storage).
  // RESOURCE_EXHAUSTED naming the limit it would pass.
  absl::Status ReserveResponse(int64_t bytes, const std::shared_ptr<MemoryBudget>& fallback);

  // The calling tenant's shared-memory regions, which the request's tensors and gradient
  // destinations may name (Note [Shared-memory regions]); null (the default) allows none.
  // Call before Run and the others; regions must outlive the runner's calls.
  void set_regions(RequestRegions* regions) { regions_ = regions; }

 private:
  absl::Status RunOrThrow(const v1::GradRequest& request, const graph::Limits& limits,
                          const std::shared_ptr<autograd::CancellationToken>& cancel,
                          absl::Time admitted, v1::GradResponse* response, ChunkedRequest* chunked,
                          ChunkedResponse* deferred, const std::string* op_records, bool held);
  // Copies the values of g that names name into response->values, in order, charging them to
  // the response (ReserveResponse, falling back to g's budget). INVALID_ARGUMENT naming a name g
  // has no value for.
  absl::Status ReturnValues(const graph::RecordedGraph& g,
                            const google::protobuf::RepeatedPtrField<std::string>& names,
                            v1::GradResponse* response, ChunkedResponse* deferred);
  // Runs calls over g, in order, into out_calls, charging their gradients to the response.
  // cancel, if not null, replaces g's token (Note [A held graph's token]).
  // destinations (per call, possibly fewer than calls) send gradients to shared memory.
  absl::Status RunCalls(graph::RecordedGraph& g, const std::vector<graph::BackwardCall>& calls,
                        const std::vector<Destinations>& destinations,
                        const std::shared_ptr<autograd::CancellationToken>& cancel,
                        google::protobuf::RepeatedPtrField<v1::CallResult>* out_calls,
                        ChunkedResponse* deferred);

  // Declared before recorded_, so that it outlives it: the lease keeps the graph only once
  // nothing recorded from it is alive.
  std::optional<GraphLease> lease_;
  std::unique_ptr<graph::RecordedGraph> recorded_;
  // The response's bytes: the tensors copied into it, and its serialized form.
  std::optional<MemoryReservation> response_memory_;
  RequestRegions* regions_ = nullptr;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_RUN_REQUEST_RUNNER_H_
