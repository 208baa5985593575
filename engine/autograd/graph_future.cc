#include "engine/autograd/graph_future.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"

namespace gradserve::autograd {
namespace {

// A copy of status that shares nothing with it. absl::Status shares its message through a
// reference count inside Debian's Abseil, which ThreadSanitizer cannot see; a waiter that
// shared the rep with the thread that resolved the future (and may free it) would be reported
// as a race. Payloads are copied flat for the same reason.
absl::Status UnsharedCopy(const absl::Status& status) {
  absl::Status copy(status.code(), std::string(status.message()));
  status.ForEachPayload([&copy](absl::string_view type_url, const absl::Cord& payload) {
    copy.SetPayload(type_url, absl::Cord(std::string(payload)));
  });
  return copy;
}

}  // namespace

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
  if (!result_.ok()) return UnsharedCopy(result_.status());
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
