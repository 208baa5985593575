#include "engine/autograd/engine.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/busy_time.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/graph_root.h"
#include "engine/device/device_registry.h"
#include "engine/device/stream.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/util/status_error.h"

namespace gradserve::autograd {
namespace {

// The worker device of this thread (Note [Engine threads]).
thread_local int worker_device = kNoDevice;
// Nested passes this thread is running itself.
thread_local int current_depth = 0;
// Nested passes above the current one, across threads.
thread_local int total_depth = 0;
// The queue this thread pops from while it is a worker.
thread_local std::shared_ptr<ReadyQueue> local_ready_queue;
// The pass whose Node this thread is running, so a nested pass can inherit its token. The
// worker holds the pass alive while it runs the Node.
thread_local const GraphTask* current_graph_task = nullptr;

// What a Node runs under: its pass as the current one, the pass's grad mode (create_graph),
// memory budget, cancellation token (which the kernels check: Note [Stopping a running op]),
// math mode (Note [TF32 per request]) and device choice (Note [Bare device names]).
class GraphTaskScope {
 public:
  explicit GraphTaskScope(const GraphTask* graph_task)
      : previous_(current_graph_task),
        grad_mode_(graph_task->grad_mode_),
        budget_(&graph_task->budget_),
        cancel_(graph_task->cancel_.get()),
        math_mode_(graph_task->math_mode_),
        device_choice_(graph_task->device_choice_) {
    current_graph_task = graph_task;
  }
  ~GraphTaskScope() { current_graph_task = previous_; }

 private:
  const GraphTask* previous_;
  GradModeGuard grad_mode_;
  MemoryBudgetScope budget_;
  CancellationScope cancel_;
  MathModeScope math_mode_;
  DeviceChoiceScope device_choice_;
};

uint64_t compute_min_topological_nr(const EdgeList& outputs) {
  if (outputs.empty()) return 0;
  uint64_t min_topo_nr = std::numeric_limits<uint64_t>::max();
  for (const Edge& edge : outputs) {
    min_topo_nr = std::min(min_topo_nr, edge.function->topological_nr());
  }
  return min_topo_nr;
}

// Whether every gradient fn takes is a host tensor, so that fn runs on its pass's owner thread
// (Note [Fewer atomics per Node]).
bool InputsOnHost(const Node& fn) {
  for (uint32_t i = 0; i < fn.num_inputs(); ++i) {
    if (!fn.input_metadata(i).device.is_cpu()) return false;
  }
  return true;
}

// Whether a queued task's pass is held (its control block; no atomic operation).
bool SamePass(const std::weak_ptr<GraphTask>& task_pass, const std::shared_ptr<GraphTask>& held) {
  return held != nullptr && !task_pass.owner_before(held) && !held.owner_before(task_pass);
}

// Checks the gradients a Node returned against what the Nodes they flow to expect.
void validate_outputs(const Node& fn, const TensorList& grads) {
  const EdgeList& edges = fn.next_edges();
  if (grads.size() != edges.size()) {
    ThrowStatus(absl::InternalError(absl::StrCat(fn.DebugName(), " returned ", grads.size(),
                                                 " gradients, expected ", edges.size())));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& grad = grads[i];
    if (!edges[i].is_valid() || !grad.defined()) continue;
    const InputMetadata& md = edges[i].function->input_metadata(edges[i].input_nr);
    if (!SameShape(grad.shape(), md.shape) || grad.dtype() != md.dtype ||
        grad.device() != md.device) {
      ThrowStatus(absl::InternalError(
          absl::StrCat(fn.DebugName(), " returned an invalid gradient at index ", i, ": got ",
                       grad.DebugString(), " but expected ", DTypeName(md.dtype),
                       ShapeToString(md.shape), " on ", DeviceName(md.device))));
    }
  }
}

// Runs a Node's pre-hooks, apply() and post-hooks (Note [Undefined gradients]).
TensorList call_function(const GraphTask& graph_task, Node& fn, TensorList grads) {
  for (const auto& hook : fn.pre_hooks()) grads = (*hook)(grads);
  bool any_defined = false;
  bool all_defined = true;
  for (const Tensor& g : grads) {
    any_defined |= g.defined();
    all_defined &= g.defined();
  }
  TensorList outputs;
  if (!any_defined && fn.num_inputs() > 0) {
    outputs.resize(fn.num_outputs());
  } else {
    if (!all_defined) {
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) grads[i] = fn.input_metadata(i).Zeros();
      }
    }
    if (fn.post_hooks().empty()) {
      outputs = fn.apply(std::move(grads));
    } else {
      TensorList inputs = grads;
      outputs = fn.apply(std::move(grads));
      validate_outputs(fn, outputs);
      for (const auto& hook : fn.post_hooks()) outputs = (*hook)(outputs, inputs);
    }
  }
  validate_outputs(fn, outputs);
  if (!graph_task.keep_graph_) fn.release_variables();
  return outputs;
}

}  // namespace

