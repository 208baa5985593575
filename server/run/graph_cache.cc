// GraphLease and the per-thread cache behind it (graph_cache.h).

#include "server/run/graph_cache.h"

#include <atomic>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "server/base/per_thread.h"
#include "server/wire/wire.h"

namespace gradserve::server {
namespace {

// What one thread keeps (Note [Reusing a validated graph]).
struct Kept {
  std::shared_ptr<graph::Graph> graph;  // null: nothing kept
  std::shared_ptr<const graph::ValueSlots> slots;
  graph::Limits limits;
  // The op records of the request that took graph last, if its parse knew them: the records
  // graph's ops were built from, or ones that parse to ops SameStructure found equal to them.
  std::string op_records;
  bool op_records_known = false;
};

// A string's bytes, the object's included: what many short names cost.
int64_t StringBytes(const std::string& s) { return static_cast<int64_t>(sizeof(s) + s.size()); }

int64_t StringsBytes(const std::vector<std::string>& strings) {
  int64_t bytes = 0;
  for (const std::string& s : strings) bytes += StringBytes(s);
  return bytes;
}

// The bytes an attribute's value holds beyond its variant.
int64_t ValueBytes(const ops::AttrValue& value) {
  return std::visit(
      [](const auto& v) -> int64_t {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return static_cast<int64_t>(v.size());
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          return StringsBytes(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<double>>) {
          return static_cast<int64_t>(v.size() * sizeof(v[0]));
        } else {
          return 0;
        }
      },
      value);
}

// Whether a validated graph is one to keep: small, and without checkpoint bodies (whose leaves
// FromProto does not rebuild into a reused graph).
bool Qualifies(const graph::Graph& g) {
  if (!g.inputs.empty() || !g.outputs.empty() ||
      static_cast<int64_t>(g.ops.size()) > GraphLease::kMaxOps) {
    return false;
  }
  int64_t bytes = 0;
  for (const graph::Leaf& leaf : g.leaves) bytes += StringBytes(leaf.name);
  for (const graph::Op& op : g.ops) {
    if (op.body != nullptr) return false;
    bytes += StringBytes(op.op) + StringsBytes(op.inputs) + StringsBytes(op.outputs);
    // Validate held each op to its schema's attributes, so there are few of them.
    for (const auto& [name, value] : op.attrs.values()) {
      bytes += StringBytes(name) + ValueBytes(value);
    }
  }
  return bytes <= GraphLease::kMaxStructureBytes;
}

}  // namespace

GraphLease::GraphLease(const v1::Graph& wire, const graph::Limits& limits, bool enabled,
                       const std::string* op_records)
    : limits_(limits), enabled_(enabled), op_records_(op_records) {
  if (!enabled_) return;
  Kept* kept = PerThread<Kept>::Get();
  if (kept == nullptr || kept->graph == nullptr || !(kept->limits == limits)) return;
  // Equal bytes parse to equal ops (Note [Reusing a validated graph]).
  const bool same_ops =
      op_records != nullptr && kept->op_records_known && *op_records == kept->op_records;
  if (!SameStructure(wire, *kept->graph, /*compare_ops=*/!same_ops)) return;
  reused_ = std::move(kept->graph);
  reused_slots_ = std::move(kept->slots);
  if (same_ops) {
    kept_op_records_.swap(kept->op_records);
    kept_op_records_known_ = true;
  }
  kept->op_records_known = false;
}

absl::StatusOr<std::unique_ptr<graph::RecordedGraph>> GraphLease::Record(
    std::shared_ptr<graph::Graph> graph, std::shared_ptr<autograd::CancellationToken> cancel,
    const std::vector<absl::string_view>* keep_only, std::shared_ptr<MemoryBudget> budget,
    bool elementwise_chains) {
  const bool reusing = reused_ != nullptr && graph == reused_;
  absl::StatusOr<std::unique_ptr<graph::RecordedGraph>> recorded =
      reusing
          ? graph::RecordedGraph::RecordValidated(graph, reused_slots_, limits_, std::move(cancel),
                                                  keep_only, std::move(budget), elementwise_chains)
          : graph::RecordedGraph::Record(graph, limits_, std::move(cancel), keep_only,
                                         std::move(budget), elementwise_chains);
  if (recorded.ok() && enabled_ && (reusing || Qualifies(*graph))) {
    recorded_ = std::move(graph);
    recorded_slots_ = (*recorded)->slots();
  } else if (reusing && !recorded.ok()) {
    // What failed depends on the leaves' values; Validate's verdict on the rest stands.
    recorded_ = std::move(graph);
    recorded_slots_ = reused_slots_;
  }
  if (recorded_ != nullptr && !kept_op_records_known_ && op_records_ != nullptr) {
    kept_op_records_ = *op_records_;
    kept_op_records_known_ = true;
  }
  op_records_ = nullptr;
  return recorded;
}

GraphLease::~GraphLease() {
  reused_.reset();
  reused_slots_.reset();
  if (recorded_ == nullptr) return;
  // A Node that another thread released last published its writes with that release; the
  // fence makes them visible before the leaves are written below.
  if (recorded_.use_count() != 1) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  Kept* kept = PerThread<Kept>::Get();
  if (kept == nullptr) return;
  for (graph::Leaf& leaf : recorded_->leaves) leaf.value = Tensor();
  kept->graph = std::move(recorded_);
  kept->slots = std::move(recorded_slots_);
  kept->limits = limits_;
  kept->op_records.swap(kept_op_records_);
  kept->op_records_known = kept_op_records_known_;
}

}  // namespace gradserve::server
