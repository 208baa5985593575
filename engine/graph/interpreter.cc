// RecordedGraph: running a validated Graph forward and backward (interpreter.h).

#include "engine/graph/interpreter.h"

#include <algorithm>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/graph/checkpoint.h"
#include "engine/graph/diagnostics.h"
#include "engine/graph/grad_op.h"
#include "engine/graph/graph_level_ops.h"
#include "engine/graph/hooks.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/inplace.h"
#include "engine/ops/op_registry.h"
#include "engine/util/mutex.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::graph {

// What every run of a recorded graph's ops shares: the limits, the cancellation token and the
// checkpoint bodies' leaves. Built once by Record, immutable afterwards but for the token
// (Note [A held graph's token]), and shared (through the checkpoint Nodes' bodies) by every
// recomputation, on whatever thread it runs.
struct Program {
  struct Body {
    const ValueSlots* slots;  // owned by `slots` below
    TensorList leaves;        // in the body's order
    TensorList params;        // Note [Checkpoint]: leaves requiring grad, nested bodies' included
  };

  Limits limits;
  std::shared_ptr<CancellationToken> cancel;
  std::shared_ptr<const ValueSlots> slots;  // the top level's, holding every body's
  // The extensions' (Note [Extending a recorded graph]), holding their bodies'.
  std::vector<std::shared_ptr<const ValueSlots>> extension_slots;
  // Keyed by the body's address; the checkpoint Nodes hold the bodies alive.
  absl::flat_hash_map<const Graph*, Body> bodies;
};

namespace {

// A graph's values by slot (Note [Value slots]).
using Env = std::vector<Tensor>;

// Walks the slots of what a graph's ops read, in op order (Note [Value slots]).
class Reads {
 public:
  explicit Reads(const ValueSlots& slots) : next_(slots.reads.data()) {}
  int64_t Next() { return *next_++; }
  // What Next will return, not taken.
  int64_t Peek() const { return *next_; }

 private:
  const int64_t* next_;
};

// Note [Node labels]: the labels of the Nodes that the ops of one graph (the top level or a
// checkpoint body, in scope) record, made from the op when asked for.
class OpLabeler final : public autograd::NodeLabeler {
 public:
  OpLabeler(std::shared_ptr<const Graph> graph, std::string scope)
      : graph_(std::move(graph)), scope_(std::move(scope)) {}
  std::string Label(int64_t op_index) const override {
    return NodeLabel(scope_, op_index, graph_->ops[static_cast<size_t>(op_index)]);
  }

 private:
  const std::shared_ptr<const Graph> graph_;
  const std::string scope_;
};

// A leaf's value: a new handle on the client's data, so that marking it requires_grad and
// naming it never touch the tensor the caller passed in.
//
// Note [Leaves written in place]
// An in-place op writes into the elements of its self (Note [In-place ops] in
// engine/ops/inplace.h), and a leaf's elements are the caller's: the Graph the server caches
// and records again, the bytes of a received message. So when a graph writes in place
// anywhere (ValueSlots::writes_in_place), its top-level leaves' values are copies, charged to
// the request's budget like any tensor, and recording a graph twice gives the same values.
// Checkpoint bodies' leaves are never written (Validate refuses it).
Tensor MakeLeafValue(const Leaf& leaf, bool copy = false) {
  Tensor value = copy ? leaf.value.Clone() : leaf.value.detach();
  if (leaf.requires_grad) value.set_requires_grad(true);
  value.set_name(leaf.name);
  return value;
}

// Makes the leaves of every body reachable from graph's ops, nested bodies first; slots are
// graph's.
void PrepareBodies(const Graph& graph, const ValueSlots& slots, Program& program) {
  for (const Op& op : graph.ops) {
    if (op.body == nullptr || program.bodies.contains(op.body.get())) continue;
    const ValueSlots& body_slots = *slots.bodies.at(op.body.get());
    PrepareBodies(*op.body, body_slots, program);
    Program::Body body;
    body.slots = &body_slots;
    absl::flat_hash_set<const TensorImpl*> seen;
    auto add_param = [&](const Tensor& t) {
      if (seen.insert(t.impl()).second) body.params.push_back(t);
    };
    for (const Leaf& leaf : op.body->leaves) {
      body.leaves.push_back(MakeLeafValue(leaf));
      if (leaf.requires_grad) add_param(body.leaves.back());
    }
    for (const Op& inner : op.body->ops) {
      if (inner.body == nullptr) continue;
      for (const Tensor& t : program.bodies.at(inner.body.get()).params) add_param(t);
    }
    program.bodies.emplace(op.body.get(), std::move(body));
  }
}

// Removes from program the bodies that PrepareBodies made for a graph whose slots are slots,
// nested bodies included.
void ForgetBodies(const ValueSlots& slots, Program& program) {
  for (const auto& [body, body_slots] : slots.bodies) {
    ForgetBodies(*body_slots, program);
    program.bodies.erase(body);
  }
}

// Drops a top-level graph's values after their last read, but those named to be kept (Note
// [Values freed after their last use]). Only once the request holds kDropAboveBytes: below that
// the memory is no matter, and a small request's values go with its graph as before, sparing
// it the work (about 1.4k instructions of a ten-op request, callgrind). Used on the recording
// thread alone.
class ValueDropper {
 public:
  static constexpr int64_t kDropAboveBytes = int64_t{1} << 20;