Engine& Engine::Get() {
  static Engine engine;
  return engine;
}

Engine::~Engine() {
  {
    MutexLock lock(&device_mutex_);
    for (auto& queue : device_ready_queues_) {
      if (queue) queue->push_shutdown_task();
    }
  }
  {
    MutexLock lock(&pool_mutex_);
    pool_shutdown_ = true;
  }
  pool_work_.SignalAll();
  // Threads are joined without the locks, which they may need on their way out.
  std::vector<std::thread> threads;
  {
    MutexLock lock(&device_mutex_);
    threads.swap(device_threads_);
  }
  {
    MutexLock lock(&pool_mutex_);
    for (auto& t : pool_threads_) threads.push_back(std::move(t));
    pool_threads_.clear();
  }
  for (auto& t : threads) t.join();
}

int Engine::device_index(Device device) {
  if (device.is_cpu()) return kCpuDevice;
  return static_cast<int>(device.type) * kMaxDevicesPerType + device.index;
}

int Engine::device_threads_started() const {
  MutexLock lock(&device_mutex_);
  return static_cast<int>(device_threads_.size());
}

void Engine::compute_dependencies(Node* root, GraphTask& task, uint64_t min_topo_nr) {
  // Breadth-agnostic walk over every Node reachable from the root, counting for each how many
  // edges lead into it. Nodes below min_topo_nr cannot reach an output: their edges are not
  // followed.
  // The root's topological_nr is the length of the longest path below it: a lower bound on
  // the number of Nodes, exact for a chain. Reserving it spares most rehashes as the table
  // grows (capped, since it only sizes a hint). Past that, the table is made bigger before the
  // Node that would make it grow by itself, charged to the pass's budget first (Note
  // [GraphTask node table]); so a graph too big for the budget stops here.
  size_t room =
      task.ReserveNodeTable(std::min<uint64_t>(root->topological_nr() + 1, uint64_t{1} << 20));
  std::vector<Node*> queue{root};
  task.nodes_in_graph_.try_emplace(root);
  bool host_only = InputsOnHost(*root);
  while (!queue.empty()) {
    Node* fn = queue.back();
    queue.pop_back();
    if (fn->topological_nr() < min_topo_nr) continue;
    for (const Edge& edge : fn->next_edges()) {
      Node* next = edge.function.get();
      if (next == nullptr) continue;
      if (task.nodes_in_graph_.size() >= room) {
        room = task.ReserveNodeTable(task.nodes_in_graph_.size() + 1);
      }
      auto [it, inserted] = task.nodes_in_graph_.try_emplace(next);
      it->second.dependencies_ += 1;
      if (inserted) {
        queue.push_back(next);
        host_only = host_only && InputsOnHost(*next);
      }
    }
  }
  task.one_thread_ = host_only;
}

