// The server's memory: how much it may use, read from its container, and the budget that every
// request, upload and response draws from (Note [Budgets within a budget] in
// engine/tensor/memory_budget.h).
//
// Note [Sizing the server's memory]
// A server in a container is killed by the kernel when it passes the container's memory limit,
// and nothing can answer a client then. So the server counts what clients make it hold, and
// refuses new work with RESOURCE_EXHAUSTED before the total passes a budget well inside the
// limit. The memory it has is the container's (cgroup v2 `memory.max`, or v1's
// `memory.limit_in_bytes`) where there is one, else the host's physical memory. Of that, by
// default:
//   - kServerBudgetShare (60%) is the budget for what requests hold: tensors, autograd state,
//     buffered uploads, responses being serialized (--max_server_memory_bytes);
//   - kGrpcQuotaShare (15%) is gRPC's own resource quota, for what its transports buffer before
//     a call reaches the service (--grpc_memory_bytes);
//   - the rest is for the process itself: code, threads' stacks, gRPC's and protobuf's state,
//     and the memory kept to reuse (docs/streaming.md lists those caches), of which the two
//     caches the server bounds itself, freed big tensor blocks (Note [Big host blocks]) and
//     chunk buffers (Note [Chunk buffer pool]), get at most kCacheShare (5%) each, below their
//     own bounds of 256 and 128 MiB.
// Both are printed at start, each overridable by its flag.
//
// Thread safety: the functions read files and may be called from any thread.

#ifndef GRADSERVE_SERVER_LIMITS_SERVER_MEMORY_H_
#define GRADSERVE_SERVER_LIMITS_SERVER_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "engine/tensor/memory_budget.h"
#include "server/base/cgroup.h"

namespace gradserve::server {

inline constexpr double kServerBudgetShare = 0.60;
inline constexpr double kGrpcQuotaShare = 0.15;
inline constexpr double kCacheShare = 0.05;

// The memory the process may use and where that figure comes from.
struct MemorySize {
  int64_t bytes = 0;
  // "cgroup memory.max", "cgroup memory.limit_in_bytes" or "physical memory".
  std::string source;
};

// The memory limit that cgroup read (Note [Reading the cgroup] in server/base/cgroup.h: v2's
// memory.max or v1's memory.limit_in_bytes, the smallest of the process's cgroup and its
// ancestors') when below the host's physical memory; else the physical memory.
MemorySize MemoryOf(const CgroupLimits& cgroup);
// MemoryOf the cgroup that self_cgroup (/proc/self/cgroup) names under cgroup_root. Never
// fails: a missing or unreadable file means no limit there (ReadCgroup).
MemorySize DetectMemory(const std::string& cgroup_root = "/sys/fs/cgroup",
                        const std::string& self_cgroup = "/proc/self/cgroup");

// Note [Sizing the server's memory]: the default budget and gRPC quota for memory.
int64_t DefaultServerMemoryBytes(const MemorySize& memory);
int64_t DefaultGrpcMemoryBytes(const MemorySize& memory);
// The bound of each of the two reuse caches: kCacheShare of memory, at most `own_bound`.
int64_t CacheBytes(const MemorySize& memory, int64_t own_bound);

// The budget of the whole server: its charges fail with RESOURCE_EXHAUSTED naming
// --max_server_memory_bytes.
std::shared_ptr<MemoryBudget> MakeServerMemoryBudget(int64_t bytes);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_LIMITS_SERVER_MEMORY_H_