  // slots, keep_only and budget (the request's) must outlive this. chains: whether the
  // values it drops may be left out altogether (Note [Elementwise chains] in
  // engine/ops/elementwise.h).
  ValueDropper(const ValueSlots& slots, const std::vector<absl::string_view>& keep_only,
               const MemoryBudget& budget, bool chains)
      : slots_(slots),
        keep_only_(keep_only),
        budget_(budget),
        chains_(chains),
        next_(slots.last_reads.begin()) {}

  bool chains() const { return chains_; }

  // After op i ran: drops the values it read last, unless kept.
  void AfterOp(int64_t i, Env& env) {
    const auto end = slots_.last_reads.end();
    if (next_ == end || next_->first != i) return;
    if (budget_.used() < kDropAboveBytes) {
      while (next_ != end && next_->first == i) ++next_;
      return;
    }
    MarkKept();
    for (; next_ != end && next_->first == i; ++next_) {
      const auto slot = static_cast<size_t>(next_->second);
      if (!kept_[slot]) env[slot] = Tensor();
    }
  }

  // Whether the value in slot is read last by op i, and not kept: AfterOp(i) drops it once the
  // budget holds kDropAboveBytes. i is the next op to run or the one after it.
  bool DropsAfter(int64_t i, int64_t slot) {
    MarkKept();
    if (kept_[static_cast<size_t>(slot)]) return false;
    for (auto it = next_; it != slots_.last_reads.end() && it->first <= i; ++it) {
      if (it->first == i && it->second == slot) return true;
    }
    return false;
  }

 private:
  void MarkKept() {
    if (!kept_.empty()) return;
    kept_.assign(static_cast<size_t>(slots_.num_values), false);
    for (absl::string_view name : keep_only_) {
      if (auto it = slots_.by_name.find(name); it != slots_.by_name.end()) {
        kept_[static_cast<size_t>(it->second)] = true;
      }
    }
  }