absl::StatusOr<TensorList> Engine::execute(const EdgeList& roots, TensorList seeds,
                                           const ExecuteOptions& options, const EdgeList& outputs) {
  const bool reentrant = worker_device != kNoDevice;
  auto graph_task = std::make_shared<GraphTask>(
      options.keep_graph, options.create_graph, reentrant ? total_depth + 1 : 0,
      reentrant ? local_ready_queue : std::make_shared<ReadyQueue>());
  graph_task->anomaly_mode_ = options.anomaly_mode;
  graph_task->sole_pass_ = options.sole_pass;
  const GraphTask* parent = reentrant ? current_graph_task : nullptr;
  graph_task->cancel_ = options.cancel != nullptr ? options.cancel
                        : parent != nullptr       ? parent->cancel_
                                                  : nullptr;
  graph_task->budget_ = options.budget != nullptr ? options.budget : CurrentMemoryBudget();
  graph_task->math_mode_ = CurrentMathMode();
  graph_task->device_choice_ = CurrentDeviceChoice();

  // A single root starts the pass itself; several need a GraphRoot to hand out their seeds.
  const bool skip_dummy_node = roots.size() == 1;
  std::shared_ptr<Node> graph_root =
      skip_dummy_node ? roots[0].function : MakeNode<GraphRoot>(roots, seeds);
  const uint64_t min_topo_nr = compute_min_topological_nr(outputs);
  compute_dependencies(graph_root.get(), *graph_task, min_topo_nr);
  if (!outputs.empty()) {
    graph_task->init_to_execute(*graph_root, outputs, options.accumulate_grad, min_topo_nr);
  }
  InputBuffer input_buffer(skip_dummy_node ? graph_root->num_inputs() : 0);
  if (skip_dummy_node) input_buffer.add(roots[0].input_nr, std::move(seeds[0]));
  absl::StatusOr<TensorList> result =
      execute_with_graph_task(graph_task, std::move(graph_root), std::move(input_buffer))->Wait();
  if (options.stats != nullptr) {
    options.stats->nodes_in_graph = static_cast<int64_t>(graph_task->nodes_in_graph_.size());
    options.stats->nodes_executed = graph_task->nodes_executed_.load(std::memory_order_relaxed);
  }
  return result;
}

std::shared_ptr<GraphFuture> Engine::execute_with_graph_task(
    const std::shared_ptr<GraphTask>& graph_task, std::shared_ptr<Node> graph_root,
    InputBuffer input_buffer) {
  graph_task->owner_ = worker_device == kNoDevice ? kCpuDevice : worker_device;
  // A cancel fails the pass at once and wakes its owner, which may be waiting for a device. A
  // pass on one thread (one_thread_: every Node on the host) has no owner to wake: the thread
  // that runs it only waits for its own queue, which holds the pass's next task until the pass
  // is done, and it checks the token before every Node (thread_main) as the kernels check it
  // inside long ops. So such a pass registers nothing, sparing each pass (each small request's
  // call) a callback's allocation and two locks of the token.
  if (graph_task->cancel_ != nullptr && !graph_task->one_thread_) {
    std::weak_ptr<GraphTask> weak = graph_task;
    graph_task->cancel_callback_id_ = graph_task->cancel_->AddCallback([this, weak] {
      std::shared_ptr<GraphTask> task = weak.lock();
      if (task == nullptr) return;
      task->set_exception(task->cancel_->Check(), nullptr);
      ready_queue_by_index(task->cpu_ready_queue_, task->owner_)
          ->push(NodeTask(task, nullptr, InputBuffer(0), task->reentrant_depth_));
    });
  }
  std::shared_ptr<ReadyQueue> queue =
      ready_queue(graph_task->cpu_ready_queue_, input_buffer.device());
  queue->push(NodeTask(graph_task, std::move(graph_root), std::move(input_buffer),
                       graph_task->reentrant_depth_));

  if (worker_device == kNoDevice) {
    // Not reentrant: this thread becomes the owner and works until the pass is over.
    worker_device = kCpuDevice;
    local_ready_queue = graph_task->cpu_ready_queue_;
    thread_main(graph_task);
    local_ready_queue.reset();
    worker_device = kNoDevice;
  } else if (current_depth >= kMaxDepth) {
    // Too deep for this thread: a pool thread runs the pass while the caller waits.
    add_thread_pool_task(graph_task);
  } else {
    ++total_depth;
    ++current_depth;
    thread_main(graph_task);
    --current_depth;
    --total_depth;
  }
  return graph_task->future_result_;
}

