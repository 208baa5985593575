// PerThread<T>: one T for each thread, for caches that a thread fills and reads without a lock.
//
// Note [Per-thread caches at thread exit]
// A thread's thread_local objects are destroyed in the reverse order of their construction when
// the thread exits, and code that runs then (another thread_local's destructor, gRPC's or the
// engine's clean-up on that thread) may still give something back to a cache that is already
// gone. So Get() returns null from the moment the thread's T is destroyed, and callers treat a
// null cache as "keep nothing": they free what they would have kept. The flag that says so is
// a constant-initialized thread_local bool, which is never destroyed.

#ifndef GRADSERVE_SERVER_BASE_PER_THREAD_H_
#define GRADSERVE_SERVER_BASE_PER_THREAD_H_

namespace gradserve::server {

// Thread safety: Get() returns the calling thread's own T; only that thread may use it.
template <typename T>
class PerThread {
 public:
  // The calling thread's T (value-initialized on the thread's first call), or null once the
  // thread has destroyed it on its way out (Note [Per-thread caches at thread exit]).
  static T* Get() {
    if (gone_) return nullptr;
    thread_local PerThread slot;
    return &slot.value_;
  }

 private:
  PerThread() = default;
  ~PerThread() { gone_ = true; }

  static inline thread_local bool gone_ = false;
  T value_{};
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_PER_THREAD_H_