  const ValueSlots& slots_;
  const std::vector<absl::string_view>& keep_only_;
  const MemoryBudget& budget_;
  const bool chains_;
  std::vector<std::pair<int64_t, int64_t>>::const_iterator next_;
  std::vector<bool> kept_;  // by slot, made on the first drop
};

// Runs a graph's ops in order, reading and binding values in env, which holds the graph's
// inputs and leaves from slot `first` on (an extension's values follow those it extends: Note
// [Extending a recorded graph]); see RunOp for one op. scope names them (Note [Naming ops in
// errors]). Returns how many Nodes the ops recorded (new grad_fns of the values they defined).
// Throws StatusError naming the op. With dropper, drops values after their last read (Note
// [Values freed after their last use]); slots must then be a top level's.
int64_t RunOps(const std::shared_ptr<const Graph>& graph, const ValueSlots& slots,
               const std::string& scope, const std::shared_ptr<const Program>& program, Env& env,
               int64_t first = 0, ValueDropper* dropper = nullptr);

// Runs a checkpoint body on its inputs under the caller's grad mode: the CheckpointBody of the
// checkpoint op.
TensorList RunBody(const std::shared_ptr<const Graph>& body, const std::string& scope,
                   const std::shared_ptr<const Program>& program, const TensorList& inputs) {
  const Program::Body& prepared = program->bodies.at(body.get());
  Env env(static_cast<size_t>(prepared.slots->num_values));
  // Slots: the formal inputs, then the leaves.
  std::copy(inputs.begin(), inputs.end(), env.begin());
  std::copy(prepared.leaves.begin(), prepared.leaves.end(), env.begin() + inputs.size());
  RunOps(body, *prepared.slots, scope, program, env);
  TensorList outputs;
  outputs.reserve(prepared.slots->results.size());
  for (int64_t slot : prepared.slots->results) outputs.push_back(env[slot]);
  return outputs;
}

// The value in slot, which must be defined: only an unreached gradient of a grad op with
// allow_unused is not. role and name say what read it.
const Tensor& Lookup(const Env& env, int64_t slot, const char* role, const std::string& name) {
  const Tensor& value = env[static_cast<size_t>(slot)];
  GS_CHECK_ARG(value.defined(), role, " ", Quote(name),
               " has no value: it is the gradient of a value its grad op's roots do not reach "
               "(allow_unused); use materialize_grads to get zeros");
  return value;
}

// Runs one op with its schema, taking the slots of what it reads from reads, and binds its
// outputs in env from slot first_output on; the Nodes it records get their labels from
// labeler. Returns how many Nodes it labeled. A hook on a leaf keeps the leaf's AccumulateGrad
// alive in keep_alive, so that the ops after it, which find it through the leaf, share it and
// its hook (the leaf holds it weakly). The first given_slots slots of env hold the graph's
// formal inputs and leaves. inputs is the caller's list to fill with the op's inputs, kept
// from op to op so that its buffer is allocated once per graph, not once per op; the caller
// empties it after each op, so that it holds no value the dropper would free.
int64_t RunOp(const Op& op, const ops::OpSchema& schema, int64_t index, const std::string& scope,
              const std::shared_ptr<const Program>& program,
              const std::shared_ptr<const OpLabeler>& labeler, Reads& reads, int64_t first_output,
              int64_t given_slots, Env& env,
              std::vector<std::shared_ptr<autograd::Node>>& keep_alive, TensorList& inputs) {
  inputs.clear();
  for (const std::string& name : op.inputs) {
    inputs.push_back(Lookup(env, reads.Next(), "input", name));
  }

  autograd::GradModeGuard grad_mode(autograd::GradMode::is_enabled() && !op.no_grad);
  // Note [Tensors over max_tensor_elements]: a tensor over the limit is refused where the op
  // allocates it, naming these outputs.
  OutputNamesScope output_names(&op.outputs);
  TensorList outputs;
  if (schema.in_place && !scope.empty()) {
    // Note [Graph values]: a body writes only what it computes; a view (or a detached alias)
    // of that may still show the elements of the body's input or leaf, which Validate cannot
    // see. A view of what the body computed is written as anywhere (Note [Views written in
    // place]).
    for (int64_t slot = 0; slot < given_slots; ++slot) {
      const Tensor& given = env[static_cast<size_t>(slot)];
      GS_CHECK_ARG(!ops::SharesElements(given, inputs[0]), op.op,
                   ": an in-place op inside a checkpoint body must not write the elements of "
                   "the body's input or leaf (",
                   Quote(op.inputs[0]),
                   " shares them); write into a copy, or outside the checkpoint");
    }
  }
  if (schema.run) {
    outputs = schema.run(inputs, op.attrs);
  } else if (op.op == kGradOp) {
    TensorList wrt, seeds;
    for (const std::string& name : op.attrs.GetStrings("wrt")) {
      wrt.push_back(Lookup(env, reads.Next(), "wrt value", name));
    }
    for (const std::string& name : op.attrs.GetStrings("grad_outputs", {})) {
      const int64_t slot = reads.Next();
      seeds.push_back(slot == ValueSlots::kNoSlot ? Tensor()
                                                  : Lookup(env, slot, "grad_outputs value", name));
    }
    seeds.resize(inputs.size());
    outputs = RunGradOp(inputs, seeds, wrt, op.attrs, program->cancel);
  } else if (op.op == kCheckpointOp) {
    std::shared_ptr<const Graph> body = op.body;
    CheckpointBody run = [body, program,
                          body_scope = BodyScope(scope, index, op)](const TensorList& body_inputs) {
      return RunBody(body, body_scope, program, body_inputs);
    };
    outputs = Checkpoint(inputs, program->bodies.at(body.get()).params, std::move(run));
  } else if (op.op == kHookOp) {
    // Note [Hooks in checkpoint bodies]
    // A checkpoint body runs twice: forward without grad mode (its values have no history) and
    // again, recorded, when its checkpoint's backward recomputes it. A hook in the body
    // registers in the second run, on the recomputed value, so it changes the gradient that
    // flows through that value in the nested backward: what the same hook does in PyTorch
    // when the body runs inline (a checkpoint changes memory, not gradients). In the first
    // run it registers nothing. Validate allows such hooks only on values the body's ops
    // compute: a body's formal inputs stand for values outside it (a hook there would touch
    // only the body's share of their gradient, or be registered on the outer value once per
    // recomputation), and its leaves persist across runs. One difference remains under double
    // backward: a second-order gradient reaches a body value through each recomputation that
    // made it (the one the first-order gradient was built on, and the one the checkpoint's
    // backward makes again), where PyTorch's inline value receives their sum once; a linear
    // hook (scale, zero) gives the same either way, clamp and nan_to_num clamp the parts
    // separately.
    if (!scope.empty() && !inputs[0].requires_grad()) return 0;
    if (inputs[0].requires_grad() && inputs[0].is_leaf()) {
      keep_alive.push_back(autograd::GradAccumulator(inputs[0]));
    }
    autograd::RegisterHook(inputs[0], MakeGradientHook(op.attrs));
  } else {
    GS_CHECK_INTERNAL(op.op == kDetachOp, "op '", op.op, "' has neither a kernel nor a meaning");
    outputs = {inputs[0].detach()};
  }

  int64_t labeled = 0;
  if (schema.in_place && op.outputs.empty()) {
    // The written tensor is its first input's value, under that name (Note [Graph values]).
    if (const auto& fn = inputs[0].grad_fn(); fn != nullptr && !fn->has_label()) {
      fn->set_label(labeler, index);
      ++labeled;
    }
    return labeled;
  }
  GS_CHECK_INTERNAL(outputs.size() == op.outputs.size(), "op '", op.op, "' returned ",
                    outputs.size(), " outputs for ", op.outputs.size(), " names");
  for (size_t j = 0; j < outputs.size(); ++j) {
    Tensor& out = outputs[j];
    if (out.defined()) {
      // Views allocate nothing, so Tensor::Empty did not see them.
      if (out.numel() > program->limits.max_tensor_elements) {
        ThrowStatus(absl::ResourceExhaustedError(
            absl::StrCat("output ", Quote(op.outputs[j]), " ", out.DebugString(), " has ",
                         out.numel(), " elements, over the limit of ",
                         program->limits.max_tensor_elements, " (max_tensor_elements)")));
      }
      // A tensor already named is one an earlier value shares (a gradient that is its own
      // seed); it keeps its first name.
      if (out.name().empty()) out.set_name(op.outputs[j]);
      if (const auto& fn = out.grad_fn(); fn != nullptr && !fn->has_label()) {
        fn->set_label(labeler, index);
        ++labeled;
      }
    }
    env[static_cast<size_t>(first_output) + j] = std::move(out);
  }
  return labeled;
}

// Runs ops i (a mul by a scalar) and i + 1 (the sum of all of its product) as one, with
// ops::ScaledSum (Note [A scaled sum in one pass] in engine/ops/elementwise.h), when the
// product is read by that sum alone, is not kept, and x is big enough for the dropper to
// drop the product after the sum. Then takes both ops' reads, binds the sum in env from
// first_output + 1 and leaves the product's slot undefined, as dropping it would; returns the
// Nodes it labelled. Returns -1, having done nothing, when the pair does not qualify.
int64_t RunScaledSum(const Graph& graph, size_t i, const std::shared_ptr<const OpLabeler>& labeler,
                     Reads& reads, int64_t first_output, Env& env, ValueDropper& dropper) {
  if (i + 1 >= graph.ops.size()) return -1;
  const Op& mul = graph.ops[i];
  const Op& sum = graph.ops[i + 1];
  if (mul.op != "mul" || mul.no_grad || mul.inputs.size() != 1 || mul.outputs.size() != 1 ||
      mul.attrs.values().size() != 1 || !mul.attrs.has("other") || sum.op != "sum" || sum.no_grad ||
      sum.inputs.size() != 1 || sum.inputs[0] != mul.outputs[0] || sum.outputs.size() != 1 ||
      !sum.attrs.values().empty()) {
    return -1;
  }
  const Tensor& x = env[static_cast<size_t>(reads.Peek())];
  if (!ops::TakesScaledSum(x) || static_cast<int64_t>(x.nbytes()) < ValueDropper::kDropAboveBytes ||
      !dropper.DropsAfter(static_cast<int64_t>(i + 1), first_output)) {
    return -1;
  }
  const double scale = mul.attrs.GetFloat("other");
  reads.Next();  // x, for the mul
  reads.Next();  // the product, for the sum
  OutputNamesScope output_names(&sum.outputs);
  Tensor total = ops::ScaledSum(x, scale);
  int64_t labeled = 0;
  if (const auto& fn = total.grad_fn(); fn != nullptr) {
    fn->set_label(labeler, static_cast<int64_t>(i + 1));
    ++labeled;
    if (const auto& product_fn = fn->next_edges()[0].function; product_fn != nullptr) {
      product_fn->set_label(labeler, static_cast<int64_t>(i));
      ++labeled;
    }
  }
  total.set_name(sum.outputs[0]);
  env[static_cast<size_t>(first_output) + 1] = std::move(total);
  return labeled;
}

// Whether graph differentiates inside itself (in-graph grad, checkpoint bodies), where a Node
// may be differentiated again.
bool HasNestedBackward(const Graph& graph) {
  return absl::c_any_of(graph.ops,
                        [](const Op& op) { return op.body != nullptr || op.op == kGradOp; });
}

// The chain op that graph op `op` is, with its tensor operands alone, if any.
std::optional<ops::ChainOp> AsChainOp(const Op& op) {
  if (op.no_grad || op.body != nullptr || op.outputs.size() != 1 || !op.attrs.values().empty()) {
    return std::nullopt;
  }
  std::optional<ops::ChainOp> chain_op = ops::ChainOpNamed(op.op);
  if (!chain_op || static_cast<int>(op.inputs.size()) != ops::ChainOpArity(*chain_op)) {
    return std::nullopt;
  }
  return chain_op;
}

// Runs ops i, i + 1, ... as one chain (Note [Elementwise chains] in engine/ops/elementwise.h)
// while each op after the first reads the one before it, which nothing else reads and no
// name keeps (the dropper's verdict), and the chain's tensors qualify. Then takes the ops'
// reads, binds the last op's output in env (from first_output on, one slot per op) and leaves
// the others undefined, as dropping them would; sets *labeled to the Nodes the ops would have
// recorded, and returns how many ops ran. Returns 0, having done nothing, when fewer than two
// ops qualify.
int64_t RunElementwiseChain(const Graph& graph, size_t i,
                            const std::shared_ptr<const OpLabeler>& labeler, Reads& reads,
                            int64_t first_output, Env& env, ValueDropper& dropper,
                            int64_t* labeled) {
  std::optional<ops::ChainOp> first = AsChainOp(graph.ops[i]);
  if (!first || i + 1 >= graph.ops.size()) return 0;
  // Each operand is checked as it is taken: a long graph of ops that no chain takes costs one
  // look at each op's first operand.
  Reads ahead = reads;
  const Tensor& head = env[static_cast<size_t>(ahead.Next())];
  if (!ops::FitsChain(head, head)) return 0;
  absl::InlinedVector<ops::ChainLink, 16> links;
  links.push_back({*first, 0, Tensor()});
  if (ops::ChainOpArity(*first) == 2) {
    links.back().other = env[static_cast<size_t>(ahead.Next())];
    if (!ops::FitsChain(links.back().other, head)) return 0;
  }
  // Every op's output goes in one buffer (RunChain), no bigger than one tensor may be.
  size_t max_links = ops::kMaxChainOps;
  if (const auto& budget = CurrentMemoryBudget(); budget != nullptr) {
    max_links = static_cast<size_t>(
        std::min<int64_t>(ops::kMaxChainOps, budget->max_tensor_elements() / head.numel()));
  }
  for (size_t j = i + 1; j < graph.ops.size() && links.size() < max_links; ++j) {
    const Op& op = graph.ops[j];
    std::optional<ops::ChainOp> chain_op = AsChainOp(op);
    const int64_t previous = first_output + static_cast<int64_t>(j - i - 1);
    if (!chain_op || !dropper.DropsAfter(static_cast<int64_t>(j), previous)) break;
    Reads link_reads = ahead;
    ops::ChainLink link{*chain_op, -1, Tensor()};
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const int64_t slot = link_reads.Next();
      if (slot != previous) {
        link.other = env[static_cast<size_t>(slot)];
        if (!ops::FitsChain(link.other, head)) {
          link.chain_operand = -1;
          break;
        }
      } else if (link.chain_operand < 0) {
        link.chain_operand = static_cast<int>(k);
      } else {
        link.chain_operand = -1;  // read twice: not a chain's
        break;
      }
    }
    if (link.chain_operand < 0) break;
    links.push_back(std::move(link));
    ahead = link_reads;
  }
  if (links.size() < 2) return 0;
  const size_t last = i + links.size() - 1;
  OutputNamesScope output_names(&graph.ops[last].outputs);
  Tensor out = ops::RunChain(head, links, labeled);
  if (!out.defined()) return 0;
  reads = ahead;
  if (*labeled > 0) out.grad_fn()->set_label(labeler, static_cast<int64_t>(last));
  out.set_name(graph.ops[last].outputs[0]);
  env[static_cast<size_t>(first_output) + links.size() - 1] = std::move(out);
  return static_cast<int64_t>(links.size());
}

