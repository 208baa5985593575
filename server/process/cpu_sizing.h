// How many threads the server computes with: engine CPU workers and OpenBLAS's threads, from
// the flags, else the CPUs the process may use.
//
// Note [Sizing the server's threads]
// A container's CPU limit is a quota (cgroup cpu.max: QUOTA microseconds per PERIOD), which
// neither std::thread::hardware_concurrency() nor OpenBLAS sees: on a 64-core node under a
// 4-CPU limit both count 64, and 64 workers and 64 BLAS threads share 4 CPUs' worth of time,
// each throttled in turn. So the CPUs the server sizes itself by are the fewest of
//   - the quota, rounded up (1.5 CPUs: 2 threads, each busy part of the time; rounding down
//     would leave half a CPU unused), read by ReadCgroup (Note [Reading the cgroup]);
//   - the CPUs the process may run on, sched_getaffinity (taskset, a cpuset; Kubernetes' static
//     CPU manager pins a pod this way), which also bounds the host's count;
// and the engine workers (--worker_threads), OpenBLAS's threads (--blas_threads) and the
// threads that share one long elementwise loop (--intra_op_threads) default to that many: one
// worker per CPU keeps every CPU busy with requests; OpenBLAS's own default is one thread per CPU,
// only counted wrongly. Its threads are one pool shared by the workers (a matmul runs on the
// calling worker and the pool's threads), so the two do not multiply; the intra-op helpers
// likewise, and they only take a loop's chunks when idle. An explicit flag wins;
// OPENBLAS_NUM_THREADS, when the operator set it, is taken as OpenBLAS's count unless
// --blas_threads is given (Note [OpenBLAS's threads] in blas_threads.h says how the count reaches
// OpenBLAS).
//
// Thread safety: pure functions, and AffinityCpus reads the calling thread's mask.

#ifndef GRADSERVE_SERVER_PROCESS_CPU_SIZING_H_
#define GRADSERVE_SERVER_PROCESS_CPU_SIZING_H_

#include <string>

#include "server/base/cgroup.h"

namespace gradserve::server {

// What the flags say; 0: size from the CPUs.
struct CpuFlags {
  int worker_threads = 0;
  int blas_threads = 0;
  // OPENBLAS_NUM_THREADS as the operator set it; empty if unset.
  std::string openblas_env;
  int intra_op_threads = 0;
};

// One figure and where it came from: "--worker_threads", "OPENBLAS_NUM_THREADS", "cgroup
// cpu.max 150000 100000", "affinity: 16 CPUs".
struct Sized {
  int value = 0;
  std::string source;
};

struct CpuSizing {
  Sized cpus;  // what the process may use, rounded up
  Sized worker_threads;
  Sized blas_threads;
  // Threads that may share one long elementwise loop or sum (Note [Intra-op parallelism] in
  // engine/util/parallel.h), the worker that runs it included.
  Sized intra_op_threads;
};

// The CPUs in this thread's affinity mask (sched_getaffinity); hardware_concurrency(), at
// least 1, if it cannot be read.
int AffinityCpus();

// Note [Sizing the server's threads]. An OPENBLAS_NUM_THREADS that is not a whole number > 0
// is ignored, as OpenBLAS ignores it.
CpuSizing SizeCpus(const CgroupLimits& cgroup, int affinity_cpus, const CpuFlags& flags);

// The start-up line: "cpus: 2 (cgroup cpu.max 150000 100000; 16 in the affinity mask); engine
// workers 2 (cpus), BLAS threads 2 (cpus), intra-op threads 2 (cpus)".
std::string CpuLine(const CpuSizing& sizing, int affinity_cpus);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_PROCESS_CPU_SIZING_H_
