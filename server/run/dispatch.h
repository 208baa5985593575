// Where a unary grad request runs: inline on gRPC's callback thread, or on the WorkerPool.
//
// Note [Inline or pool]
// Handing a request to the WorkerPool costs a mutex wake-up, a context switch and, on the
// worker, gRPC's Finish and ExecCtx flush that an inline handler leaves to the thread already
// in gRPC: several times the work of recording and differentiating a graph of a few small
// tensors (docs/benchmarks.md, "Where the time goes"). So the unary path runs a request on
// the callback thread when a cheap, conservative estimate of its work, read from the request
// before anything is converted or allocated, is small:
//
//   cost = items * passes * max(kMinElementsPerItem, extent^rank) + request bytes
//
// where items counts the leaves, ops, return values and the calls' roots, inputs and seeds
// (each is at most a few visits of one tensor), passes is 1 (the forward) plus the backward
// calls, extent is the largest dimension of any leaf or seed, and rank the largest rank. The
// request's serialized size bounds what scales with the bytes sent rather than with the
// shapes (names, tensor contents that do not match their shapes, which validation reads
// before it refuses them). The estimate only accepts requests it can bound:
// - every op is elementwise (broadcasting), a reduction, detach or hook (kInlineOps). Such an
//   op's output has at most the largest rank of its inputs and no extent larger than theirs,
//   so no tensor of the request, gradients included, has more than extent^rank elements;
//   ops that take shapes from attributes (expand, reshape, ...), matmul, conv2d and the NN
//   ops are left to the pool;
// - no sub-graphs (checkpoint, grad) and no create_graph: reentrant backward and recorded
//   backward graphs could grow the work beyond the count of items;
// - every tensor on the CPU: a device's work would make gRPC's thread wait on another thread.
// A request whose cost is at most ServerOptions::max_inline_cost (--max_inline_cost) runs
// inline. The default keeps inline work to a fraction of a millisecond, so gRPC's threads are
// never held for long: on the 2-CPU benchmark VM, requests near it (10 ops on [512] tensors,
// a chain of 120 ops on [8] ones) took about 0.1 and 0.35 ms; grad_tiny costs 2062 (1792 for
// its graph, 270 bytes). 0 sends every request to the pool. Anything malformed the estimate
// does not understand (negative sizes, overflow) goes to the pool, whose validation answers
// with the usual status: the estimate never decides an answer, only the thread.
//
// Both paths do the same bookkeeping (GradService::Run): admission before, then the token
// with the call's deadline, counters, the log line and releasing admission. One difference
// is gRPC's: it delivers OnCancel only after the method handler returns, so a client's cancel
// cannot interrupt inline work (bounded by the cost above); the deadline does, through the
// token. Streamed requests are large by nature and always use the pool.

#ifndef GRADSERVE_SERVER_RUN_DISPATCH_H_
#define GRADSERVE_SERVER_RUN_DISPATCH_H_

#include <cstdint>

#include "gradserve/v1/gradserve.pb.h"

namespace gradserve::server {

// Below this a tensor's elements cost less than the per-item overhead (a node, a few small
// allocations); each item counts at least this much.
inline constexpr int64_t kMinElementsPerItem = 64;

// Returned by EstimateInlineCost for a request the estimate cannot bound.
inline constexpr int64_t kUnboundedCost = INT64_MAX;

// Note [Inline or pool]: the estimated cost of request, whose serialized size is
// request_bytes, or kUnboundedCost. Cheap: reads names, shapes and counts; looks at no
// tensor data.
int64_t EstimateInlineCost(const v1::GradRequest& request, int64_t request_bytes);

// True if request (request_bytes serialized) should run inline on gRPC's thread under a
// limit of max_inline_cost.
bool RunsInline(const v1::GradRequest& request, int64_t request_bytes, int64_t max_inline_cost);

// Note [Inline or pool], for a session's Backward call (Note [Session calls inline] in
// server/service/session_calls.cc): the estimated cost of calls, request_bytes serialized, over
// a held graph whose cost per pass is pass_cost (EstimateInlineCost of the Forward that recorded
// it, without calls), or kUnboundedCost. Each call is one pass over the graph, plus its own
// roots, inputs and seeds; create_graph, a seed off the CPU or an unbounded pass_cost is
// unbounded.
int64_t EstimateBackwardCost(int64_t pass_cost,
                             const google::protobuf::RepeatedPtrField<v1::BackwardCall>& calls,
                             int64_t request_bytes);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_RUN_DISPATCH_H_