// Note [Handing the next task over]
// A Node usually makes the very Node ready that this thread pops next: in a chain the queue
// holds nothing else, and in most graphs the newest Node (highest sequence_nr) wins. Pushing it
// and popping it back costs two locks, a heap insertion and removal and a wake-up call, about a
// sixth of a small Node's time. So evaluate_function hands a ready task straight back to
// thread_main instead, when it goes to this thread's own queue and would be popped before
// everything queued there (Note [ReadyQueue order]); when the same Node makes several tasks
// ready, the one handed over is the first in that order and the rest are queued. So the order is
// PyTorch's. A task pushed by another thread after the check could have been popped first; that
// is a race PyTorch has too (whichever push happens first). The handed-over task takes over the
// count in outstanding_tasks_ of the task that made it ready: the worker neither counts it nor
// uncounts the task it ran, two atomic read-modify-writes fewer per Node of a chain, and the
// pass is never seen complete while it waits. One queued after all (a later task of the same
// Node runs first) is counted as it is queued. Nor does it name its GraphTask, as a queued
// task does with a weak pointer that the worker locks: the thread keeps the strong one it
// holds for the Node before, two atomic operations fewer again, and names the pass only if
// the task is queued after all.
//
// Note [Fewer atomics per Node]
// Once the hand-over above spared the queue, a small Node's own cost in the Engine was mostly
// atomic read-modify-writes, each a full memory barrier on x86: its lock and unlock (Note
// [Node thread safety]), the pass's lock and unlock around handing its gradients on, the count
// of Nodes run and, for a task that went through the queue, the weak pass locked and the held
// one let go. perf put about three fifths of evaluate_function's own samples on the first five
// in fanin_2k's backward. Four ways take them off the common path:
//  - A pass whose Nodes all take their gradients on the host (compute_dependencies checks each
//    Node's input metadata) runs all of them on its owner thread: no device thread ever runs
//    one of its Nodes, so nothing touches the table's dependencies_ and not_ready_ but that
//    thread, or a thread it handed the pass to through a ready queue or its future, whose
//    locks order the accesses. Such a pass hands gradients on without mutex_ (one_thread_).
//    The captures and post-processing still take it: they are once per pass.
//  - A Node's lock guards it against another pass running it at the same moment. A caller
//    that knows there is none (ExecuteOptions::sole_pass: the server's requests and sessions
//    run one call at a time on a graph that is theirs alone) lets every Node run without it.
//    A pass nested inside (a checkpoint's recomputation) takes its Nodes' locks as usual.
//  - A pass's owner keeps the pass it holds when the next task it pops is of the same pass
//    (compared by control block), instead of locking the task's weak pointer and letting go of
//    the one it held. A device thread still lets go before it waits.
//  - A thread counts the Nodes it runs in a local and adds them to nodes_executed_ when the
//    pass it holds changes, when it records an error and when it returns; for a pass not on
//    one thread, also before each task it counts done (another thread may end that pass). So
//    the count is whole when the owner reads it, after its thread_main returns.
// And the table entries of the Nodes a Node's gradients go to are prefetched before it runs
// (Note [A small node table entry]). Measured on fanin_2k backward: 1.02 to 0.88 ms
// (docs/benchmarks.md).

