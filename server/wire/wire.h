// Translation between gradserve.v1 messages and the engine's structures.
//
// Note [Validate before allocating]
// A request is checked in two passes. The first (the census) reads only the proto: every
// string of the client's (the request id, names, string attributes, devices) within
// max_name_bytes (Note [Quoting client strings] in engine/util/quote.h), counts of ops,
// leaves, calls and nesting against the limits, and for every tensor its dtype, its shape
// (overflow-checked), its byte or value count, its device, and the sum of all tensors' bytes
// against the per-request memory limit. Only when all of that passes does the second pass
// allocate tensors and build the graph. So no request, however malformed, makes the server
// allocate more than the limits allow. Ops, names and attributes are the interpreter's to
// check (graph::Validate, run by RecordedGraph::Record).

#ifndef GRADSERVE_SERVER_WIRE_WIRE_H_
#define GRADSERVE_SERVER_WIRE_WIRE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/graph/graph.h"
#include "engine/graph/interpreter.h"
#include "engine/tensor/tensor.h"
#include "gradserve/v1/gradserve.pb.h"
#include "server/shared_memory/registry.h"
#include "server/wire/chunked_request.h"

namespace gradserve::server {

// Where a call writes one gradient instead of the response (BackwardCall.gradient_destinations,
// Note [Shared-memory regions]): a range, checked to lie within its region.
struct GradientDestination {
  const SharedMemoryRegion* region = nullptr;  // held by the request's RequestRegions
  int64_t offset = 0;
  int64_t byte_size = 0;
};
// A call's destinations, by input name.
using Destinations = absl::flat_hash_map<std::string, GradientDestination>;

// A request in the engine's terms.
struct EngineRequest {
  std::shared_ptr<graph::Graph> graph;  // never null
  std::vector<graph::BackwardCall> calls;
  // Per call, where its gradients go instead of the response; empty when no call has any.
  std::vector<Destinations> destinations;
};

// Where a request's tensors' bytes may be besides the message itself.
struct TensorSources {
  // The streamed request the message was parsed from (Note [Tensor bytes left in the chunks]).
  const ChunkedRequest* chunked = nullptr;
  // The calling tenant's shared-memory regions (Note [Shared-memory regions]); null: none.
  RequestRegions* regions = nullptr;
};

// Checks the request against limits (Note [Validate before allocating]), then builds the graph
// and calls. chunked, if not null, is the streamed request that request was parsed from, which
// holds the bytes of its big tensors (Note [Tensor bytes left in the chunks]); tensors may
// adopt them. same_structure, if not null, is a graph without checkpoint bodies for which
// SameStructure(request.graph(), *same_structure) holds, and which nothing else uses: its
// leaves take the request's values and it becomes the result's graph, instead of a new one
// (Note [Reusing a validated graph] in server/run/graph_cache.h). Errors: INVALID_ARGUMENT for
// malformed content, RESOURCE_EXHAUSTED past a limit; each message names the leaf, op, call or
// seed and the field involved. regions, if not null, are the calling tenant's shared-memory
// regions, which tensors' values and gradient destinations may name (Note [Shared-memory
// regions]); it must outlive the result. Ranges are INVALID_ARGUMENT when outside their region
// or naming one not registered, PERMISSION_DENIED when naming another tenant's.
absl::StatusOr<EngineRequest> FromProto(const v1::GradRequest& request, const graph::Limits& limits,
                                        const ChunkedRequest* chunked = nullptr,
                                        std::shared_ptr<graph::Graph> same_structure = nullptr,
                                        RequestRegions* regions = nullptr);

// Whether FromProto would build, from wire, a graph equal to built in everything but its leaves'
// values: the same leaf names and requires_grad flags, and the same ops, with the same names,
// attributes (floats compared bit for bit) and no_grad flags, and the same bodies. So Validate's
// verdict on built holds for that graph, but for its leaves' values (ValidateLeafValues).
// compare_ops false skips the comparison of the ops (their count still counts): for a caller
// that knows wire's ops to be the very ones built was made from, or ones equal to them
// (Note [Reusing a validated graph] in server/run/graph_cache.h).
bool SameStructure(const v1::Graph& wire, const graph::Graph& built, bool compare_ops = true);

// Copies a tensor (any device, any layout) into a wire tensor with raw bytes. An undefined
// tensor leaves out untouched. With deferred (a streamed response), the bytes of a big tensor
// are not copied into out but left to deferred, which writes them into the outgoing chunks
// (Note [Tensor bytes left in the chunks]). Throws StatusError if the device copy fails.
void ToProto(const Tensor& tensor, v1::Tensor* out, ChunkedResponse* deferred = nullptr);

// The bytes that ToProto(tensor, ..., deferred) makes beside tensor's own: none when deferred
// takes tensor itself (a contiguous CPU tensor big enough to defer), whose storage is charged
// already; else tensor's size, in a copy or in out's data.
int64_t ToProtoNewBytes(const Tensor& tensor, const ChunkedResponse* deferred);

// Writes tensor (any device, any layout) into destination's range and describes it in out:
// dtype, shape, device, and the range as its contents. An undefined tensor leaves out untouched.
// INVALID_ARGUMENT, `what` first, when the tensor's size is not the range's or the region was
// shrunk under it (Note [A region shrunk under the server]).
absl::Status ToSharedMemory(const Tensor& tensor, const GradientDestination& destination,
                            absl::string_view what, v1::Tensor* out);

// Conversions between the two dtype enums; FromProto's is nullopt for values outside
// float32, float64, int64 and bool.
std::optional<DType> FromProto(v1::DType dtype);
v1::DType ToProto(DType dtype);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_WIRE_H_
