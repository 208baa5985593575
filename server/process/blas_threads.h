// OpenBLAS's thread count and idle spin, set before OpenBLAS starts its threads: by
// re-executing the server.
//
// Note [OpenBLAS's threads]
// OpenBLAS (Debian's libopenblas0-pthread) starts its thread pool when the library is loaded,
// before main runs: one thread per CPU it counts (sysconf and the affinity mask, not the
// cgroup's quota), or OPENBLAS_NUM_THREADS of them if that is set then. So by the time the
// server has read --blas_threads and its cgroup, the pool exists: on a 64-core node under a
// 4-CPU limit, 63 threads besides the caller, idle but each with its stack, in every pod.
// openblas_set_num_threads() cannot undo that: it only grows the pool, and a smaller count
// just leaves the rest idle (OpenBLAS 0.3.21, blas_server.c goto_set_num_threads). Shutting
// the pool down by its internal entry points would tie the server to one OpenBLAS build.
// So main, right after parsing its flags and before it starts a thread of its own, compares
// the count it wants with OPENBLAS_NUM_THREADS and, when they differ, sets the variable and
// re-executes itself: execv of its binary (found by /proc/self/exe; by its path, so that the
// process keeps its name) with the same arguments. The process keeps its pid, open files,
// signal mask and pending signals, and the new image loads OpenBLAS with the right count. It
// costs one more program start, a few milliseconds, and happens at most once: the
// re-executed server finds kReexecMarker set (with the source of the count, for the start-up
// line) and never re-executes again. An operator who sets OPENBLAS_NUM_THREADS (and no
// --blas_threads) gets that count, and no re-execution if OPENBLAS_THREAD_TIMEOUT is set too
// (Note [OpenBLAS's idle threads] says why the server sets that one). If the exec fails the server
// goes on with the pool it has and logs a warning. Stop signals survive it: they are blocked in
// main's thread (Note [Stop signals] in main.cc), and a blocked signal stays pending across execv;
// only one that a thread of OpenBLAS's took before is in the signal pipe, which execv would
// lose, so main does not re-execute when the pipe has a byte, and stops at once instead.
//
// Note [OpenBLAS's idle threads]
// After each product, OpenBLAS's threads spin (calling sched_yield) until 2^N TSC cycles pass
// with no work, and only then sleep on a condition variable; N is OPENBLAS_THREAD_TIMEOUT,
// read when the library loads, 28 by default (clamped to 4..30). 2^28 cycles is about 0.1 s
// at 2.6 GHz: each request with a matmul or conv2d left its pool burning about 74 ms of CPU
// per thread after the answer had gone (measured: 37 ticks in the 0.5 s after each of five
// mlp requests, against none with a short timeout). On a host shared with other requests, or
// in a pod whose CPU quota that spin eats, that is CPU taken from useful work. So unless the
// operator set OPENBLAS_THREAD_TIMEOUT, the server sets it to kBlasThreadTimeout (2^18
// cycles, about 0.1 ms: long enough to span the gap between the products of one backward pass,
// short enough that a finished pass leaves nothing spinning), by the same re-execution that
// sets the thread count. Measured on the 2-CPU host (docs/benchmarks.md): an mlp request cost
// 22% less server CPU and the load tool's mlp rate rose 8-10%.
//
// Thread safety: call from main before any thread of the server's own starts (setenv).

#ifndef GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_
#define GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_

#include <optional>
#include <string>

namespace gradserve::server {

// Set in the environment of the re-executed server to where OpenBLAS's settings came from
// (BlasStart, written as "<threads_source>;<timeout source>").
inline constexpr char kReexecMarker[] = "GRADSERVE_BLAS_THREADS_SOURCE";

// OPENBLAS_THREAD_TIMEOUT's value when the operator did not set it: Note [OpenBLAS's idle
// threads].
inline constexpr int kBlasThreadTimeout = 18;

// Where the re-executed server's OpenBLAS settings came from.
struct BlasStart {
  std::string threads_source;             // of OPENBLAS_NUM_THREADS: "cpus", "--blas_threads", ...
  bool timeout_from_environment = false;  // the operator's OPENBLAS_THREAD_TIMEOUT, if true
};

// The marker's value if this process is the re-executed server, and removes it from the
// environment (so that nothing the server starts inherits it). nullopt otherwise.
std::optional<BlasStart> TakeReexecMarker();

// OPENBLAS_NUM_THREADS as the environment has it; empty if unset.
std::string OpenBlasEnv();

// The start-up line that says how long OpenBLAS's idle threads spin, and why: the operator's
// OPENBLAS_THREAD_TIMEOUT (from_environment) or kBlasThreadTimeout.
std::string BlasTimeoutLine(bool from_environment);

// If OPENBLAS_NUM_THREADS is not `threads`, or OPENBLAS_THREAD_TIMEOUT is unset, sets them
// (the timeout to kBlasThreadTimeout) and the marker (with source) and re-executes this
// program with argv; returns only if no re-execution was needed (nullopt) or it failed (the
// warning to log).
std::optional<std::string> ReexecWithBlasThreads(int threads, const std::string& source,
                                                 char** argv);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_