void Engine::thread_main(const std::shared_ptr<GraphTask>& graph_task) {
  BusyScope busy;  // Note [Engine busy time]
  const absl::Time deadline =
      graph_task != nullptr ? graph_task->deadline() : absl::InfiniteFuture();
  std::optional<NodeTask> handoff;
  // The pass of the task being run. Kept for a task handed over, which is the same pass's. A
  // device thread lets go of it before waiting for the queue, so that an idle worker keeps no
  // pass alive; a pass's owner keeps it for the next task of the same pass (Note [Fewer
  // atomics per Node]) and lets go when it returns.
  std::shared_ptr<GraphTask> local_graph_task;
  // Nodes of local_graph_task this thread ran and has not yet added to its count (Note
  // [Fewer atomics per Node]).
  int64_t executed = 0;
  auto add_executed = [&] {
    if (executed == 0) return;
    local_graph_task->nodes_executed_.fetch_add(executed, std::memory_order_relaxed);
    executed = 0;
  };
  while (graph_task == nullptr || !graph_task->future_result_->completed()) {
    // Step 1: take the task handed over by the last Node, else the next one from the queue, or
    // give up waiting at the pass's deadline.
    std::optional<NodeTask> popped;
    const bool handed_over = handoff.has_value();
    if (handed_over) {
      popped = std::move(handoff);
      handoff.reset();
    } else {
      if (graph_task == nullptr) {
        add_executed();
        local_graph_task.reset();
      }
      if (deadline == absl::InfiniteFuture()) {
        popped.emplace(local_ready_queue->pop());
      } else {
        popped = local_ready_queue->pop(deadline);
        if (!popped.has_value()) {
          absl::Status status = graph_task->cancel_->Check();
          if (status.ok()) {
            status = absl::DeadlineExceededError("the call's deadline passed during the backward");
          }
          graph_task->set_exception(std::move(status), nullptr);
          continue;
        }
      }
    }
    NodeTask& task = *popped;
    if (task.is_shutdown_task) break;
    // Step 2: skip tasks of passes that are gone (Note [GraphTask lifetime]). A task handed
    // over names no pass: it is the one this thread holds.
    if (!handed_over && !SamePass(task.base, local_graph_task)) {
      add_executed();
      local_graph_task = task.base.lock();
    }
    if (local_graph_task == nullptr) continue;
    // Step 3: evaluate the Node, unless the pass already failed or was cancelled.
    if (task.fn != nullptr && !local_graph_task->has_error_.load(std::memory_order_acquire)) {
      GraphTaskScope scope(local_graph_task.get());
      try {
        // Before every Node: no clock read (Note [A deadline set by a timer]).
        if (local_graph_task->cancel_ != nullptr) {
          ThrowIfError(local_graph_task->cancel_->CheckCancelled());
        }
        evaluate_function(local_graph_task, task.fn.get(), task.inputs, task.exec_info, &handoff,
                          &executed);
      } catch (const StatusError& e) {
        add_executed();
        local_graph_task->set_exception(e.status(), task.fn.get());
      } catch (const std::exception& e) {
        add_executed();
        local_graph_task->set_exception(absl::InternalError(e.what()), task.fn.get());
      }
    }
    // Step 4: count the task done, unless the task handed over holds its count (Note [Handing
    // the next task over]); whoever finishes the pass resolves it and, if that is not the
    // owner, wakes the owner.
    task = NodeTask({}, nullptr, InputBuffer(0), 0);  // free the buffers before waking anyone
    if (handoff.has_value()) continue;
    // Another thread may end a pass that is not on one thread: its count must be whole first.
    if (!local_graph_task->one_thread_) add_executed();
    local_graph_task->outstanding_tasks_.fetch_sub(1, std::memory_order_acq_rel);
    if (local_graph_task->completed()) {
      local_graph_task->mark_as_completed_and_run_post_processing();
      const int owner = local_graph_task->owner_;
      if (worker_device != owner) {
        ready_queue_by_index(local_graph_task->cpu_ready_queue_, owner)
            ->push(NodeTask(local_graph_task, nullptr, InputBuffer(0),
                            local_graph_task->reentrant_depth_));
      }
    }
  }
  // A nested pass can end with a task of an outer one handed over: queue it for the outer loop,
  // naming its pass, with the count it holds.
  add_executed();
  if (handoff.has_value()) {
    handoff->base = local_graph_task;
    local_ready_queue->push(std::move(*handoff), /*increment_outstanding_tasks=*/false);
  }
}

