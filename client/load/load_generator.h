// RunLoad: makes the calls of a load run against one or several servers and measures them.
//
// Note [Closed and open loop]
// Closed loop (rate 0): `concurrency` calls are kept in flight; each finished call starts the
// next from gRPC's callback thread, and latency runs from the actual send. Open loop (rate
// > 0): a scheduler thread sends call i at start + i / rate whatever the server does, and the
// latency of each call runs from that intended time, so a server stall shows up as latency
// (no coordinated omission). When `concurrency` calls are already in flight, the scheduler
// waits for one to finish; the waiting call's latency includes that wait.
//
// Calls go round-robin over the targets, and over each target's connections. The first
// `warmup` calls are made and left out of every figure.

#ifndef GRADSERVE_CLIENT_LOAD_LOAD_GENERATOR_H_
#define GRADSERVE_CLIENT_LOAD_LOAD_GENERATOR_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/load/load_options.h"
#include "client/load/load_result.h"
#include "client/load/result_recorder.h"
#include "client/load/workload.h"

namespace gradserve::load {

// Called on the thread that runs RunLoad, about every 200 ms, with the time since the run
// began.
using ProgressFn = std::function<void(absl::Duration elapsed, const ProgressSnapshot&)>;

// Runs the load and blocks until it is over (Note [Bounded load]). INVALID_ARGUMENT for bad
// options; UNAVAILABLE when a target cannot be reached before the run. Failed calls are not
// errors of RunLoad: they are counted by status code in the result.
absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const Workload& workload,
                                   const ProgressFn& progress = nullptr);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LOAD_GENERATOR_H_
