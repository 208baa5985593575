#include "server/run/worker_pool.h"

#include <utility>

#include "absl/time/clock.h"

namespace gradserve::server {

WorkerPool::WorkerPool(int num_threads) {
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
  }
  ready_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  {
    MutexLock lock(&mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.Signal();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(&mutex_);
      ready_.Wait(&mutex_,
                  [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const int64_t start = absl::GetCurrentTimeNanos();
    task();
    busy_ns_.fetch_add(absl::GetCurrentTimeNanos() - start, std::memory_order_relaxed);
  }
}

}  // namespace gradserve::server
