// How a gradserve process tunes glibc's malloc for its host memory. Header-only, so that the
// client tool, which does not link the engine, shares it.

#ifndef GRADSERVE_ENGINE_TENSOR_HOST_MALLOC_H_
#define GRADSERVE_ENGINE_TENSOR_HOST_MALLOC_H_

#include <malloc.h>

namespace gradserve {

// Note [Malloc tuning]
// A gradserve process allocates the same kinds of blocks over and over, request after request:
// a backward pass's node table (hundreds of KiB for a graph of thousands of Nodes), tensors of
// a few hundred KiB, and, for a big streamed call, gRPC's read and write slices and the chunks'
// strings of a few MiB. glibc's malloc serves blocks over its mmap threshold (128 KiB at start,
// raised and lowered as such blocks come and go) with fresh mappings, and gives the top of its
// heap back to the kernel once more than its trim threshold is free, so each request faults
// the same memory in again, 4 KiB at a time: a third of a 64 MiB streamed call's time, and a
// fanin_2k backward that took 1.9 ms or 4.5 ms depending on where the threshold stood.
// TuneHostMalloc fixes the mmap threshold at kMallocMmapThreshold (blocks below it come from
// the heap and are reused) and lets each malloc arena keep up to kMallocTrimThreshold of free
// memory for reuse instead of trimming it. Cost: an idle process may hold that much free
// memory per arena it used. Blocks at or above kMallocMmapThreshold are still mapped and
// unmapped; engine tensors of 1 MiB or more have their own bounded cache (Note [Big host
// blocks]). The server, the client tool and the engine benchmark call it once, at the start of
// main, before any threads; a library never does.
inline constexpr int kMallocMmapThreshold = 32 << 20;
inline constexpr int kMallocTrimThreshold = 256 << 20;
inline void TuneHostMalloc() {
  // Advice only: a libc without these options keeps its defaults.
  mallopt(M_MMAP_THRESHOLD, kMallocMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kMallocTrimThreshold);
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_HOST_MALLOC_H_
