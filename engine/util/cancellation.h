// CancellationToken: how work that is under way learns that its caller gave up; and the
// thread's current token, which long kernels check between blocks of their work.
//
// Note [Stopping a running op]
// A deadline, a cancel or the server's shutdown must stop any op within 100 ms (DESIGN.md
// section 8), and one op (a 6144^3 matmul, a conv2d, a softmax over 2^28 elements) may run for
// seconds. So the token is not only checked between ops (the interpreter) and between Nodes
// (the Engine) but inside the kernels too, which live below autograd: the token lives here,
// in util, where every layer can see it. The work's owner makes its token current on the
// thread that does the work (CancellationScope): the graph interpreter around the forward pass
// and the backward calls, the Engine around each Node it evaluates, on whatever thread that is
// (as it installs the pass's MemoryBudget). A kernel counts the work it does in a WorkMeter,
// which calls ThrowIfCancelled() once per kWorkPerCheck units (elements; matrix products check
// between tiles of the product instead): one atomic load and one clock read per block, so tiny
// tensors never pay for a check, and a block takes well under a millisecond. ThrowIfCancelled
// throws StatusError with the token's status (CANCELLED or DEADLINE_EXCEEDED), which the
// interpreter and the Engine pass on with the op's or the Node's name, as any error of the op. A
// kernel stopped this way leaves its output partly written: it belongs to a request that has
// failed.

#ifndef GRADSERVE_ENGINE_UTIL_CANCELLATION_H_
#define GRADSERVE_ENGINE_UTIL_CANCELLATION_H_

#include <time.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"

namespace gradserve {

// Note [A coarse clock far from the deadline]
// The Engine checks its pass's token before every Node, and a 10,000-Node chain of small Nodes
// takes a few milliseconds: reading the precise clock each time (absl::Now(), about 130 ns
// here) cost the chain's backward more than 10%. CLOCK_MONOTONIC_COARSE is read from the vDSO
// without the cycle counter (about 35 ns here) and lags the true monotonic time by at most its
// resolution (one kernel tick, 1 to 10 ms). So the token turns its deadline, once, into a
// coarse time well before it, the deadline less two resolutions: a coarse reading below that is
// surely before the deadline, and Check() says OK inline. From there on (the last few ms before
// the deadline, and after it) Check() compares absl::Now() with the deadline itself, so
// DEADLINE_EXCEEDED comes exactly when it did, never early.
//
// Note [A deadline set by a timer]
// Even the coarse clock is too much for the Engine's check before every Node: about 20
// instructions and 5 ns here, 1 to 1.5% of the chain_10k and fanin_2k backward passes, most of
// what the limits cost them (docs/benchmarks.md, "Builds compared"). So a token with a deadline
// is also registered with one timer thread per process (made on first use), which cancels it
// with DEADLINE_EXCEEDED once absl::Now() has reached the deadline, never before; and the Engine
// asks CheckCancelled(), one atomic load, which sees the deadline as soon as the timer has
// fired: a few microseconds after it on an idle host, later when the host is saturated, still
// far within Note [Stopping a running op]'s 100 ms. Check() keeps reading the clock, for the
// kernels (once per block of work) and the interpreter (once per op), which must not depend on
// the timer thread being scheduled. The timer sleeps until the earliest deadline it holds; a
// registration wakes it only when it brings an earlier one, so a steady stream of calls with
// the same timeout costs it no wake-up per call, only a lock and a map insertion and removal.
// A token made with its deadline already passed is cancelled at once, without the timer.

namespace internal {
// CLOCK_MONOTONIC_COARSE in nanoseconds.
inline int64_t CoarseMonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
}  // namespace internal

// Shared by the party that may cancel (the server's call, on a client's cancel or deadline) and
// the work (the interpreter between ops, the Engine between nodes, the kernels between blocks:
// Note [Stopping a running op]).
//
// Thread safety: every method may be called from any thread at once.
class CancellationToken {
 public:
  // Registers a finite deadline with the deadline timer (Note [A deadline set by a timer]).
  explicit CancellationToken(absl::Time deadline = absl::InfiniteFuture());
  // Unregisters from the timer, waiting out a cancel the timer is making on another thread.
  ~CancellationToken();
  CancellationToken(const CancellationToken&) = delete;
  CancellationToken& operator=(const CancellationToken&) = delete;

  // Asks the work to stop with `reason` (CANCELLED or DEADLINE_EXCEEDED). The first reason
  // wins. Runs the callbacks registered so far, on this thread.
  void Cancel(absl::Status reason);

