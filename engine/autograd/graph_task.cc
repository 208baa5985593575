#include "engine/autograd/graph_task.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/inlined_vector.h"
#include "absl/numeric/bits.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/ready_queue.h"

namespace gradserve::autograd {

// Note [A small node table entry].
static_assert(sizeof(decltype(GraphTask::nodes_in_graph_)::value_type) <= 56,
              "a node table entry grew");

GraphTask::GraphTask(bool keep_graph, bool grad_mode, int reentrant_depth,
                     std::shared_ptr<ReadyQueue> cpu_ready_queue, bool exit_on_error)
    : keep_graph_(keep_graph),
      grad_mode_(grad_mode),
      exit_on_error_(exit_on_error),
      reentrant_depth_(reentrant_depth),
      cpu_ready_queue_(std::move(cpu_ready_queue)),
      future_result_(std::make_shared<GraphFuture>()) {}

GraphTask::~GraphTask() {
  if (cancel_ != nullptr && cancel_callback_id_ >= 0) cancel_->RemoveCallback(cancel_callback_id_);
  if (budget_ != nullptr) budget_->Release(node_table_charged_);
}

size_t GraphTask::ReserveNodeTable(size_t entries) {
  // A swiss table grows when it is 7/8 full (one Node less here, to stay on the safe side); its
  // capacity is a power of two minus one, and each slot has one control byte besides the entry.
  auto room = [this]() -> size_t {
    const size_t capacity = nodes_in_graph_.capacity();
    return capacity == 0 ? 0 : capacity - capacity / 8 - 1;
  };
  if (entries <= room()) return room();
  const size_t wanted = std::max(entries, 2 * nodes_in_graph_.size());
  const size_t slots = absl::bit_ceil(wanted + wanted / 7 + 1);
  const int64_t bytes =
      static_cast<int64_t>(slots * (sizeof(decltype(nodes_in_graph_)::value_type) + 1));
  if (budget_ != nullptr && bytes > node_table_charged_) {
    budget_->Charge(bytes - node_table_charged_);
    node_table_charged_ = bytes;
  }
  nodes_in_graph_.reserve(wanted);
  return room();
}

void GraphTask::init_to_execute(Node& graph_root, const EdgeList& outputs, bool accumulate_grad,
                                uint64_t min_topo_nr) {
  exec_info_used_ = true;
  // Seed: the output Nodes are needed (backward) or capture (grad). An output the root cannot
  // reach still gets an entry; it never receives an input. A Node's captures are one range of
  // captures_ (Note [A small node table entry]): the outputs' captures, sorted by Node (stably,
  // so each Node's keep the outputs' order), each run of one Node's its range.
  absl::InlinedVector<std::pair<Node*, ExecInfo::Capture>, 4> by_node;
  uint32_t output_idx = 0;
  for (const Edge& output_edge : outputs) {
    Node* fn = output_edge.function.get();
    if (accumulate_grad) {
      nodes_in_graph_[fn].exec_info_.needed_ = true;
    } else {
      by_node.push_back({fn, {output_edge.input_nr, output_idx++}});
    }
  }
  if (by_node.size() > 1) {  // (std::stable_sort takes a buffer from the heap even for one)
    absl::c_stable_sort(
        by_node, [](const auto& a, const auto& b) { return std::less<Node*>()(a.first, b.first); });
  }
  captures_.reserve(by_node.size());
  for (size_t k = 0; k < by_node.size(); ++k) {
    ExecInfo& info = nodes_in_graph_[by_node[k].first].exec_info_;
    if (k == 0 || by_node[k - 1].first != by_node[k].first) {
      info.first_capture_ = static_cast<uint32_t>(captures_.size());
    }
    ++info.num_captures_;
    captures_.push_back(by_node[k].second);
  }
  {
    MutexLock lock(&mutex_);
    captured_vars_.resize(output_idx);
  }

  // Iterative depth-first search from the root: a Node is needed if any child should execute.
  // A child seen before is not searched again, but its verdict still counts for the parent.
  // Outputs are not pre-marked as seen, since an output may lie on the path to another. No
  // entry is added here, so the pointers to entries stay valid.
  struct Frame {
    Node* fn;
    ExecInfo* info;
    size_t next_child = 0;
  };
  // Each Node is pushed at most once: the table's size bounds the depth, and one allocation
  // replaces the doublings of a deep graph.
  std::vector<Frame> stack;
  stack.reserve(nodes_in_graph_.size());
  stack.push_back({&graph_root, &nodes_in_graph_[&graph_root].exec_info_});
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Node* child = nullptr;
    ExecInfo* child_info = nullptr;
    while (frame.next_child < frame.fn->num_outputs()) {
      Node* candidate = frame.fn->next_edge(frame.next_child++).function.get();
      if (candidate == nullptr) continue;
      auto it = nodes_in_graph_.find(candidate);
      if (it == nodes_in_graph_.end()) continue;  // below min_topo_nr: not expanded
      if (!it->second.seen_by_init_to_execute_) {
        it->second.seen_by_init_to_execute_ = true;
        child = candidate;
        child_info = &it->second.exec_info_;
        break;
      }
      if (it->second.exec_info_.should_execute()) frame.info->needed_ = true;
    }
    if (child != nullptr) {
      // A child older than every output cannot lead to one.
      if (child->topological_nr() < min_topo_nr) continue;
      stack.push_back({child, child_info});
      continue;
    }
    const bool execute = frame.info->should_execute();
    stack.pop_back();
    if (execute && !stack.empty()) stack.back().info->needed_ = true;
  }
}

bool GraphTask::completed() const {
  return outstanding_tasks_.load(std::memory_order_acquire) <= 0 ||
         (exit_on_error_ && has_error_.load(std::memory_order_acquire));
}

void GraphTask::mark_as_completed_and_run_post_processing() {
  if (future_completed_.exchange(true)) return;
  TensorList captured;
  absl::InlinedVector<Stream, 1> streams;
  {
    MutexLock lock(&mutex_);
    captured = std::move(captured_vars_);
    streams.swap(streams_used_);
  }
  // The caller reads finished gradients (Note [Streams in the backward pass]).
  try {
    for (const Stream& s : streams) SynchronizeStream(s);
  } catch (const StatusError& e) {
    future_result_->Resolve(e.status());
    return;
  }
  future_result_->Resolve(std::move(captured));
}

namespace {
// Marks a status whose message already names the Node it came from, so that the passes a nested
// (reentrant) error travels through do not name theirs too.
constexpr char kNamedNodePayload[] = "gradserve.node_named";
}  // namespace

void GraphTask::set_exception(absl::Status status, const Node* fn) {
  if (!has_error_.exchange(true) && fn != nullptr &&
      status.code() != absl::StatusCode::kCancelled &&
      status.code() != absl::StatusCode::kDeadlineExceeded &&
      !status.GetPayload(kNamedNodePayload).has_value()) {
    status =
        absl::Status(status.code(), absl::StrCat("in ", fn->DebugName(), ": ", status.message()));
    status.SetPayload(kNamedNodePayload, absl::Cord(fn->name()));
  }
  if (!future_completed_.exchange(true)) future_result_->Resolve(std::move(status));
}

}  // namespace gradserve::autograd
