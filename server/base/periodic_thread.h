// A thread that runs one function at a fixed period until it is destroyed: the reapers of
// what clients leave behind (idle sessions, idle shared-memory regions).
//
// Thread safety: construct and destroy on one thread; `run` runs on the thread this makes,
// never on two threads at once, and not after the destructor returns.

#ifndef GRADSERVE_SERVER_BASE_PERIODIC_THREAD_H_
#define GRADSERVE_SERVER_BASE_PERIODIC_THREAD_H_

#include <functional>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

class PeriodicThread {
 public:
  // Starts a thread that calls run every period (positive), the first time one period from now.
  PeriodicThread(absl::Duration period, std::function<void()> run)
      : period_(period), run_(std::move(run)), thread_([this] { Loop(); }) {}
  // Stops the thread, waiting for a run in progress to end.
  ~PeriodicThread() {
    {
      MutexLock lock(&mutex_);
      stop_ = true;
      stop_signal_.SignalAll();
    }
    thread_.join();
  }

  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Loop() {
    while (true) {
      {
        MutexLock lock(&mutex_);
        if (stop_signal_.WaitWithDeadline(
                &mutex_, absl::Now() + period_,
                [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return stop_; })) {
          return;
        }
      }
      run_();
    }
  }

  const absl::Duration period_;
  const std::function<void()> run_;
  // Guards stop_.
  Mutex mutex_;
  CondVar stop_signal_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_PERIODIC_THREAD_H_