int64_t RunOps(const std::shared_ptr<const Graph>& graph, const ValueSlots& slots,
               const std::string& scope, const std::shared_ptr<const Program>& program, Env& env,
               int64_t first, ValueDropper* dropper) {
  std::vector<std::shared_ptr<autograd::Node>> keep_alive;
  TensorList inputs;  // each op's, in turn (RunOp)
  const auto labeler = std::make_shared<const OpLabeler>(graph, scope);
  Reads reads(slots);
  const int64_t given_slots =
      first + static_cast<int64_t>(graph->inputs.size() + graph->leaves.size());
  int64_t next_slot = given_slots;
  int64_t nodes = 0;
  for (size_t i = 0; i < graph->ops.size(); ++i) {
    const Op& op = graph->ops[i];
    if (program->cancel != nullptr) {
      if (absl::Status s = program->cancel->Check(); !s.ok()) {
        ThrowStatus(WithContext(s, absl::StrCat("stopped before ", DescribeOp(scope, i, op))));
      }
    }
    // Errors from a checkpoint's body already name their op by its full path, which starts
    // with this op's description. The description is built only for an error: for every op,
    // it was about 2% of a small request's server instructions.
    auto in_context = [&](const absl::Status& status) {
      const std::string context = DescribeOp(scope, i, op);
      return absl::StartsWith(status.message(), context) ? status : WithContext(status, context);
    };
    try {
      if (dropper != nullptr && dropper->chains()) {
        int64_t labeled = 0;
        if (const int64_t ran =
                RunElementwiseChain(*graph, i, labeler, reads, next_slot, env, *dropper, &labeled);
            ran > 0) {
          nodes += labeled;
          next_slot += ran;
          for (int64_t j = 0; j < ran; ++j) dropper->AfterOp(static_cast<int64_t>(i) + j, env);
          i += static_cast<size_t>(ran - 1);
          continue;
        }
      }
      if (dropper != nullptr) {
        if (const int64_t labeled =
                RunScaledSum(*graph, i, labeler, reads, next_slot, env, *dropper);
            labeled >= 0) {
          nodes += labeled;
          next_slot += 2;
          dropper->AfterOp(static_cast<int64_t>(i), env);
          ++i;  // the sum ran too
          dropper->AfterOp(static_cast<int64_t>(i), env);
          continue;
        }
      }
      nodes += RunOp(op, *slots.schemas[i], static_cast<int64_t>(i), scope, program, labeler, reads,
                     next_slot, given_slots, env, keep_alive, inputs);
      inputs.clear();
    } catch (const StatusError& e) {
      ThrowStatus(in_context(e.status()));
    } catch (const std::bad_alloc&) {
      ThrowStatus(in_context(absl::ResourceExhaustedError("out of memory")));
    } catch (const std::exception& e) {
      ThrowStatus(in_context(absl::InternalError(e.what())));
    }
    next_slot += static_cast<int64_t>(op.outputs.size());
    if (dropper != nullptr) dropper->AfterOp(static_cast<int64_t>(i), env);
  }
  return nodes;
}

