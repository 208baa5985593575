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

#include <atomic>
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

// Note [Node locks without a call]
// Each Node the engine runs takes two locks, its own (Note [Node thread safety]) and its pass's
// (GraphTask::mutex_), almost never contended: one thread runs a pass's CPU Nodes. With
// std::mutex each lock and unlock was a call into glibc, about 55 instructions a pair: 3% of
// the instructions of a whole `engine_bench --scenario=fanin_2k` run under callgrind, though
// only its backward passes take them. FastMutex is the classic three-state futex mutex (0
// free, 1 held, 2 held with a thread waiting): an uncontended Lock is one compare-and-swap and
// an Unlock one exchange, both inline; only a contended lock goes to the kernel (FUTEX_WAIT),
// and only an unlock that finds a waiter wakes one. The acquire and release orders of those
// atomics are what ThreadSanitizer sees (it models atomics), so the data FastMutex guards is
// checked as under any mutex. It has no CondVar: the locks that are waited on (ReadyQueue's,
// GraphFuture's) stay Mutex.
class ABSL_LOCKABLE FastMutex {
 public:
  FastMutex() = default;
  FastMutex(const FastMutex&) = delete;
  FastMutex& operator=(const FastMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    int free = 0;
    if (state_.compare_exchange_strong(free, 1, std::memory_order_acquire)) [[likely]] {
      return;
    }
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]] {
      WakeOne();
    }
  }

 private:
  // Waits in the kernel until the mutex is free, and takes it marked as having waiters.
  void LockSlow();
  // Wakes one thread waiting in LockSlow.
  void WakeOne();

  std::atomic<int> state_{0};
};

// Holds a Mutex or a FastMutex for its scope.
template <typename M>
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(M* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  M* const mu_;
};

// Holds mu for its scope, or nothing when mu is null: for data that a caller knows only one
// thread can reach at a time.
template <typename M>
class ABSL_SCOPED_LOCKABLE OptionalMutexLock {
 public:
  explicit OptionalMutexLock(M* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    if (mu_ != nullptr) mu_->Lock();
  }
  ~OptionalMutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  OptionalMutexLock(const OptionalMutexLock&) = delete;
  OptionalMutexLock& operator=(const OptionalMutexLock&) = delete;

 private:
  M* const mu_;
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
