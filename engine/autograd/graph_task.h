// GraphTask: the state of one backward pass (one Engine::execute).

#ifndef GRADSERVE_ENGINE_AUTOGRAD_GRAPH_TASK_H_
#define GRADSERVE_ENGINE_AUTOGRAD_GRAPH_TASK_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "engine/autograd/cancellation.h"
#include "engine/autograd/edge.h"
#include "engine/autograd/exec_info.h"
#include "engine/autograd/graph_future.h"
#include "engine/autograd/input_buffer.h"
#include "engine/autograd/node.h"
#include "engine/device/device.h"
#include "engine/device/stream.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/math_mode.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

class ReadyQueue;

// Worker "devices" (PyTorch's numbering): the thread that owns a GraphTask and runs its CPU
// Nodes is CPU_DEVICE; a thread that is no Engine worker yet is NO_DEVICE; accelerator worker
// threads have indices >= 0 (Engine::device_index).
inline constexpr int kNoDevice = -2;
inline constexpr int kCpuDevice = -1;

// Note [GraphTask lifetime]
// The thread that calls Engine::execute owns its GraphTask (a shared_ptr) until the pass ends;
// device threads hold it only while they run one of its Nodes; queued NodeTasks hold it
// weakly. So a pass that failed or was cancelled is freed as soon as its owner returns, with
// every buffer it gathered, even while stale NodeTasks still sit in device queues.
//
// Field names follow PyTorch's engine, so its documentation maps onto this code.
struct GraphTask : std::enable_shared_from_this<GraphTask> {
  GraphTask(bool keep_graph, bool grad_mode, int reentrant_depth,
            std::shared_ptr<ReadyQueue> cpu_ready_queue, bool exit_on_error = false);
  ~GraphTask();

  // Marks in exec_info_ the Nodes on a path from graph_root to an output edge (and records the
  // captures for grad semantics). Nodes whose topological_nr is below min_topo_nr cannot reach
  // any output and are not visited.
  void init_to_execute(Node& graph_root, const EdgeList& outputs, bool accumulate_grad,
                       uint64_t min_topo_nr);

  // Whether the pass is over: no task left, or (with exit_on_error_) an error.
  bool completed() const;
  // Resolves the future with captured_vars_ (once, by whichever thread finishes last).
  void mark_as_completed_and_run_post_processing();
  // Records the first error (naming fn, if any) and resolves the future with it.
  void set_exception(absl::Status status, const Node* fn);

  // Tasks queued or running. Incremented by ReadyQueue::push, decremented by the worker when
  // the task is done.
  std::atomic<int64_t> outstanding_tasks_{0};
  std::atomic<bool> has_error_{false};
  std::atomic<bool> future_completed_{false};
  std::atomic<int64_t> nodes_executed_{0};
  // retain_graph: do not release saved tensors after each Node.
  const bool keep_graph_;
  // create_graph: grad mode while the Nodes run.
  const bool grad_mode_;
  bool anomaly_mode_ = false;
  const bool exit_on_error_;

  // Note [GraphTask node table]
  // PyTorch keeps four maps keyed by Node: dependencies_, not_ready_, exec_info_ and
  // nodes_in_graph_. Here they are one table, nodes_in_graph_, whose entry for a Node holds
  // its dependencies_, not_ready_ buffer and exec_info_: the Engine then pays one hash lookup
  // per edge instead of four, which matters when a Node's whole backward costs less than a
  // microsecond. The table's set of keys is fixed before the first task is queued (by
  // compute_dependencies and init_to_execute) and never changes during the pass, so entries
  // can be found without a lock; an entry's dependencies_ and not_ready_ change only under
  // mutex_ (or, in a pass on one thread, on that thread alone: Note [Fewer atomics per Node]),
  // and its exec_info_ is read-only once the pass starts. The table is charged to the
  // pass's budget as it grows, before each growth (ReserveNodeTable), and given back with the
  // GraphTask: it is as big as the graph, and so is the request's share of the Engine's memory
  // (Note [Nodes on the budget]).
  //
  // Note [A small node table entry]
  // Running a pass looks up every edge's Node in the table, and on a deep graph (chain_10k's
  // 20,000 Nodes) the table is bigger than a core's cache: the load of an entry's key was a
  // fifth of evaluate_function's time (perf). So an entry is kept small, 56 bytes with its key
  // where it was 88: the gathered inputs are a plain InputBuffer, empty (no slots) until the
  // first one arrives and again once the Node is queued, rather than an optional; and a Node's
  // captures (grad semantics, only the outputs' Nodes have any) are a range of captures_
  // rather than a vector in every entry.
  struct NodeState {
    // The inputs gathered so far, once the first one arrives and until the Node is ready;
    // no slots otherwise.
    InputBuffer not_ready_;
    // Inputs that have not arrived yet.
    int dependencies_ = 0;
    // Whether the Node must run and which of its inputs to capture (grad semantics); unused
    // when every Node in the graph runs (backward() with no inputs, exec_info_used false).
    ExecInfo exec_info_;
    // init_to_execute's depth-first search has reached this Node.
    bool seen_by_init_to_execute_ = false;
  };

