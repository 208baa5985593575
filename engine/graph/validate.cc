// graph::Validate: every check on a Graph that needs no tensor computation (interpreter.h).

#include <algorithm>
#include <memory>
#include <string>
#include <variant>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/graph/diagnostics.h"
#include "engine/graph/graph_level_ops.h"
#include "engine/graph/hooks.h"
#include "engine/graph/interpreter.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::graph {
namespace {

using ops::AttrType;

// Whether an attribute of type `got` is accepted where the schema wants `want`: exactly, or by
// the widenings ops::Attrs's getters allow (int as float, int as int list, ints as floats,
// string as string list).
bool AttrTypeAccepts(AttrType want, AttrType got) {
  if (want == got) return true;
  switch (want) {
    case AttrType::kFloat:
      return got == AttrType::kInt;
    case AttrType::kInts:
      return got == AttrType::kInt;
    case AttrType::kFloats:
      return got == AttrType::kInts;
    case AttrType::kStrings:
      return got == AttrType::kString;
    default:
      return false;
  }
}

// "input, other" or "no inputs". The names are the schema's, not the client's.
std::string NameList(const std::vector<std::string>& names, const char* none) {
  return names.empty() ? std::string(none) : absl::StrJoin(names, ", ");
}

class Validator {
 public:
  explicit Validator(const Limits& limits) : limits_(limits) {}

  // Counts from what an extension extends (ValidateExtension).
  void StartFrom(const ValueSlots& extended) {
    num_ops_ = extended.num_ops;
    num_leaves_ = extended.num_leaves;
  }
  // Records the counts in slots, the top level's, once its graph is checked.
  void CountInto(ValueSlots& slots) const {
    slots.num_ops = num_ops_;
    slots.num_leaves = num_leaves_;
  }

