// CancellationToken: how work that is under way learns that its caller gave up.

#ifndef GRADSERVE_ENGINE_UTIL_CANCELLATION_H_
#define GRADSERVE_ENGINE_UTIL_CANCELLATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"

namespace gradserve {

// Shared by the party that may cancel (the server's call, on a client's cancel or deadline) and
// the work (the interpreter between ops, the Engine between nodes).
//
// Thread safety: every method may be called from any thread at once.
class CancellationToken {
 public:
  explicit CancellationToken(absl::Time deadline = absl::InfiniteFuture()) : deadline_(deadline) {}

  // Asks the work to stop with `reason` (CANCELLED or DEADLINE_EXCEEDED). The first reason
  // wins. Runs the callbacks registered so far, on this thread.
  void Cancel(absl::Status reason);

  // OK while the work may go on; otherwise the reason it must stop. Past the deadline this
  // is DEADLINE_EXCEEDED even if nobody called Cancel. Cheap: one atomic load and a clock read.
  absl::Status Check() const;
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  absl::Time deadline() const { return deadline_; }

  // Runs fn when Cancel is called (at once, on this thread, if it already was). Returns an id
  // for RemoveCallback. fn must not call back into this token.
  int64_t AddCallback(std::function<void()> fn);
  void RemoveCallback(int64_t id);

 private:
  const absl::Time deadline_;
  std::atomic<bool> cancelled_{false};
  mutable Mutex mutex_;
  absl::Status reason_ ABSL_GUARDED_BY(mutex_);
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mutex_);
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_CANCELLATION_H_