  // Whether exec_info_ applies: false (PyTorch: exec_info_ is empty) when every Node runs.
  bool exec_info_used() const { return exec_info_used_; }

  // Note [GraphTask node table]: makes room in nodes_in_graph_ for at least `entries` Nodes
  // (at least doubling it, if it must grow), charging budget_ (if any) for the bigger table
  // before it is allocated. Returns how many Nodes the table now holds without growing by
  // itself. Throws RESOURCE_EXHAUSTED over the budget, leaving the table as it was. Owner
  // thread only, before the first task is queued.
  size_t ReserveNodeTable(size_t entries);

  // Guards the entries' dependencies_ and not_ready_ (unless one_thread_), captured_vars_ and
  // streams_used_. Never waited on (Note [Node locks without a call]).
  FastMutex mutex_;
  TensorList captured_vars_ ABSL_GUARDED_BY(mutex_);
  // Every Node's captures, each Node's together (ExecInfo::first_capture_); written by
  // init_to_execute, read-only once the pass starts.
  std::vector<ExecInfo::Capture> captures_;
  // The device streams Nodes of this pass ran on, synchronized before the future resolves
  // (Note [Streams in the backward pass]); empty for passes on the CPU.
  absl::InlinedVector<Stream, 1> streams_used_ ABSL_GUARDED_BY(mutex_);
  // Every Node reached from the root (Note [GraphTask node table]).
  absl::flat_hash_map<Node*, NodeState> nodes_in_graph_;
  bool exec_info_used_ = false;
  // Every Node of the pass takes its gradients on the host, so the owner thread runs them all
  // and evaluate_function hands gradients on without mutex_ (Note [Fewer atomics per Node]).
  // Written by compute_dependencies, read-only once the pass starts.
  bool one_thread_ = false;
  // No other pass runs this pass's Nodes meanwhile (the caller's promise, ExecuteOptions):
  // evaluate_function runs each Node without its mutex (Note [Fewer atomics per Node]).
  bool sole_pass_ = false;

  // The worker device that owns this task (kCpuDevice or an accelerator's index). Written by
  // the owning thread before the first task is queued.
  int owner_ = kNoDevice;
  const int reentrant_depth_;
  // The queue for this pass's CPU Nodes: the owner thread's.
  const std::shared_ptr<ReadyQueue> cpu_ready_queue_;
  const std::shared_ptr<GraphFuture> future_result_;

  std::shared_ptr<CancellationToken> cancel_;
  int64_t cancel_callback_id_ = -1;
  std::shared_ptr<MemoryBudget> budget_;
  // The starting thread's, for the threads that run the Nodes (Note [TF32 per request], Note
  // [Bare device names]).
  MathMode math_mode_;
  DeviceChoice device_choice_;
  // What nodes_in_graph_ was charged to budget_ (ReserveNodeTable).
  int64_t node_table_charged_ = 0;
  // The deadline the owner thread waits against (the token's, or infinite).
  absl::Time deadline() const {
    return cancel_ != nullptr ? cancel_->deadline() : absl::InfiniteFuture();
  }
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_GRAPH_TASK_H_
