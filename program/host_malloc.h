// How a gradserve process sets up malloc for its host memory: glibc's tuning (every process),
// and the malloc that gradserve-server and the engine benchmark link (Note [The server's
// malloc]). Header-only, so that the client tool, which does not link the engine, shares it.
// An executable that links mimalloc says so with GRADSERVE_USE_MIMALLOC=1 (CMake's
// gradserve_process_malloc).

#ifndef GRADSERVE_PROGRAM_HOST_MALLOC_H_
#define GRADSERVE_PROGRAM_HOST_MALLOC_H_

#include <malloc.h>

#if defined(GRADSERVE_USE_MIMALLOC) && GRADSERVE_USE_MIMALLOC
#include <mimalloc.h>
#define GRADSERVE_PROCESS_MIMALLOC 1
#else
#define GRADSERVE_PROCESS_MIMALLOC 0
#endif

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

// Note [The server's malloc]
// A small request makes a couple of hundred small allocations (tensors, Nodes, edges, the
// parsed message's strings) and frees them all when it ends. glibc's per-thread cache holds 7
// blocks per size, so most of them went through its slower bins: about 60k of the 265k
// instructions grad_tiny cost the server (callgrind, docs/benchmarks.md). gradserve-server is
// therefore linked with mimalloc where the build finds it (CMake GRADSERVE_MALLOC, default
// AUTO: Debian's libmimalloc-dev, not under sanitizers), which replaces malloc for the whole
// process, gRPC and protobuf included: about 47k instructions fewer per grad_tiny call. The
// start-up line names the malloc in use. The engine benchmark (bench/engine_bench) links the
// same malloc and tunes it the same way, so that it times the engine as the server runs it.
//
// TuneHostMalloc's settings (Note [Malloc tuning]) are glibc's and do nothing under mimalloc.
// Its counterpart is mimalloc's decommit delay: how long freed memory stays committed before
// it goes back to the kernel. With the default (25 ms) a 64 MiB streamed call faulted its
// buffers in afresh each time and moved half the bytes per second it moves under glibc; held
// for kFreedMemoryHoldMs it matches glibc. An idle server still returns that memory, after the
// delay. MIMALLOC_DECOMMIT_DELAY and MIMALLOC_SEGMENT_DECOMMIT_DELAY in the environment
// override it. Big tensors have their own cache either way (Note [Big host blocks]).
inline constexpr const char* kProcessMallocName = GRADSERVE_PROCESS_MIMALLOC ? "mimalloc" : "glibc";
inline constexpr long kFreedMemoryHoldMs = 2000;
// Sets up this process's malloc (Note [The server's malloc]); call once at the start of main,
// before any threads.
inline void TuneProcessMalloc() {
  TuneHostMalloc();  // Note [Malloc tuning]
#if GRADSERVE_PROCESS_MIMALLOC
  // Defaults only: the MIMALLOC_* environment variables win.
  mi_option_set_default(mi_option_decommit_delay, kFreedMemoryHoldMs);
  mi_option_set_default(mi_option_segment_decommit_delay, kFreedMemoryHoldMs);
#endif
}

}  // namespace gradserve

#endif  // GRADSERVE_PROGRAM_HOST_MALLOC_H_
