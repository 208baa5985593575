// What every gradserve executable does first in main, before it starts a thread: the server,
// the client tool, and the two benchmark programs (engine_bench and the bare echo server), so
// that the benchmarks run under the settings the server runs under. Header-only, so that the
// client tool and the echo server, which do not link the engine, share it.

#ifndef GRADSERVE_PROGRAM_PROCESS_START_H_
#define GRADSERVE_PROGRAM_PROCESS_START_H_

#include "absl/synchronization/mutex.h"
#include "program/host_malloc.h"

namespace gradserve {

// Note [Mutex deadlock detection]
// Debian's Abseil is built without NDEBUG, so every absl::Mutex (gRPC's locks are) runs a
// global deadlock detector on each lock and unlock: about a fifth of a ping's instructions on
// the server, and a tenth of the instructions the load tester spends per call (callgrind,
// docs/benchmarks.md). A release build (NDEBUG) of a gradserve executable turns it off; a
// debug build keeps it.

// Sets up this process's malloc (Note [The server's malloc], Note [Malloc tuning]) and absl's
// deadlock detection (Note [Mutex deadlock detection]). Call once, first thing in main.
inline void StartProcess() {
  TuneProcessMalloc();
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace gradserve

#endif  // GRADSERVE_PROGRAM_PROCESS_START_H_