  // OK while the work may go on; otherwise the reason it must stop. Past the deadline this
  // is DEADLINE_EXCEEDED even if nobody called Cancel. Cheap far from the deadline: one atomic
  // load and a coarse clock read, inline (Note [A coarse clock far from the deadline]).
  absl::Status Check() const {
    if (ABSL_PREDICT_TRUE(!cancelled_.load(std::memory_order_acquire) &&
                          internal::CoarseMonotonicNanos() < coarse_safe_until_)) {
      return absl::OkStatus();
    }
    return CheckSlow();
  }
  // Like Check(), but reads no clock: OK until Cancel is called, by the work's owner or, once
  // the deadline has passed, by the deadline timer (Note [A deadline set by a timer]). For
  // checks too frequent for a clock read: the Engine's, before every Node.
  absl::Status CheckCancelled() const {
    if (ABSL_PREDICT_TRUE(!cancelled_.load(std::memory_order_acquire))) return absl::OkStatus();
    return CheckSlow();
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  absl::Time deadline() const { return deadline_; }

  // Runs fn when Cancel is called (at once, on this thread, if it already was). Returns an id
  // for RemoveCallback. fn must not call back into this token.
  int64_t AddCallback(std::function<void()> fn);
  void RemoveCallback(int64_t id);

 private:
  // Check() near or past the deadline, or once cancelled: the exact answer.
  absl::Status CheckSlow() const;

  const absl::Time deadline_;
  // CoarseMonotonicNanos() below this is surely before the deadline; INT64_MAX with none.
  const int64_t coarse_safe_until_;
  std::atomic<bool> cancelled_{false};
  // This token's entry with the deadline timer; -1 if it has none.
  int64_t timer_id_ = -1;
  mutable Mutex mutex_;
  absl::Status reason_ ABSL_GUARDED_BY(mutex_);
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mutex_);
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
};

namespace internal {
// The token of the work on this thread (CancellationScope). Inline, so that the Engine's scope
// per Node costs two thread-local moves and no call.
inline thread_local const CancellationToken* current_cancellation_token = nullptr;
}  // namespace internal

// The token of the work this thread is doing; null when none (nothing to check).
inline const CancellationToken* CurrentCancellationToken() {
  return internal::current_cancellation_token;
}

// Makes token (null: none) current on this thread for the scope's lifetime, then restores the
// previous one. Borrows the token, which must outlive the scope. Not movable; nest freely.
class CancellationScope {
 public:
  explicit CancellationScope(const CancellationToken* token)
      : previous_(internal::current_cancellation_token) {
    internal::current_cancellation_token = token;
  }
  ~CancellationScope() { internal::current_cancellation_token = previous_; }
  CancellationScope(const CancellationScope&) = delete;
  CancellationScope& operator=(const CancellationScope&) = delete;

 private:
  const CancellationToken* const previous_;
};

// Throws StatusError with the current token's status if the work must stop; returns at once
// when there is no current token or it says go on (Note [Stopping a running op]).
void ThrowIfCancelled();

// Units of work between two checks of the current token: elements for elementwise kernels and
// copies, element visits for reductions and rows. At a nanosecond or a few per unit, a block is
// well under a millisecond, and the check's clock read is lost in it.
inline constexpr int64_t kWorkPerCheck = int64_t{1} << 16;

// Counts the units of work a kernel does on this thread, and calls ThrowIfCancelled() each time
// another kWorkPerCheck have been done (Note [Stopping a running op]). Add() is a subtraction
// and a branch; make one meter per kernel call, on the stack. Not thread-safe: one per thread.
class WorkMeter {
 public:
  // Counts units (>= 0) of work just done; may throw StatusError (ThrowIfCancelled).
  void Add(int64_t units) {
    left_ -= units;
    if (ABSL_PREDICT_FALSE(left_ < 0)) Checkpoint();
  }

 private:
  void Checkpoint() {
    left_ = kWorkPerCheck;
    ThrowIfCancelled();
  }

  int64_t left_ = kWorkPerCheck;
};

// Calls fn(begin, end) for consecutive blocks of [0, n) of at most `block` units each (in
// order), counting each block in meter after it ran, so the token is checked between blocks. A
// range of at most one block is one call: small loops stay as they were. block > 0.
template <typename Fn>
void ForEachBlock(int64_t n, WorkMeter& meter, Fn&& fn, int64_t block = kWorkPerCheck) {
  for (int64_t begin = 0; begin < n;) {
    const int64_t end = n - begin > block ? begin + block : n;
    fn(begin, end);
    meter.Add(end - begin);
    begin = end;
  }
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_CANCELLATION_H_
