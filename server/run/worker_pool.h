// The engine CPU workers: the threads that run requests (record the graph, run its backward
// calls), so that no gRPC thread ever waits on the Engine. Each plays the part of PyTorch's
// calling thread for the GraphTasks it starts.

#ifndef GRADSERVE_SERVER_RUN_WORKER_POOL_H_
#define GRADSERVE_SERVER_RUN_WORKER_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

// A fixed set of threads taking tasks in FIFO order. The queue is unbounded: its callers bound
// it (the server admits at most --max_in_flight requests).
//
// Thread safety: Submit may be called from any thread. The destructor runs every task already
// submitted, then joins the threads; it must not run on a worker thread.
class WorkerPool {
 public:
  explicit WorkerPool(int num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues task to run on some worker. Tasks must not throw.
  void Submit(std::function<void()> task);

  int num_threads() const { return static_cast<int>(threads_.size()); }
  // Nanoseconds the workers together spent running tasks (for the metrics); a task counts
  // once it has returned.
  int64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  // A std::mutex: cheaper to wake a worker with than Debian's absl::Mutex, which runs a
  // deadlock detector on every lock (Note [Why not absl::Mutex]).
  Mutex mutex_;
  CondVar ready_;  // signalled when queue_ gains a task or stopping_ is set
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::atomic<int64_t> busy_ns_{0};  // relaxed: a sum, read only by scrapes
  std::vector<std::thread> threads_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_RUN_WORKER_POOL_H_
