// OpenBLAS's thread count, set before OpenBLAS starts its threads: by re-executing the server.
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
// --blas_threads) gets that count and no re-execution. If the exec fails the server goes on
// with the pool it has and logs a warning. Stop signals survive it: they are blocked in main's
// thread (Note [Stop signals] in main.cc), and a blocked signal stays pending across execv;
// only one that a thread of OpenBLAS's took before is in the signal pipe, which execv would
// lose, so main does not re-execute when the pipe has a byte, and stops at once instead.
//
// Thread safety: call from main before any thread of the server's own starts (setenv).

#ifndef GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_
#define GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_

#include <optional>
#include <string>

namespace gradserve::server {

// Set in the environment of the re-executed server to the source of OPENBLAS_NUM_THREADS'
// value ("cpus", "--blas_threads").
inline constexpr char kReexecMarker[] = "GRADSERVE_BLAS_THREADS_SOURCE";

// The marker's value if this process is the re-executed server, and removes it from the
// environment (so that nothing the server starts inherits it). nullopt otherwise.
std::optional<std::string> TakeReexecMarker();

// OPENBLAS_NUM_THREADS as the environment has it; empty if unset.
std::string OpenBlasEnv();

// If OPENBLAS_NUM_THREADS is not `threads`, sets it (and the marker, to source) and
// re-executes this program with argv; returns only if no re-execution was needed (nullopt) or
// it failed (the warning to log).
std::optional<std::string> ReexecWithBlasThreads(int threads, const std::string& source,
                                                 char** argv);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_PROCESS_BLAS_THREADS_H_
