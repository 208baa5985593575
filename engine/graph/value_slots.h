// ValueSlots: a validated graph's value names resolved to indices, and its ops to their
// schemas, once.
//
// Note [Value slots]
// The interpreter keeps a graph's values in a vector indexed by slot, not in a map from names.
// Validate, which must look every name up anyway to check that it is defined before use, gives
// each value a slot and writes down the slot of every name an op reads; running the graph then
// hashes no name. Slots follow definition order: the graph's formal inputs, then its leaves,
// then each op's outputs in op order. So an op's outputs need no table (they take the next
// slots), and only what ops read is recorded, as one sequence in op order: for each op its
// inputs, then, for a grad op, its `wrt` values and, when given, its `grad_outputs` values
// (kNoSlot for '', ones). A checkpoint body has slots of its own, as it has names of its own.
// Looking names up and binding them by name, in the interpreter alone, was about 4% of a small
// request's server instructions. Validate looks each op's schema up too, and keeps it, so the
// interpreter need not find it again by name.

#ifndef GRADSERVE_ENGINE_GRAPH_VALUE_SLOTS_H_
#define GRADSERVE_ENGINE_GRAPH_VALUE_SLOTS_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "engine/graph/graph.h"
#include "engine/ops/op_registry.h"

namespace gradserve::graph {

struct ValueSlots {
  static constexpr int64_t kNoSlot = -1;

  // Values the graph defines: formal inputs, leaves and op outputs. For an extension
  // (ValidateExtension), the values it extends are the first slots and are counted here too.
  int64_t num_values = 0;
  // Ops and leaves, those of checkpoint bodies included, and, for an extension, those of the
  // graph it extends: what max_ops and max_leaves bound.
  int64_t num_ops = 0;
  int64_t num_leaves = 0;
  // What the ops read, in op order (Note [Value slots]).
  std::vector<int64_t> reads;
  // The slots of graph.outputs (checkpoint bodies).
  std::vector<int64_t> results;
  // Each op's schema (FindOpSchema), in op order. Graph-level ops' schemas have no `run`.
  std::vector<const ops::OpSchema*> schemas;
  // Every name's slot; an extension's holds the names it extends too. The keys view the
  // graph's strings (and the extended graphs'): they must outlive this.
  absl::flat_hash_map<absl::string_view, int64_t> by_name;
  // Whether an op of the graph, or of a body it holds, writes in place (Note [Leaves written
  // in place] in interpreter.cc); for an extension, an op of the extension.
  bool writes_in_place = false;
  // Note [Values freed after their last use] (interpreter.h): (op index, slot) for each value
  // a top-level op computes, at the index of the last op that reads it (its own op's if none
  // does), in op order. Empty for checkpoint bodies and extensions.
  std::vector<std::pair<int64_t, int64_t>> last_reads;
  // The slots of each checkpoint body the graph's ops hold, by the body's address.
  absl::flat_hash_map<const Graph*, std::unique_ptr<const ValueSlots>> bodies;
};

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_VALUE_SLOTS_H_