void Engine::evaluate_function(const std::shared_ptr<GraphTask>& graph_task, Node* func,
                               InputBuffer& inputs, const ExecInfo* exec_info,
                               std::optional<NodeTask>* handoff, int64_t* executed) {
  // Note [Streams in the backward pass]: the Node runs on its forward op's stream.
  const Stream stream = func->stream();
  StreamScope on_stream(stream);
  TensorList outputs;
  {
    // Note [Node thread safety].
    OptionalMutexLock node_lock(graph_task->sole_pass_ ? nullptr : &func->mutex());
    TensorList grads = InputBuffer::variables(std::move(inputs));
    for (const auto& [input_nr, hook] : func->tensor_pre_hooks()) {
      if (grads[input_nr].defined()) grads[input_nr] = (*hook)(grads[input_nr]);
    }
    if (graph_task->exec_info_used()) {
      if (exec_info == nullptr) {
        auto it = graph_task->nodes_in_graph_.find(func);
        if (it == graph_task->nodes_in_graph_.end()) return;
        exec_info = &it->second.exec_info_;
      }
      const ExecInfo& info = *exec_info;
      if (info.num_captures_ > 0) {
        MutexLock lock(&graph_task->mutex_);
        for (uint32_t k = 0; k < info.num_captures_; ++k) {
          const ExecInfo::Capture& capture = graph_task->captures_[info.first_capture_ + k];
          graph_task->captured_vars_[capture.output_idx_] = grads[capture.input_idx_];
        }
      }
      if (!info.needed_) return;
    }
    ++*executed;
    // The table entries of the Nodes its gradients go to, looked up below: on a big graph they
    // are seldom in the cache, and they load while the Node runs (Note [A small node table
    // entry]).
    for (const Edge& next : func->next_edges()) {
      if (next.function != nullptr) graph_task->nodes_in_graph_.prefetch(next.function.get());
    }
    outputs = call_function(*graph_task, *func, std::move(grads));
  }
  if (outputs.empty()) return;

  if (graph_task->anomaly_mode_) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && HasNaN(outputs[i])) {
        ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
            "anomaly detected: ", func->DebugName(), " returned NaN values in its output ", i)));
      }
    }
  }

  // Hand each gradient to the Node it flows to; queue those that now have all their inputs,
  // or hand one over (Note [Handing the next task over]).
  OptionalMutexLock lock(graph_task->one_thread_ ? nullptr : &graph_task->mutex_);
  if (stream.has_stream() &&
      absl::c_find(graph_task->streams_used_, stream) == graph_task->streams_used_.end()) {
    graph_task->streams_used_.push_back(stream);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Edge& next = func->next_edge(i);
    if (!next.is_valid()) continue;
    Node* next_fn = next.function.get();
    auto it = graph_task->nodes_in_graph_.find(next_fn);
    if (it == graph_task->nodes_in_graph_.end() || it->second.dependencies_ <= 0) {
      ThrowStatus(
          absl::InternalError(absl::StrCat("dependency of ", next_fn->DebugName(), " not found")));
    }
    GraphTask::NodeState& state = it->second;
    const bool is_ready = --state.dependencies_ == 0;
    if (state.not_ready_.size() == 0) {  // the first input to arrive
      // Skip Nodes that are not to run (off every path to the outputs).
      if (graph_task->exec_info_used() && !state.exec_info_.should_execute()) continue;
      state.not_ready_ = InputBuffer(next_fn->num_inputs());
    }
    if (stream.has_stream()) {
      state.not_ready_.add(next.input_nr, std::move(outputs[i]), stream,
                           next_fn->input_metadata(next.input_nr).stream);
    } else {
      state.not_ready_.add(next.input_nr, std::move(outputs[i]));
    }
    if (is_ready) {
      InputBuffer input_buffer = std::exchange(state.not_ready_, InputBuffer());
      // A pass on one thread has host gradients only (Note [Fewer atomics per Node]).
      const Device device = graph_task->one_thread_ ? kCPU : input_buffer.device();
      // CPU Nodes (most) go to the pass's own queue, which it keeps alive.
      std::shared_ptr<ReadyQueue> device_queue;
      ReadyQueue* queue = graph_task->cpu_ready_queue_.get();
      if (!device.is_cpu()) {
        device_queue = ready_queue(graph_task->cpu_ready_queue_, device);
        queue = device_queue.get();
      }
      // A queued task names its pass (weakly); the task handed over names none, as the thread
      // running it holds its pass (Note [Handing the next task over]).
      NodeTask task({}, next.function, std::move(input_buffer), graph_task->reentrant_depth_);
      task.exec_info = &state.exec_info_;
      auto push = [&](NodeTask&& queued) {
        queued.base = graph_task;
        queue->push(std::move(queued), *graph_task);
      };
      if (queue != local_ready_queue.get()) {
        push(std::move(task));
        continue;
      }
      // The handed-over task always runs before everything in this thread's queue. It holds
      // the count of the task this thread runs now (Note [Handing the next task over]), so one
      // it gives way to is counted as it is queued.
      if (handoff->has_value()) {
        if (!ReadyQueue::CompareNodeTaskTime()(**handoff, task)) {
          push(std::move(task));
          continue;
        }
        push(std::move(**handoff));
        handoff->reset();
      } else if (!queue->RunsBeforeAllQueued(task)) {
        push(std::move(task));
        continue;
      }
      handoff->emplace(std::move(task));
    }
  }
}

