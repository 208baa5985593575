#include "engine/autograd/busy_time.h"

#include <chrono>

#include "engine/util/sharded_counter.h"

namespace gradserve::autograd {
namespace {

// Busy nanoseconds by kind, added to by every Engine thread (Note [Engine busy time]).
ShardedCounter busy_ns[kEngineThreadKinds];

// The calling thread's state; plain data, so the thread_local needs no guard.
struct ThreadBusy {
  EngineThread kind = EngineThread::kOwner;
  bool open = false;     // a busy stretch is under way
  int64_t since_ns = 0;  // when it began, while open
};
thread_local ThreadBusy thread_busy;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Open() {
  thread_busy.open = true;
  thread_busy.since_ns = NowNanos();
}

void Close() {
  thread_busy.open = false;
  busy_ns[static_cast<int>(thread_busy.kind)].Add(NowNanos() - thread_busy.since_ns);
}

}  // namespace

const char* EngineThreadName(EngineThread kind) {
  switch (kind) {
    case EngineThread::kOwner:
      return "owner";
    case EngineThread::kDevice:
      return "device";
    case EngineThread::kReentrant:
      return "reentrant";
  }
  return "";
}

int64_t EngineBusyNanos(EngineThread kind) { return busy_ns[static_cast<int>(kind)].Sum(); }

void SetEngineThreadKind(EngineThread kind) { thread_busy.kind = kind; }

BusyScope::BusyScope() : outermost_(!thread_busy.open) {
  if (outermost_) Open();
}

BusyScope::~BusyScope() {
  if (outermost_ && thread_busy.open) Close();
}

BusyPause::BusyPause() : paused_(thread_busy.open) {
  if (paused_) Close();
}

BusyPause::~BusyPause() {
  if (paused_) Open();
}

}  // namespace gradserve::autograd