// Runs fn, turning any exception into a status (Note [Errors inside the engine]).
template <typename Fn>
auto CatchAll(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const StatusError& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  }
}

// Every Node reachable from `stack` through next edges, each once; calls visit(node) on each
// and returns them.
template <typename Visit>
absl::flat_hash_set<const autograd::Node*> WalkNodes(
    std::vector<std::shared_ptr<autograd::Node>> stack, Visit&& visit) {
  absl::flat_hash_set<const autograd::Node*> seen;
  while (!stack.empty()) {
    std::shared_ptr<autograd::Node> node = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    visit(*node);
    for (const autograd::Edge& edge : node->next_edges()) {
      if (edge.is_valid()) stack.push_back(edge.function);
    }
  }
  return seen;
}

// Every Node reachable from the roots' gradient edges: what a backward from them can reach.
absl::flat_hash_set<const autograd::Node*> ReachableNodes(const TensorList& roots) {
  std::vector<std::shared_ptr<autograd::Node>> stack;
  for (const Tensor& root : roots) {
    if (auto fn = autograd::GradientEdge(root).function) stack.push_back(std::move(fn));
  }
  return WalkNodes(std::move(stack), [](const autograd::Node&) {});
}

}  // namespace

// The friend of RecordedGraph that does its work.
class Interpreter {
 public:
  // Runs a graph that passed its checks forward; slots are Validate's for it.
  static absl::StatusOr<std::unique_ptr<RecordedGraph>> Record(
      const std::shared_ptr<const Graph>& shared_graph, std::shared_ptr<const ValueSlots> slots,
      const Limits& limits, std::shared_ptr<CancellationToken> cancel,
      const std::vector<absl::string_view>* keep_only, std::shared_ptr<MemoryBudget> budget,
      bool elementwise_chains) {
    const Graph& graph = *shared_graph;
    std::unique_ptr<RecordedGraph> recorded(new RecordedGraph);
    recorded->graph_ = shared_graph;
    recorded->slots_ = std::move(slots);
    recorded->limits_ = limits;
    recorded->cancel_ = cancel;
    // Within the budget of the caller's thread, if any (Note [Budgets within a budget]).
    recorded->budget_ = budget != nullptr ? std::move(budget) : RequestBudget(limits);
    // Set before any op runs: an op that fails after an in-place write leaves its cycles in
    // values_ too, and the destructor must break them (Note [Cycles through in-place writes]).
    recorded->writes_in_place_ = recorded->slots_->writes_in_place;
    absl::Status status = CatchAll([&]() -> absl::Status {
      MemoryBudgetScope budget_scope(recorded->budget_);
      CancellationScope cancel_scope(cancel.get());  // Note [Stopping a running op]
      autograd::GradModeGuard grad_mode(true);
      auto program = std::make_shared<Program>();
      recorded->program_ = program;
      program->limits = limits;
      program->cancel = cancel;
      program->slots = recorded->slots_;
      PrepareBodies(graph, *recorded->slots_, *program);
      // Slots: the leaves, then the ops' outputs (the top level has no formal inputs).
      recorded->values_.resize(static_cast<size_t>(recorded->slots_->num_values));
      for (size_t i = 0; i < graph.leaves.size(); ++i) {
        recorded->values_[i] = MakeLeafValue(graph.leaves[i], recorded->slots_->writes_in_place);
      }
      // Note [Values freed after their last use].
      std::optional<ValueDropper> dropper;
      if (keep_only != nullptr && !recorded->slots_->writes_in_place) {
        dropper.emplace(*recorded->slots_, *keep_only, *recorded->budget_,
                        elementwise_chains && !HasNestedBackward(graph));
      }
      recorded->num_nodes_ = RunOps(shared_graph, *recorded->slots_, "", program, recorded->values_,
                                    0, dropper.has_value() ? &*dropper : nullptr);
      if (recorded->slots_->writes_in_place) {
        // Note [Views written in place]: a view whose base a later op wrote gets its replayed
        // history now, on this thread, so that backward calls only read the values.
        for (const Tensor& value : recorded->values_) {
          if (value.defined()) (void)value.grad_fn();
        }
      }
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return recorded;
  }

  // Note [Extending a recorded graph]
  static absl::StatusOr<int64_t> Extend(RecordedGraph& g, std::shared_ptr<const Graph> extension,
                                        std::shared_ptr<CancellationToken> cancel) {
    if (!g.spoiled_.ok()) return g.spoiled_;
    SetToken(g, std::move(cancel));
    absl::StatusOr<std::unique_ptr<const ValueSlots>> validated =
        ValidateExtension(*extension, g.AllSlots(), g.limits_);
    if (!validated.ok()) return validated.status();
    RecordedGraph::Extension added{std::move(extension), *std::move(validated),
                                   static_cast<int64_t>(g.values_.size())};
    const Graph& graph = *added.graph;
    const ValueSlots& slots = *added.slots;
    int64_t nodes = 0;
    absl::Status status = CatchAll([&]() -> absl::Status {
      MemoryBudgetScope budget_scope(g.budget_);
      CancellationScope cancel_scope(g.cancel_.get());  // Note [Stopping a running op]
      autograd::GradModeGuard grad_mode(true);
      PrepareBodies(graph, slots, *g.program_);
      g.values_.resize(static_cast<size_t>(slots.num_values));
      for (size_t i = 0; i < graph.leaves.size(); ++i) {
        g.values_[static_cast<size_t>(added.first_slot) + i] =
            MakeLeafValue(graph.leaves[i], slots.writes_in_place);
      }
      nodes = RunOps(added.graph, slots, "", g.program_, g.values_, added.first_slot);
      return absl::OkStatus();
    });
    g.program_->extension_slots.push_back(added.slots);
    if (slots.writes_in_place) g.writes_in_place_ = true;
    if (status.ok()) {
      g.num_nodes_ += nodes;
      g.extensions_.push_back(std::move(added));
      return nodes;
    }
    if (slots.writes_in_place) {
      // It may have written a recorded value: keep what it made, refuse what follows.
      g.spoiled_ = absl::FailedPreconditionError(absl::StrCat(
          "an earlier extension of this graph wrote a value in place and then failed (",
          status.message(), "); the graph is no longer the one described: record it again"));
      g.failed_.push_back(std::move(added));
      return status;
    }
    // Nothing recorded before refers to what it made: drop it, its bodies (nested ones too:
    // their keys are addresses that a later graph may reuse) first.
    g.values_.resize(static_cast<size_t>(added.first_slot));
    ForgetBodies(slots, *g.program_);
    g.program_->extension_slots.pop_back();
    return status;
  }

  // Note [A held graph's token]
  static void SetToken(RecordedGraph& g, std::shared_ptr<CancellationToken> cancel) {
    g.cancel_ = cancel;
    if (g.program_ != nullptr) g.program_->cancel = std::move(cancel);
  }

  static absl::StatusOr<CallResult> Backward(const RecordedGraph& graph, const BackwardCall& call) {
    if (!graph.spoiled_.ok()) return graph.spoiled_;
    absl::StatusOr<CallResult> result;
    absl::Status status = CatchAll([&]() -> absl::Status {
      MemoryBudgetScope budget_scope(graph.budget_);
      CancellationScope cancel_scope(graph.cancel_.get());  // Note [Stopping a running op]
      result = RunBackward(graph, call);
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return result;
  }

 private:
  // A forward value named by a backward call; role says which part of the call names it.
  static Tensor CallValue(const RecordedGraph& graph, const std::string& name, const char* role) {
    const ValueSlots& slots = graph.AllSlots();
    auto it = slots.by_name.find(name);
    GS_CHECK_ARG(it != slots.by_name.end(), role, " ", Quote(name), " is not a value of the graph");
    const Tensor& value = graph.values_[static_cast<size_t>(it->second)];
    GS_CHECK_ARG(value.defined(), role, " ", Quote(name),
                 " has no value (an unreached gradient of a grad op)");
    return value;
  }

  static CallResult RunBackward(const RecordedGraph& graph, const BackwardCall& call) {
    if (graph.cancel_ != nullptr) ThrowIfError(graph.cancel_->Check());
    // autograd::Grad and Backward check the roots, seeds and inputs against each other and
    // name them by their value names.
    TensorList roots;
    for (const std::string& name : call.roots) roots.push_back(CallValue(graph, name, "root"));

    CallResult result;
    result.names = call.inputs;
    if (result.names.empty()) {
      // The graph's leaves then its extensions', each's at its first slots.
      auto add_leaves = [&](const Graph& g, int64_t first) {
        for (size_t i = 0; i < g.leaves.size(); ++i) {
          if (graph.values_[static_cast<size_t>(first) + i].requires_grad()) {
            result.names.push_back(g.leaves[i].name);
          }
        }
      };
      add_leaves(*graph.graph_, 0);
      for (const RecordedGraph::Extension& e : graph.extensions_) {
        add_leaves(*e.graph, e.first_slot);
      }
    }
    TensorList inputs;
    for (const std::string& name : result.names) inputs.push_back(CallValue(graph, name, "input"));

    autograd::BackwardOptions options;
    options.retain_graph = call.retain_graph;
    options.create_graph = call.create_graph;
    options.anomaly_mode = call.anomaly_mode;
    options.cancel = graph.cancel_;
    options.budget = graph.budget_;
    options.sole_pass = graph.one_call_at_a_time_;
    if (call.accumulate_grad) {
      const absl::flat_hash_set<const autograd::Node*> reachable = ReachableNodes(roots);
      for (const Tensor& input : inputs) {
        result.connected.push_back(
            reachable.contains(autograd::GradientEdge(input).function.get()));
      }
      ThrowIfError(autograd::Backward(roots, call.seeds, inputs, options));
      for (const Tensor& input : inputs) result.grads.push_back(input.grad());
    } else {
      // Materialization happens here, after `connected` is read from what came back.
      options.allow_unused = call.allow_unused || call.materialize_grads;
      result.grads = ValueOrThrow(autograd::Grad(roots, call.seeds, inputs, options));
      for (const Tensor& grad : result.grads) result.connected.push_back(grad.defined());
    }
    if (call.materialize_grads) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (!result.grads[i].defined()) result.grads[i] = inputs[i].ZerosLike();
      }
    }
    return result;
  }
};

absl::StatusOr<std::unique_ptr<RecordedGraph>> RecordedGraph::Record(
    std::shared_ptr<const Graph> graph, const Limits& limits,
    std::shared_ptr<CancellationToken> cancel, const std::vector<absl::string_view>* keep_only,
    std::shared_ptr<MemoryBudget> budget, bool elementwise_chains) {
  absl::StatusOr<std::unique_ptr<const ValueSlots>> slots = Validate(*graph, limits);
  if (!slots.ok()) return slots.status();
  return Interpreter::Record(graph, *std::move(slots), limits, std::move(cancel), keep_only,
                             std::move(budget), elementwise_chains);
}

absl::StatusOr<std::unique_ptr<RecordedGraph>> RecordedGraph::RecordValidated(
    std::shared_ptr<const Graph> graph, std::shared_ptr<const ValueSlots> slots,
    const Limits& limits, std::shared_ptr<CancellationToken> cancel,
    const std::vector<absl::string_view>* keep_only, std::shared_ptr<MemoryBudget> budget,
    bool elementwise_chains) {
  if (absl::Status s = ValidateLeafValues(*graph, limits); !s.ok()) return s;
  return Interpreter::Record(graph, std::move(slots), limits, std::move(cancel), keep_only,
                             std::move(budget), elementwise_chains);
}

absl::StatusOr<std::unique_ptr<RecordedGraph>> RecordedGraph::Record(
    const Graph& graph, const Limits& limits, std::shared_ptr<CancellationToken> cancel) {
  return Record(std::make_shared<const Graph>(graph), limits, std::move(cancel));
}

std::shared_ptr<MemoryBudget> RequestBudget(const Limits& limits) {
  return MemoryBudget::Make(limits.max_memory_bytes, CurrentMemoryBudget(), "request memory limit",
                            limits.max_tensor_elements);
}

// Note [Cycles through in-place writes]
// A Node keeps a tensor it saved that is not its own output as that tensor itself (Note [Saved
// versions]). When an in-place op later writes the tensor with an operand computed from that
// Node's output (p = s * s; s.add_(p)), the tensor's new grad_fn reaches the Node, which holds
// the tensor: a cycle of references that would keep the whole recorded graph, and the memory
// charged to the request, alive after the request (in PyTorch the same cycle waits for the
// garbage collector). The saved tensor can never be unpacked again (its version moved), so a
// graph that wrote in place frees every saved tensor of its Nodes when it goes, which breaks
// any such cycle; graphs without in-place ops skip the walk. A recording that fails partway
// goes the same way (the request fuzzer found such a cycle left by a GRU step whose last op
// was refused).
RecordedGraph::~RecordedGraph() {
  if (!writes_in_place_) return;
  std::vector<std::shared_ptr<autograd::Node>> nodes;
  for (const Tensor& value : values_) {
    if (value.defined() && value.grad_fn() != nullptr) nodes.push_back(value.grad_fn());
  }
  WalkNodes(std::move(nodes), [](autograd::Node& node) {
    MutexLock lock(&node.mutex());
    node.release_variables();
  });
}

absl::StatusOr<CallResult> RecordedGraph::Backward(const BackwardCall& call) {
  return Interpreter::Backward(*this, call);
}

absl::StatusOr<CallResult> RecordedGraph::Backward(const BackwardCall& call,
                                                   std::shared_ptr<CancellationToken> cancel) {
  Interpreter::SetToken(*this, std::move(cancel));
  return Interpreter::Backward(*this, call);
}

absl::StatusOr<int64_t> RecordedGraph::Extend(std::shared_ptr<const Graph> extension,
                                              std::shared_ptr<CancellationToken> cancel) {
  return Interpreter::Extend(*this, std::move(extension), std::move(cancel));
}

absl::StatusOr<Tensor> RecordedGraph::Value(absl::string_view name) const {
  const ValueSlots& slots = AllSlots();
  auto it = slots.by_name.find(name);
  if (it == slots.by_name.end()) {
    return absl::NotFoundError(absl::StrCat("no value is named ", Quote(name)));
  }
  return values_[static_cast<size_t>(it->second)];
}

}  // namespace gradserve::graph
