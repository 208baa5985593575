// Engine: runs backward passes over recorded autograd graphs.
//
// Note [Engine threads]
// As in PyTorch, the Engine is one per process and has three kinds of threads:
//  - The owner: the thread that calls execute(). It owns the GraphTask and runs its CPU Nodes
//    from the GraphTask's CPU ReadyQueue until the pass is over. In the server, the request
//    workers play this part, and gRPC's own thread for the small requests it runs inline
//    (Note [Inline or pool] in server/run/dispatch.h).
//  - One worker thread per accelerator device, started the first time a pass needs that
//    device, serving every GraphTask's Nodes on it from the device's ReadyQueue. When such a
//    thread finishes a pass, it pushes an empty task to the owner's queue to wake it up.
//  - The reentrant thread pool: a Node's backward may itself call execute() (checkpoint). That
//    nested pass runs on the same thread, sharing its ReadyQueue, up to kMaxDepth nested passes
//    per thread; deeper ones are handed to a pool thread while the caller waits on their
//    future, so any depth finishes without deadlock or stack overflow.
//
// Note [Undefined gradients]
// An undefined tensor stands for a zero gradient. A Node all of whose inputs are undefined is
// not applied: its outputs are undefined too. Otherwise the Engine fills undefined inputs with
// zeros (from the input metadata) before apply(), so a backward function never sees one.
//
// Method and field names follow PyTorch's engine on purpose (execute, thread_main,
// evaluate_function, compute_dependencies ...), so its documentation maps onto this code.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_ENGINE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_ENGINE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "engine/autograd/edge.h"
#include "engine/autograd/graph_future.h"
#include "engine/autograd/graph_task.h"
#include "engine/autograd/ready_queue.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

// Counts of one pass, for logs and tests.
struct ExecuteStats {
  // Nodes compute_dependencies reached (after min_topo_nr pruning).
  int64_t nodes_in_graph = 0;
  // Nodes whose apply() ran (or that were skipped for undefined inputs).
  int64_t nodes_executed = 0;
};

struct ExecuteOptions {
  bool keep_graph = false;
  bool create_graph = false;
  // backward() (sum into leaves) rather than grad() (capture the outputs' gradients).
  bool accumulate_grad = true;
  bool anomaly_mode = false;
  // Null: inherited from the pass this one is nested in, if any.
  std::shared_ptr<CancellationToken> cancel;
  std::shared_ptr<MemoryBudget> budget;
  // If set, filled in when the pass is over.
  ExecuteStats* stats = nullptr;
  // The caller's promise that no other pass runs any of this pass's Nodes until it returns:
  // the Engine then runs each Node without taking its mutex (Note [A pass alone on its
  // Nodes]). A pass nested in this one (a Node's reentrant backward) does not inherit it.
  bool sole_pass = false;
};

// Thread safety: execute() may be called from any number of threads at once, and from inside
// a Node's apply() (reentrant backward).
class Engine {
 public:
  // Nested passes one thread runs itself before handing deeper ones to the pool.
  static constexpr int kMaxDepth = 60;

  static Engine& Get();
  ~Engine();

  // Runs a backward pass from roots (edges to the roots' grad_fns, with one seed gradient each,
  // already checked against the roots) and blocks until it is over. outputs: edges whose
  // gradients to capture (grad semantics) or the only leaves to accumulate into (backward
  // semantics, when non-empty). Returns the captured gradients, one per output edge (undefined
  // where none arrived), or the first error: the status a Node threw, prefixed with the Node's
  // name and label; FAILED_PRECONDITION for a second pass through freed saved tensors;
  // INVALID_ARGUMENT for a NaN under anomaly mode; CANCELLED or DEADLINE_EXCEEDED when the
  // token says so (checked between Nodes and, as each Node's current token, inside long
  // kernels: Note [Stopping a running op]).
  absl::StatusOr<TensorList> execute(const EdgeList& roots, TensorList seeds,
                                     const ExecuteOptions& options, const EdgeList& outputs);

  // Test hooks: how many reentrant pool threads were ever started, and how many device worker
  // threads run.
  int reentrant_pool_threads_started() const {
    return pool_threads_started_.load(std::memory_order_relaxed);
  }
  int device_threads_started() const;

  // The worker index of an accelerator device (>= 0); kCpuDevice for the CPU.
  static int device_index(Device device);

 private:
  Engine() = default;

  std::shared_ptr<GraphFuture> execute_with_graph_task(const std::shared_ptr<GraphTask>& graph_task,
                                                       std::shared_ptr<Node> graph_root,
                                                       InputBuffer input_buffer);
  // The worker loop (Note [Engine threads]): pops tasks from this thread's ready queue and
  // evaluates them until graph_task is over (or forever, for device threads: graph_task null).
  void thread_main(const std::shared_ptr<GraphTask>& graph_task);
  // Runs func and hands its gradients on, queueing the Nodes that become ready; one of them may
  // instead be left in *handoff for this thread to run next (Note [Handing the next task over]).
  // exec_info is func's entry in the pass's table, or null to look it up. Adds 1 to *executed
  // if func ran (Note [Fewer atomics per Node]).
  void evaluate_function(const std::shared_ptr<GraphTask>& graph_task, Node* func,
                         InputBuffer& inputs, const ExecInfo* exec_info,
                         std::optional<NodeTask>* handoff, int64_t* executed);
  static void compute_dependencies(Node* root, GraphTask& task, uint64_t min_topo_nr);

  // The queue a Node with inputs on `device` runs from.
  std::shared_ptr<ReadyQueue> ready_queue(const std::shared_ptr<ReadyQueue>& cpu_ready_queue,
                                          Device device);
  std::shared_ptr<ReadyQueue> ready_queue_by_index(
      const std::shared_ptr<ReadyQueue>& cpu_ready_queue, int device_index);

  // Device worker threads.
  void device_thread_main(int device_index, std::shared_ptr<ReadyQueue> queue);
  // Reentrant thread pool.
  void add_thread_pool_task(const std::weak_ptr<GraphTask>& graph_task);
  void reentrant_thread_main();

  static constexpr int kMaxDevicesPerType = 64;
  static constexpr int kMaxDeviceIndex = kNumDeviceTypes * kMaxDevicesPerType;

  // Guards the creation of device queues and threads (each started once, on first use).
  mutable Mutex device_mutex_;
  std::array<std::shared_ptr<ReadyQueue>, kMaxDeviceIndex> device_ready_queues_
      ABSL_GUARDED_BY(device_mutex_);
  std::vector<std::thread> device_threads_ ABSL_GUARDED_BY(device_mutex_);

  // Guards the reentrant pool's queue of GraphTasks and its threads.
  Mutex pool_mutex_;
  CondVar pool_work_;
  std::deque<std::weak_ptr<GraphTask>> pool_graph_tasks_ ABSL_GUARDED_BY(pool_mutex_);
  int pool_idle_threads_ ABSL_GUARDED_BY(pool_mutex_) = 0;
  bool pool_shutdown_ ABSL_GUARDED_BY(pool_mutex_) = false;
  std::vector<std::thread> pool_threads_ ABSL_GUARDED_BY(pool_mutex_);
  std::atomic<int> pool_threads_started_{0};
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_ENGINE_H_
