// ReadyQueue: the NodeTasks one worker thread may run next, in priority order.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_READY_QUEUE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_READY_QUEUE_H_

#include <atomic>
#include <optional>
#include <queue>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "engine/autograd/node_task.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

struct GraphTask;

// Note [ReadyQueue order]
// pop() returns, first, a shutdown task; then empty wake-up tasks; then the task of the deepest
// reentrant backward (so a nested backward finishes before its parent goes on); then, within
// one depth, the Node with the highest sequence_nr (the most recently created, approximating
// reverse topological order). Each device has one ReadyQueue (one worker thread); each
// GraphTask started outside the Engine's threads has its own CPU ReadyQueue that its nested
// reentrant GraphTasks share.
//
// Thread safety: all methods may be called from any thread at once.
class ReadyQueue {
 public:
  // Pushes a task. If increment_outstanding_tasks, counts it in its GraphTask's
  // outstanding_tasks_ first (the worker that pops it uncounts it).
  void push(NodeTask task, bool increment_outstanding_tasks = true);
  // Counts the task in pass, which must be the pass it names and which the caller holds, and
  // pushes it: the count without locking the task's weak pointer to its pass.
  void push(NodeTask task, GraphTask& pass);
  void push_shutdown_task();

  // Blocks until a task is there.
  NodeTask pop();
  // As pop(), giving up at deadline (nullopt then).
  std::optional<NodeTask> pop(absl::Time deadline);

  size_t size() const;

  // True if task would be popped before every task queued now (Note [ReadyQueue order]).
  bool RunsBeforeAllQueued(const NodeTask& task) const;

  // The queue's order: true if t1 runs after t2.
  struct CompareNodeTaskTime {
    bool operator()(const NodeTask& t1, const NodeTask& t2) const;
  };

 private:
  // Pushes a task already counted (or not to be) and wakes the worker.
  void PushCounted(NodeTask task);

  mutable Mutex mutex_;
  CondVar not_empty_;
  std::priority_queue<NodeTask, std::vector<NodeTask>, CompareNodeTaskTime> heap_
      ABSL_GUARDED_BY(mutex_);
  // heap_.size(), written under mutex_, read without it by RunsBeforeAllQueued: an empty queue
  // (every Node of a chain) answers with one load, not a lock.
  std::atomic<size_t> queued_{0};
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_READY_QUEUE_H_
