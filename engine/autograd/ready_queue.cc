#include "engine/autograd/ready_queue.h"

#include "engine/autograd/busy_time.h"
#include "engine/autograd/graph_task.h"

namespace gradserve::autograd {
bool ReadyQueue::CompareNodeTaskTime::operator()(const NodeTask& t1, const NodeTask& t2) const {
  // Note [ReadyQueue order].
  if (t2.is_shutdown_task) return true;
  if (t1.is_shutdown_task) return false;
  if (!t2.fn) return true;
  if (!t1.fn) return false;
  if (t1.reentrant_depth != t2.reentrant_depth) return t1.reentrant_depth < t2.reentrant_depth;
  return t1.fn->sequence_nr() < t2.fn->sequence_nr();
}

void ReadyQueue::push(NodeTask task, bool increment_outstanding_tasks) {
  if (increment_outstanding_tasks) {
    if (auto graph_task = task.base.lock()) {
      graph_task->outstanding_tasks_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  PushCounted(std::move(task));
}

void ReadyQueue::push(NodeTask task, GraphTask& pass) {
  pass.outstanding_tasks_.fetch_add(1, std::memory_order_relaxed);
  PushCounted(std::move(task));
}

void ReadyQueue::PushCounted(NodeTask task) {
  {
    MutexLock lock(&mutex_);
    heap_.push(std::move(task));
    queued_.store(heap_.size(), std::memory_order_release);
  }
  not_empty_.Signal();
}

void ReadyQueue::push_shutdown_task() {
  {
    MutexLock lock(&mutex_);
    heap_.push(NodeTask({}, nullptr, InputBuffer(0), 0, /*is_shutdown_task=*/true));
    queued_.store(heap_.size(), std::memory_order_release);
  }
  not_empty_.Signal();
}

NodeTask ReadyQueue::pop() {
  MutexLock lock(&mutex_);
  if (heap_.empty()) {
    BusyPause waiting;  // Note [Engine busy time]
    not_empty_.Wait(&mutex_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !heap_.empty(); });
  }
  // priority_queue::top is const; the task is moved out just before it is popped.
  NodeTask task = std::move(const_cast<NodeTask&>(heap_.top()));
  heap_.pop();
  queued_.store(heap_.size(), std::memory_order_release);
  return task;
}

std::optional<NodeTask> ReadyQueue::pop(absl::Time deadline) {
  MutexLock lock(&mutex_);
  if (heap_.empty()) {
    BusyPause waiting;  // Note [Engine busy time]
    if (!not_empty_.WaitWithDeadline(&mutex_, deadline, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !heap_.empty();
        })) {
      return std::nullopt;
    }
  }
  NodeTask task = std::move(const_cast<NodeTask&>(heap_.top()));
  heap_.pop();
  queued_.store(heap_.size(), std::memory_order_release);
  return task;
}

size_t ReadyQueue::size() const {
  MutexLock lock(&mutex_);
  return heap_.size();
}

bool ReadyQueue::RunsBeforeAllQueued(const NodeTask& task) const {
  // A push that the load misses could have come a moment later: the race Note [Handing the
  // next task over] accepts either way.
  if (queued_.load(std::memory_order_acquire) == 0) return true;
  MutexLock lock(&mutex_);
  return heap_.empty() || !CompareNodeTaskTime()(task, heap_.top());
}

}  // namespace gradserve::autograd
