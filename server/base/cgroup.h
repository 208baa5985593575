// The limits of this process's cgroup: its CPU quota and its memory limit, read from the cgroup
// filesystem (v2, or v1's cpu and memory hierarchies).
//
// Note [Reading the cgroup]
// /proc/self/cgroup names the process's cgroup: v2's line is "0::PATH", v1's lines are
// "ID:CONTROLLERS:PATH" (the cpu controller's hierarchy is mounted at ROOT/cpu or
// ROOT/cpu,cpuacct, the memory controller's at ROOT/memory). In a container with its own
// cgroup namespace PATH is "/" and ROOT holds the container's own files; without one PATH may
// name a directory that ROOT does not have. Either way a cgroup is bounded by its ancestors'
// limits too, so each limit is the smallest found in PATH's directory and in every directory
// above it up to ROOT; a directory or file that is not there is no limit. The files:
//   - v2 `cpu.max`: "QUOTA PERIOD" (QUOTA microseconds of CPU time per PERIOD: QUOTA/PERIOD
//     CPUs) or "max PERIOD" (no limit);
//   - v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`: the same two numbers, -1 for no quota;
//   - v2 `memory.max`: bytes, or "max"; v1 `memory.limit_in_bytes`: bytes (no limit is a
//     number near 2^63, which the caller's comparison with physical memory drops).
// A file whose contents are none of these (garbage, zero, a negative quota other than -1) is
// ignored with a warning that quotes it: a broken cgroup must never stop the server, and the
// operator should hear that its limit was not applied. ROOT is a parameter so that tests can
// point it at a directory of fake files (gradserve-server --cgroup_root).
//
// Thread safety: ReadCgroup only reads files; call it from any thread.

#ifndef GRADSERVE_SERVER_BASE_CGROUP_H_
#define GRADSERVE_SERVER_BASE_CGROUP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradserve::server {

// Where the cgroup filesystem is mounted, and the file that names this process's cgroup.
struct CgroupPaths {
  std::string root = "/sys/fs/cgroup";
  std::string self = "/proc/self/cgroup";
};

// What the cgroup says; each limit absent where no file sets one.
struct CgroupLimits {
  // CPUs' worth of time per period (1.5: one and a half CPUs), the smallest quota found.
  std::optional<double> cpus;
  // The file that set it and its contents, for the start-up line: "cgroup cpu.max 150000
  // 100000" or "cgroup cpu.cfs_quota_us 150000 / cpu.cfs_period_us 100000".
  std::string cpu_source;
  // Bytes, the smallest limit found.
  std::optional<int64_t> memory_bytes;
  // "cgroup memory.max" or "cgroup memory.limit_in_bytes".
  std::string memory_source;
  // One line per file whose contents were ignored (Note [Reading the cgroup]), naming the
  // file and quoting what it holds.
  std::vector<std::string> warnings;
};

// Reads the limits of the cgroup paths.self names, under paths.root. Never fails: a missing
// or unreadable /proc/self/cgroup is taken as "0::/" (ROOT's own files), a missing file as no
// limit, a malformed one as no limit and a warning.
CgroupLimits ReadCgroup(const CgroupPaths& paths = {});

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_CGROUP_H_