std::shared_ptr<ReadyQueue> Engine::ready_queue(const std::shared_ptr<ReadyQueue>& cpu_ready_queue,
                                                Device device) {
  return ready_queue_by_index(cpu_ready_queue, device_index(device));
}

std::shared_ptr<ReadyQueue> Engine::ready_queue_by_index(
    const std::shared_ptr<ReadyQueue>& cpu_ready_queue, int index) {
  if (index == kCpuDevice) return cpu_ready_queue;
  MutexLock lock(&device_mutex_);
  std::shared_ptr<ReadyQueue>& queue = device_ready_queues_[index];
  if (queue == nullptr) {
    // First use of this device: its worker thread starts, once.
    queue = std::make_shared<ReadyQueue>();
    device_threads_.emplace_back(&Engine::device_thread_main, this, index, queue);
  }
  return queue;
}

void Engine::device_thread_main(int index, std::shared_ptr<ReadyQueue> queue) {
  worker_device = index;
  SetEngineThreadKind(EngineThread::kDevice);
  const Device device{static_cast<DeviceType>(index / kMaxDevicesPerType),
                      static_cast<int16_t>(index % kMaxDevicesPerType)};
  if (DeviceBackend* backend = DeviceRegistry::Get().backend(device.type)) {
    try {
      backend->InitializeThread(device.index);
    } catch (const StatusError&) {
      // The device's first kernel fails with the same error, and names the Node.
    }
  }
  local_ready_queue = std::move(queue);
  thread_main(nullptr);
  local_ready_queue.reset();
}

void Engine::add_thread_pool_task(const std::weak_ptr<GraphTask>& graph_task) {
  {
    MutexLock lock(&pool_mutex_);
    pool_graph_tasks_.push_back(graph_task);
    // Every queued pass needs a thread of its own: its caller is blocked until it finishes.
    if (pool_idle_threads_ < static_cast<int>(pool_graph_tasks_.size())) {
      pool_threads_.emplace_back(&Engine::reentrant_thread_main, this);
      pool_threads_started_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  pool_work_.Signal();
}

void Engine::reentrant_thread_main() {
  SetEngineThreadKind(EngineThread::kReentrant);
  while (true) {
    std::shared_ptr<GraphTask> graph_task;
    {
      MutexLock lock(&pool_mutex_);
      ++pool_idle_threads_;
      pool_work_.Wait(&pool_mutex_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return pool_shutdown_ || !pool_graph_tasks_.empty();
      });
      --pool_idle_threads_;
      if (pool_graph_tasks_.empty()) return;  // shut down
      graph_task = pool_graph_tasks_.front().lock();
      pool_graph_tasks_.pop_front();
    }
    if (graph_task == nullptr) continue;
    // Work as the pass's owner, from the owner's queue, at the pass's depth.
    worker_device = graph_task->owner_;
    local_ready_queue = ready_queue_by_index(graph_task->cpu_ready_queue_, graph_task->owner_);
    total_depth = graph_task->reentrant_depth_;
    current_depth = 0;
    thread_main(graph_task);
    local_ready_queue.reset();
    worker_device = kNoDevice;
  }
}

}  // namespace gradserve::autograd
