#include "engine/autograd/graph_future.h"

#include <utility>

namespace gradserve::autograd {

bool GraphFuture::Resolve(Result result) {
  std::vector<std::function<void(const Result&)>> callbacks;
  {
    MutexLock lock(&mutex_);
    if (completed_) return false;
    result_ = std::move(result);
    completed_ = true;
    completed_flag_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  resolved_.SignalAll();
  // result_ never changes once completed_, so reading it unlocked is safe.
  for (auto& fn : callbacks) fn(result_);
  return true;
}

bool GraphFuture::completed() const { return completed_flag_.load(std::memory_order_acquire); }

GraphFuture::Result GraphFuture::Wait() const {
  MutexLock lock(&mutex_);
  resolved_.Wait(&mutex_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return completed_; });
  return result_;
}

void GraphFuture::Then(std::function<void(const Result&)> fn) {
  {
    MutexLock lock(&mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(result_);
}

}  // namespace gradserve::autograd
