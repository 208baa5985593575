// Runs one GradRequest on the engine: converts it, records the graph, runs its backward calls
// and fills the response. The service's reactors call it from an engine worker thread.

#ifndef GRADSERVE_SERVER_REQUEST_RUNNER_H_
#define GRADSERVE_SERVER_REQUEST_RUNNER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/autograd/cancellation.h"
#include "engine/graph/interpreter.h"
#include "gradserve/v1/gradserve.pb.h"
#include "server/chunked_request.h"

namespace gradserve::server {

// Blocks until the request is done. `cancel` (never null) stops the work between ops and
// between nodes when the call is cancelled or its deadline passes. `admitted` is when the
// server accepted the call, for the timings. On success fills *response (calls, values,
// timings, num_nodes); on failure returns the status for the client (every code of DESIGN.md
// section 5; never throws) and *response holds at least num_nodes when the graph was recorded.
// For a streamed call (Note [Tensor bytes left in the chunks]): chunked, if not null, is the
// request that request was parsed from (see FromProto); it is cleared once the engine's tensors
// are made, which frees the chunks nothing adopted. deferred, if not null, takes the bytes of
// big tensors of the response (see ToProto).
absl::Status RunGradRequest(const v1::GradRequest& request, const graph::Limits& limits,
                            const std::shared_ptr<autograd::CancellationToken>& cancel,
                            absl::Time admitted, v1::GradResponse* response,
                            ChunkedRequest* chunked = nullptr, ChunkedResponse* deferred = nullptr);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_REQUEST_RUNNER_H_
