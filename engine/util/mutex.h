// Mutex and CondVar for the engine: std::mutex with Abseil's thread-safety annotations.
//
// Note [Why not absl::Mutex]
// The engine is tested under ThreadSanitizer, which must see every lock and unlock. Debian's
// Abseil is not built with ThreadSanitizer, so absl::Mutex (implemented inside that library)
// would be invisible to it and every field it guards would be reported as a race. std::mutex
// is intercepted by ThreadSanitizer; these wrappers keep ABSL_GUARDED_BY checking on top.
// Debian's absl::Mutex also runs a global deadlock detector that costs microseconds per Node
// made, locked and freed: more than the whole backward of a small Node.

#ifndef GRADSERVE_ENGINE_UTIL_MUTEX_H_
#define GRADSERVE_ENGINE_UTIL_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradserve {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Takes the mutex if no one holds it; never blocks. True if it did.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits on a condition guarded by a Mutex. Signal after changing the condition under the lock.
class CondVar {
 public:
  // Blocks until pred() is true; mu must be held, and is held again on return.
  template <typename Pred>
  void Wait(Mutex* mu, Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, pred);
    lock.release();
  }
  // As Wait, giving up at deadline; returns pred()'s last value.
  template <typename Pred>
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline, Pred pred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool ok = true;
    while (!pred()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        ok = false;
        break;
      }
      cv_.wait_for(lock, absl::ToChronoNanoseconds(left));
    }
    lock.release();
    return ok;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_MUTEX_H_
