#include "server/run/dispatch.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace gradserve::server {
namespace {

// A name of at most 8 bytes as one integer, its bytes in order from the lowest; 0 for an empty
// name, a longer one, or one with a NUL byte (which would pack as a shorter name). Inline ops are
// compared by it: a hash set's lookup (hashing, probing, a string compare) was about 150
// instructions for each op of every request.
constexpr uint64_t PackName(std::string_view name) {
  if (name.empty() || name.size() > 8) return 0;
  uint64_t packed = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '\0') return 0;
    packed |= uint64_t{static_cast<unsigned char>(name[i])} << (8 * i);
  }
  return packed;
}

// Note [Inline or pool]: ops whose outputs are no larger than the broadcast of their inputs. A
// switch over the packed names: the compiler makes it a handful of integer comparisons.
bool IsInlineOp(const std::string& name) {
  switch (PackName(name)) {
    // elementwise, broadcasting
    case PackName("add"):
    case PackName("sub"):
    case PackName("mul"):
    case PackName("div"):
    case PackName("pow"):
    case PackName("where"):
    case PackName("neg"):
    case PackName("abs"):
    case PackName("sign"):
    case PackName("exp"):
    case PackName("log"):
    case PackName("sqrt"):
    case PackName("rsqrt"):
    case PackName("sin"):
    case PackName("cos"):
    case PackName("tanh"):
    case PackName("sigmoid"):
    case PackName("relu"):
    case PackName("gelu"):
    case PackName("softplus"):
    case PackName("clamp"):
    // reductions
    case PackName("sum"):
    case PackName("mean"):
    case PackName("amax"):
    // graph-level, no larger than their input
    case PackName("detach"):
    case PackName("hook"):
      return true;
    default:  // and 0, the packing of a name no inline op has
      return false;
  }
}

// a * b, or kUnboundedCost if that is larger than kUnboundedCost. a, b >= 0.
int64_t CappedMul(int64_t a, int64_t b) {
  if (a != 0 && b > kUnboundedCost / a) return kUnboundedCost;
  return a * b;
}

// The largest extent and rank of the tensors seen so far; false once one is not on the CPU
// or has a negative size.
struct ShapeBound {
  int64_t extent = 1;
  int64_t rank = 0;

  bool Add(const v1::Tensor& t) {
    if (!t.device().empty() && t.device() != "cpu") return false;
    for (int64_t size : t.shape()) {
      if (size < 0) return false;
      extent = std::max(extent, size);
    }
    rank = std::max<int64_t>(rank, t.shape_size());
    return true;
  }

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t i = 0; i < rank; ++i) n = CappedMul(n, extent);
    return n;
  }
};

// a + b, or kUnboundedCost if that is larger than kUnboundedCost. a, b >= 0.
int64_t CappedAdd(int64_t a, int64_t b) { return a > kUnboundedCost - b ? kUnboundedCost : a + b; }

// Adds the calls' roots, inputs and seeds to *items and their seeds' shapes to *bound; false if
// a call cannot be bounded (create_graph, a seed off the CPU or with a negative size).
bool AddCalls(const google::protobuf::RepeatedPtrField<v1::BackwardCall>& calls, ShapeBound* bound,
              int64_t* items) {
  for (const v1::BackwardCall& call : calls) {
    if (call.create_graph()) return false;
    *items += call.roots_size() + call.inputs_size() + static_cast<int64_t>(call.seeds_size());
    for (const auto& [name, seed] : call.seeds()) {
      if (!bound->Add(seed)) return false;
    }
  }
  return true;
}

}  // namespace

int64_t EstimateInlineCost(const v1::GradRequest& request, int64_t request_bytes) {
  if (request_bytes < 0) return kUnboundedCost;
  const v1::Graph& graph = request.graph();
  ShapeBound bound;
  int64_t items = graph.leaves_size() + graph.ops_size() + request.return_values_size();
  for (const v1::Leaf& leaf : graph.leaves()) {
    if (!bound.Add(leaf.value())) return kUnboundedCost;
  }
  for (const v1::Op& op : graph.ops()) {
    if (!IsInlineOp(op.op()) || op.has_body()) return kUnboundedCost;
  }
  if (!AddCalls(request.calls(), &bound, &items)) return kUnboundedCost;
  const int64_t passes = 1 + request.calls_size();
  const int64_t work =
      CappedMul(CappedMul(items, passes), std::max(kMinElementsPerItem, bound.elements()));
  return CappedAdd(work, request_bytes);
}

int64_t EstimateBackwardCost(int64_t pass_cost,
                             const google::protobuf::RepeatedPtrField<v1::BackwardCall>& calls,
                             int64_t request_bytes) {
  if (pass_cost < 0 || pass_cost == kUnboundedCost || request_bytes < 0) return kUnboundedCost;
  ShapeBound bound;
  int64_t items = 0;
  if (!AddCalls(calls, &bound, &items)) return kUnboundedCost;
  const int64_t passes = CappedMul(pass_cost, calls.size());
  const int64_t own = CappedMul(items, std::max(kMinElementsPerItem, bound.elements()));
  return CappedAdd(CappedAdd(passes, own), request_bytes);
}

bool RunsInline(const v1::GradRequest& request, int64_t request_bytes, int64_t max_inline_cost) {
  if (max_inline_cost <= 0) return false;
  const int64_t cost = EstimateInlineCost(request, request_bytes);
  return cost != kUnboundedCost && cost <= max_inline_cost;
}

}  // namespace gradserve::server
