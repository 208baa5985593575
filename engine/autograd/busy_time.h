// How long the Engine's threads spend running backward passes, for the server's metrics.
//
// Note [Engine busy time]
// Each kind of Engine thread (Note [Engine threads]) counts the time it is busy: from the
// moment it enters thread_main (the outermost one on the thread: a nested pass on the same
// thread is part of the Node that runs it) to the moment it leaves, less the time it waits in
// a ReadyQueue for a task. That is the time spent running Nodes and the engine's bookkeeping
// between them. A chain of Nodes handed from one to the next (Note [Handing the next task
// over]) never waits, so a pass costs its thread two clock reads and one relaxed add to a
// counter sharded by thread (Note [Counters sharded by thread]), plus two clock reads per wait,
// which blocks anyway. A thread blocked in a Node whose nested pass went to the reentrant pool
// counts as busy: it is running that Node. A busy stretch is added when it ends (a wait or the
// end of thread_main), so a scrape during a long Node sees that Node's time only later.
//
// Thread safety: EngineBusyNanos may be called from any thread at any time; the rest act on
// the calling thread only.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_BUSY_TIME_H_
#define GRADSERVE_ENGINE_AUTOGRAD_BUSY_TIME_H_

#include <cstdint>

namespace gradserve::autograd {

// The kinds of Engine thread (Note [Engine threads]).
enum class EngineThread {
  kOwner,      // a thread that called execute(): the server's request workers and gRPC threads
  kDevice,     // an accelerator device's worker thread
  kReentrant,  // a reentrant pool thread
};
inline constexpr int kEngineThreadKinds = 3;

// "owner", "device", "reentrant".
const char* EngineThreadName(EngineThread kind);

// Nanoseconds all threads of a kind have been busy since the process started (Note [Engine
// busy time]); stretches still under way are not in it yet.
int64_t EngineBusyNanos(EngineThread kind);

// Makes the calling thread count as kind from now on (threads are owners until they say).
void SetEngineThreadKind(EngineThread kind);

// Within thread_main: the calling thread is busy while the outermost scope lives.
class BusyScope {
 public:
  BusyScope();
  ~BusyScope();
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  bool outermost_;
};

// Around a ReadyQueue's blocking wait: the calling thread is not busy while it lives.
class BusyPause {
 public:
  BusyPause();
  ~BusyPause();
  BusyPause(const BusyPause&) = delete;
  BusyPause& operator=(const BusyPause&) = delete;

 private:
  bool paused_;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_BUSY_TIME_H_