  // Fills slots.last_reads for graph, the top level just checked (Note [Values freed after
  // their last use] in interpreter.h).
  void LastReadsInto(const Graph& graph, ValueSlots& slots) const {
    const int64_t first_output = static_cast<int64_t>(graph.leaves.size());
    std::vector<int64_t> last(static_cast<size_t>(slots.num_values - first_output), -1);
    size_t read = 0;
    int64_t slot = first_output;
    for (size_t i = 0; i < graph.ops.size(); ++i) {
      for (; read < top_read_ends_[i]; ++read) {
        const int64_t from = slots.reads[read];
        if (from >= first_output)
          last[static_cast<size_t>(from - first_output)] = static_cast<int64_t>(i);
      }
      // An op's outputs are read only by later ops, which move their entry on.
      for (size_t k = 0; k < graph.ops[i].outputs.size(); ++k, ++slot) {
        last[static_cast<size_t>(slot - first_output)] = static_cast<int64_t>(i);
      }
    }
    slots.last_reads.reserve(last.size());
    for (size_t k = 0; k < last.size(); ++k) {
      slots.last_reads.emplace_back(last[k], first_output + static_cast<int64_t>(k));
    }
    std::stable_sort(slots.last_reads.begin(), slots.last_reads.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }

  // Checks one graph whose ops are named within `scope` (Note [Naming ops in errors]); depth
  // is how many checkpoint bodies enclose it. Fills slots, which must be empty, with the
  // graph's slots.
  absl::Status CheckGraph(const Graph& graph, const std::string& scope, int64_t depth,
                          ValueSlots& slots) {
    const bool is_body = depth > 0;
    if (!is_body && !graph.inputs.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the graph declares input ", Quote(graph.inputs[0]),
                       ", but only checkpoint bodies have formal inputs"));
    }
    for (size_t i = 0; i < graph.inputs.size(); ++i) {
      if (absl::Status s = Define(graph.inputs[i], slots); !s.ok()) {
        return WithContext(s, absl::StrCat(scope, "input #", i, " ", Quote(graph.inputs[i])));
      }
    }
    for (size_t i = 0; i < graph.leaves.size(); ++i) {
      const Leaf& leaf = graph.leaves[i];
      if (absl::Status s = CheckLeaf(leaf, slots); !s.ok()) {
        return WithContext(s, LeafContext(scope, i, leaf));
      }
    }
    for (size_t i = 0; i < graph.ops.size(); ++i) {
      const Op& op = graph.ops[i];
      if (++num_ops_ > limits_.max_ops) {
        return absl::ResourceExhaustedError(
            absl::StrCat(DescribeOp(scope, i, op), ": the graph has more than ", limits_.max_ops,
                         " ops (sub-graphs included), over the limit max_ops"));
      }
      if (absl::Status s = CheckOp(op, depth, graph.inputs.size() + graph.leaves.size(), slots);
          !s.ok()) {
        return WithContext(s, DescribeOp(scope, i, op));
      }
      if (!is_body) top_read_ends_.push_back(slots.reads.size());
      if (op.body != nullptr) {
        if (depth + 1 > limits_.max_nesting) {
          return absl::ResourceExhaustedError(
              absl::StrCat(DescribeOp(scope, i, op), ": checkpoint bodies are nested more than ",
                           limits_.max_nesting, " deep, over the limit max_nesting"));
        }
        auto body_slots = std::make_unique<ValueSlots>();
        // Errors from the body name their op by its full path.
        if (absl::Status s = CheckGraph(*op.body, BodyScope(scope, i, op), depth + 1, *body_slots);
            !s.ok()) {
          return s;
        }
        slots.writes_in_place |= body_slots->writes_in_place;
        slots.bodies.emplace(op.body.get(), std::move(body_slots));
      }
      for (const std::string& output : op.outputs) {
        if (absl::Status s = Define(output, slots); !s.ok()) {
          return WithContext(s, DescribeOp(scope, i, op));
        }
      }
    }
    for (const std::string& output : graph.outputs) {
      auto it = slots.by_name.find(output);
      if (it == slots.by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            scope, is_body ? "body" : "graph", " output ", Quote(output), " is not defined"));
      }
      slots.results.push_back(it->second);
    }
    return absl::OkStatus();
  }

  // The checks of CheckLeafValue on every leaf of graph and of the bodies its ops hold, in
  // CheckGraph's order and with its errors (ValidateLeafValues).
  absl::Status CheckLeafValues(const Graph& graph, const std::string& scope) {
    for (size_t i = 0; i < graph.leaves.size(); ++i) {
      if (absl::Status s = CheckLeafValue(graph.leaves[i]); !s.ok()) {
        return WithContext(s, LeafContext(scope, i, graph.leaves[i]));
      }
    }
    for (size_t i = 0; i < graph.ops.size(); ++i) {
      const Op& op = graph.ops[i];
      if (op.body == nullptr) continue;
      if (absl::Status s = CheckLeafValues(*op.body, BodyScope(scope, i, op)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  static std::string LeafContext(const std::string& scope, size_t index, const Leaf& leaf) {
    return absl::StrCat(scope, "leaf #", index, " ", Quote(leaf.name));
  }

  // INVALID_ARGUMENT if s, a client's string that `what` introduces ("value name "), is longer
  // than max_name_bytes (Note [Quoting client strings]).
  absl::Status CheckLength(absl::string_view what, absl::string_view s) const {
    if (static_cast<int64_t>(s.size()) <= limits_.max_name_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, Quote(s), " is longer than the limit of ",
                                                   limits_.max_name_bytes,
                                                   " bytes (max_name_bytes)"));
  }

  // Gives name the next slot. by_name views the graph being checked, which outlives its check
  // (a map of copies cost a tenth of validating a small request).
  absl::Status Define(const std::string& name, ValueSlots& slots) const {
    if (name.empty()) return absl::InvalidArgumentError("a value needs a non-empty name");
    if (absl::Status s = CheckLength("value name ", name); !s.ok()) return s;
    if (!slots.by_name.try_emplace(name, slots.num_values).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the name ", Quote(name), " is already defined (names must be unique)"));
    }
    ++slots.num_values;
    return absl::OkStatus();
  }

  // Appends the slot of a value an op reads to slots.reads; role and "is not defined before
  // use" make the error.
  absl::Status Read(const std::string& name, absl::string_view role, ValueSlots& slots) const {
    auto it = slots.by_name.find(name);
    if (it == slots.by_name.end()) {
      if (absl::Status s = CheckLength(role, name); !s.ok()) return s;
      return absl::InvalidArgumentError(
          absl::StrCat(role, Quote(name), " is not defined before use"));
    }
    slots.reads.push_back(it->second);
    return absl::OkStatus();
  }

  absl::Status CheckLeaf(const Leaf& leaf, ValueSlots& slots) {
    if (++num_leaves_ > limits_.max_leaves) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the graph has more than ", limits_.max_leaves, " leaves, over the limit max_leaves"));
    }
    if (absl::Status s = Define(leaf.name, slots); !s.ok()) return s;
    return CheckLeafValue(leaf);
  }

  // What CheckLeaf checks of the leaf's value: all that depends on it.
  absl::Status CheckLeafValue(const Leaf& leaf) {
    if (!leaf.value.defined()) return absl::InvalidArgumentError("the leaf has no tensor");
    if (leaf.requires_grad && !IsFloating(leaf.value.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requires_grad needs a floating dtype (float32, float64, float16 or bfloat16), got ",
          DTypeName(leaf.value.dtype())));
    }
    if (leaf.value.numel() > limits_.max_tensor_elements) {
      return absl::ResourceExhaustedError(absl::StrCat(
          leaf.value.DebugString(), " has ", leaf.value.numel(), " elements, over the limit of ",
          limits_.max_tensor_elements, " (max_tensor_elements)"));
    }
    leaf_bytes_ += static_cast<int64_t>(leaf.value.nbytes());
    if (leaf_bytes_ > limits_.max_memory_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the leaves take ", leaf_bytes_, " bytes, over the limit of ",
                       limits_.max_memory_bytes, " (max_memory_bytes)"));
    }
    return absl::OkStatus();
  }

  // The checks of one op that need nothing but the op and the names defined before it; records
  // what the op reads in slots. The graph's first `given` slots are its formal inputs and
  // leaves.
  absl::Status CheckOp(const Op& op, int64_t depth, size_t given, ValueSlots& slots) const {
    if (absl::Status s = CheckLength("op name ", op.op); !s.ok()) return s;
    const ops::OpSchema* schema = FindOpSchema(op.op);
    if (schema == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown op ", Quote(op.op)));
    }
    slots.schemas.push_back(schema);
    const bool is_checkpoint = op.op == kCheckpointOp;
    if (depth > 0 && op.op == kGradOp) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.op, " is not allowed inside a checkpoint body (the body runs without history); ",
          "apply it outside the checkpoint"));
    }
    // Note [Hooks in checkpoint bodies] (interpreter.cc): only on a value the body computes.
    if (depth > 0 && op.op == kHookOp && op.inputs.size() == 1) {
      auto it = slots.by_name.find(op.inputs[0]);
      if (it != slots.by_name.end() && static_cast<size_t>(it->second) < given) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a hook inside a checkpoint body must be on a value an op of the body computes, not "
            "on its input or leaf ",
            Quote(op.inputs[0]), "; hook the checkpoint's input outside the checkpoint"));
      }
    }
    // Note [Graph values]: an in-place op inside a checkpoint body writes only values the body
    // computes. Its formal inputs are the caller's values, which the body's first run (without
    // history) would change under the recomputation, and its leaves persist across runs.
    if (depth > 0 && schema->in_place && !op.inputs.empty()) {
      auto it = slots.by_name.find(op.inputs[0]);
      if (it != slots.by_name.end() && static_cast<size_t>(it->second) < given) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an in-place op inside a checkpoint body must write a value an op of the body "
            "computes, not its input or leaf ",
            Quote(op.inputs[0]), "; write into a copy, or outside the checkpoint"));
      }
    }
    if (schema->in_place) slots.writes_in_place = true;
    if (is_checkpoint != (op.body != nullptr)) {
      return absl::InvalidArgumentError(is_checkpoint ? "checkpoint needs a body"
                                                      : "only checkpoint takes a body");
    }
    if (absl::Status s = CheckInputs(op, *schema, slots); !s.ok()) return s;
    if (absl::Status s = CheckAttrs(op, *schema); !s.ok()) return s;
    if (absl::Status s = CheckGraphLevelOp(op, slots); !s.ok()) return s;

    size_t num_outputs = static_cast<size_t>(schema->num_outputs);
    if (op.op == kGradOp) num_outputs = op.attrs.GetStrings("wrt").size();
    if (is_checkpoint) num_outputs = op.body->outputs.size();
    // An in-place op may leave its output unnamed (Note [Graph values]).
    const bool unnamed_in_place = schema->in_place && op.outputs.empty();
    if (op.outputs.size() != num_outputs && !unnamed_in_place) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.op, " produces ", num_outputs, " output(s), but the op names ", op.outputs.size()));
    }
    return absl::OkStatus();
  }

  absl::Status CheckInputs(const Op& op, const ops::OpSchema& schema, ValueSlots& slots) const {
    const size_t n = op.inputs.size();
    if (op.op == kCheckpointOp) {
      if (n != op.body->inputs.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the body takes ", op.body->inputs.size(), " input(s), got ", n));
      }
    } else if (schema.variadic) {
      if (n == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(op.op, " takes one or more inputs (", schema.input_names[0], "), got 0"));
      }
    } else {
      const size_t max = schema.input_names.size();
      const size_t min = max - static_cast<size_t>(schema.optional_inputs);
      if (n < min || n > max) {
        return absl::InvalidArgumentError(absl::StrCat(
            op.op, " takes ", min == max ? absl::StrCat(max) : absl::StrCat(min, " to ", max),
            " input(s) (", NameList(schema.input_names, "none"), "), got ", n));
      }
    }
    for (const std::string& input : op.inputs) {
      if (absl::Status s = Read(input, "input ", slots); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status CheckAttrs(const Op& op, const ops::OpSchema& schema) const {
    for (const auto& [name, value] : op.attrs.values()) {
      if (absl::Status s = CheckAttrLengths(name, value); !s.ok()) return s;
      const ops::AttrSpec* spec = nullptr;
      for (const ops::AttrSpec& s : schema.attrs) {
        if (s.name == name) spec = &s;
      }
      if (spec == nullptr) {
        std::vector<std::string> known;
        for (const ops::AttrSpec& s : schema.attrs) known.push_back(s.name);
        return absl::InvalidArgumentError(absl::StrCat("unknown attribute ", Quote(name), " (",
                                                       op.op, " takes ",
                                                       NameList(known, "no attributes"), ")"));
      }
      const bool keyword = !spec->keywords.empty() && ops::TypeOf(value) == AttrType::kString;
      if (keyword ? !absl::c_linear_search(spec->keywords, std::get<std::string>(value))
                  : !AttrTypeAccepts(spec->type, ops::TypeOf(value))) {
        std::string want = ops::AttrTypeName(spec->type);
        if (!spec->keywords.empty()) {
          absl::StrAppend(&want, " or one of '", absl::StrJoin(spec->keywords, "', '"), "'");
        }
        const std::string got =
            keyword ? Quote(std::get<std::string>(value)) : ops::AttrTypeName(ops::TypeOf(value));
        return absl::InvalidArgumentError(
            absl::StrCat("attribute ", Quote(name), " must be ", want, ", got ", got));
      }
      if (spec->type == AttrType::kInts && (name == "shape" || name == "size")) {
        if (absl::Status s = CheckShapeAttr(name, op.attrs.GetInts(name)); !s.ok()) return s;
      }
    }
    for (const ops::AttrSpec& spec : schema.attrs) {
      if (spec.required && !op.attrs.has(spec.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("missing required attribute '", spec.name, "'"));
      }
    }
    return absl::OkStatus();
  }

  // The attribute's name and its strings within max_name_bytes.
  absl::Status CheckAttrLengths(const std::string& name, const ops::AttrValue& value) const {
    if (absl::Status s = CheckLength("attribute name ", name); !s.ok()) return s;
    const std::string what = absl::StrCat("attribute ", Quote(name), ": string ");
    if (const auto* s = std::get_if<std::string>(&value)) return CheckLength(what, *s);
    if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
      for (const std::string& s : *list) {
        if (absl::Status status = CheckLength(what, s); !status.ok()) return status;
      }
    }
    return absl::OkStatus();
  }

  // A shape given as an attribute (reshape's shape, expand's size): sizes of at least -1 (-1:
  // inferred or kept) whose product neither overflows nor passes max_tensor_elements. Checked
  // here so that no op is asked to allocate it.
  absl::Status CheckShapeAttr(const std::string& name, const std::vector<int64_t>& sizes) const {
    Shape known;
    for (int64_t size : sizes) {
      if (size < -1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "attribute '", name, "' ", ShapeToString(sizes), " has a negative dimension ", size));
      }
      if (size >= 0) known.push_back(size);
    }
    absl::StatusOr<int64_t> numel = CheckedNumel(known);
    if (!numel.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute '", name, "' ", ShapeToString(sizes), ": the number of elements overflows"));
    }
    if (*numel > limits_.max_tensor_elements) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "attribute '", name, "' ", ShapeToString(sizes), " has ", *numel,
          " elements, over the limit of ", limits_.max_tensor_elements, " (max_tensor_elements)"));
    }
    return absl::OkStatus();
  }

  // The checks particular to grad and hook: values named in attributes (their slots recorded),
  // and hook parameters.
  absl::Status CheckGraphLevelOp(const Op& op, ValueSlots& slots) const {
    if (op.op == kHookOp) {
      try {
        MakeGradientHook(op.attrs);
      } catch (const StatusError& e) {
        return e.status();
      }
      return absl::OkStatus();
    }
    if (op.op != kGradOp) return absl::OkStatus();
    const std::vector<std::string> wrt = op.attrs.GetStrings("wrt");
    if (wrt.empty()) return absl::InvalidArgumentError("attribute 'wrt' names no value");
    for (const std::string& name : wrt) {
      if (absl::Status s = Read(name, "attribute 'wrt': value ", slots); !s.ok()) return s;
    }
    const std::vector<std::string> seeds = op.attrs.GetStrings("grad_outputs", {});
    if (!op.attrs.has("grad_outputs")) return absl::OkStatus();
    if (seeds.size() != op.inputs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute 'grad_outputs' names ", seeds.size(), " value(s) for ",
                       op.inputs.size(), " root(s); give one per root ('' for ones)"));
    }
    for (const std::string& name : seeds) {
      if (name.empty()) {
        slots.reads.push_back(ValueSlots::kNoSlot);
      } else if (absl::Status s = Read(name, "attribute 'grad_outputs': value ", slots); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  const Limits& limits_;
  // The end of each top-level op's reads in the top level's slots.reads, in op order.
  std::vector<size_t> top_read_ends_;
  int64_t num_ops_ = 0;
  int64_t num_leaves_ = 0;
  int64_t leaf_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<const ValueSlots>> Validate(const Graph& graph,
                                                           const Limits& limits) {
  auto slots = std::make_unique<ValueSlots>();
  Validator validator(limits);
  if (absl::Status s = validator.CheckGraph(graph, "", 0, *slots); !s.ok()) return s;
  validator.CountInto(*slots);
  validator.LastReadsInto(graph, *slots);
  return slots;
}

absl::StatusOr<std::unique_ptr<const ValueSlots>> ValidateExtension(const Graph& extension,
                                                                    const ValueSlots& extended,
                                                                    const Limits& limits) {
  auto slots = std::make_unique<ValueSlots>();
  slots->by_name = extended.by_name;
  slots->num_values = extended.num_values;
  Validator validator(limits);
  validator.StartFrom(extended);
  if (absl::Status s = validator.CheckGraph(extension, "", 0, *slots); !s.ok()) return s;
  validator.CountInto(*slots);
  return slots;
}

absl::Status ValidateLeafValues(const Graph& graph, const Limits& limits) {
  return Validator(limits).CheckLeafValues(graph, "");
}

}  // namespace gradserve::graph
