#include "engine/autograd/graph_task.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/ready_queue.h"

namespace gradserve::autograd {

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
}

void GraphTask::init_to_execute(Node& graph_root, const EdgeList& outputs, bool accumulate_grad,
                                uint64_t min_topo_nr) {
  // Seed: the output Nodes are needed (backward) or capture (grad).
  uint32_t output_idx = 0;
  for (const Edge& output_edge : outputs) {
    ExecInfo& info = exec_info_[output_edge.function.get()];
    if (accumulate_grad) {
      info.needed_ = true;
    } else {
      info.captures_.push_back({output_edge.input_nr, output_idx++});
    }
  }
  {
    MutexLock lock(&mutex_);
    captured_vars_.resize(output_idx);
  }

  // Iterative depth-first search from the root: a Node is needed if any child should execute.
  // A child seen before is not searched again, but its verdict still counts for the parent.
  // Outputs are not pre-marked as seen, since an output may lie on the path to another.
  struct Frame {
    Node* fn;
    size_t next_child = 0;
  };
  auto should_execute = [this](Node* fn) {
    auto it = exec_info_.find(fn);
    return it != exec_info_.end() && it->second.should_execute();
  };
  absl::flat_hash_set<Node*> seen;
  std::vector<Frame> stack;
  stack.push_back({&graph_root});
  exec_info_.try_emplace(&graph_root);
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Node* fn = frame.fn;
    Node* child = nullptr;
    while (frame.next_child < fn->num_outputs()) {
      Node* candidate = fn->next_edge(frame.next_child++).function.get();
      if (candidate == nullptr) continue;
      if (seen.insert(candidate).second) {
        child = candidate;
        break;
      }
      if (should_execute(candidate)) exec_info_[fn].needed_ = true;
    }
    if (child != nullptr) {
      // A child older than every output cannot lead to one.
      if (child->topological_nr() < min_topo_nr) continue;
      stack.push_back({child});
      continue;
    }
    stack.pop_back();
    if (should_execute(fn) && !stack.empty()) exec_info_[stack.back().fn].needed_ = true;
  }
}

bool GraphTask::completed() const {
  return outstanding_tasks_.load(std::memory_order_acquire) <= 0 ||
         (exit_on_error_ && has_error_.load(std::memory_order_acquire));
}

void GraphTask::mark_as_completed_and_run_post_processing() {
  if (future_completed_.exchange(true)) return;
  TensorList captured;
  {
    MutexLock lock(&mutex_);
    captured = std::move(captured_vars_);
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
