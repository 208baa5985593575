// ParallelBlocks: one big kernel loop shared by the calling thread and the process's intra-op
// helper threads.
//
// Note [Intra-op parallelism]
// The Engine runs a pass's Nodes on one thread per device (Note [Engine threads]), and the
// server runs one request per worker; so a request with one big elementwise op or sum (the
// 64 MiB grad_64mb request: a mul, a sum and the mul's gradient, each over 16M floats) used
// one CPU while the others idled, where PyTorch splits such a loop over its intra-op threads
// (at::parallel_for). ParallelBlocks does the same for the host kernels' long loops:
//   - Only loops of at least kParallelMinUnits units are split, in chunks of kParallelChunk
//     units, whose bounds depend on the loop's length alone: a reduction that combines one
//     partial result per chunk, in chunk order, gives the same bits whichever thread ran which
//     chunk, and however many helpers there are.
//   - The caller works too: it claims chunks like any helper, and waits at the end only for
//     chunks a helper is still running. A helper is only asked when it is idle, so under load
//     (every CPU busy with requests) the caller runs its loop alone, as before, and no request
//     ever waits for another's chunks.
//   - A helper runs its chunks under the caller's cancellation token (Note [Stopping a running
//     op]): a deadline stops every thread's chunks. The first error (a StatusError, any
//     exception) skips the chunks not yet started and is rethrown on the caller.
//   - The chunk functions must be plain loops over memory the caller owns: they run on other
//     threads, without the caller's other thread-local state (memory budget, grad mode).
// The helpers are started on first use, up to SetIntraOpThreads()'s count less one (the
// caller is the other). The server sizes it by its CPUs (--intra_op_threads, Note [Sizing the
// server's threads]); engine_bench by --threads, as PyTorch's benchmark sets its own.
//
// Thread safety: every function may be called from any thread at once.

#ifndef GRADSERVE_ENGINE_UTIL_PARALLEL_H_
#define GRADSERVE_ENGINE_UTIL_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "engine/util/cancellation.h"

namespace gradserve {

// Loops shorter than this run on the caller alone (waking a helper costs microseconds).
inline constexpr int64_t kParallelMinUnits = int64_t{1} << 19;
// The units of one chunk of a split loop (a multiple of 1 << 16, WorkMeter's block).
inline constexpr int64_t kParallelChunk = int64_t{1} << 18;

// Threads that may share one loop, the caller included; 1 turns splitting off. The default is
// the host's CPUs (std::thread::hardware_concurrency), at most kMaxIntraOpThreads. Takes effect
// for loops started after it; helpers already started stay, idle, when it shrinks.
inline constexpr int kMaxIntraOpThreads = 64;
void SetIntraOpThreads(int threads);
int IntraOpThreads();

// The chunks ParallelBlocks cuts n units into: ceil(n / kParallelChunk) when n is at least
// kParallelMinUnits, else 1.
int64_t ParallelChunks(int64_t n);

// Calls fn(chunk, begin, end) once for each chunk of [0, n) (ParallelChunks(n) of them, chunk
// c covering [c * kParallelChunk, min(n, (c + 1) * kParallelChunk)), or [0, n) when there is
// one), on this thread and on idle helpers, and returns when all have run. Rethrows the first
// exception a chunk threw (Note [Intra-op parallelism]).
void ParallelBlocks(int64_t n,
                    absl::FunctionRef<void(int64_t chunk, int64_t begin, int64_t end)> fn);

// ForEachBlock (engine/util/cancellation.h) over [0, n), but for a range of kParallelMinUnits or
// more, shared out with ParallelBlocks: each chunk walks its own blocks, fn(begin, end) with
// absolute bounds, counted in a meter of its own. So fn may run on several threads at once, on
// disjoint ranges; a shorter range is exactly ForEachBlock, counted in meter.
template <typename Fn>
void ForEachBlockShared(int64_t n, WorkMeter& meter, Fn&& fn) {
  if (n < kParallelMinUnits) {
    ForEachBlock(n, meter, fn);
    return;
  }
  ParallelBlocks(n, [&](int64_t, int64_t first, int64_t last) {
    WorkMeter chunk_meter;
    ForEachBlock(last - first, chunk_meter,
                 [&](int64_t begin, int64_t end) { fn(first + begin, first + end); });
  });
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_PARALLEL_H_
