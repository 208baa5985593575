#include "server/limits/server_memory.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "server/base/cgroup.h"

namespace gradserve::server {
namespace {

int64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{1} << 30;  // unknown: assume 1 GiB
  return static_cast<int64_t>(pages) * page_size;
}

}  // namespace

MemorySize MemoryOf(const CgroupLimits& cgroup) {
  MemorySize size{PhysicalMemory(), "physical memory"};
  // v1 reports "no limit" as a huge number, which the comparison with physical memory drops.
  if (cgroup.memory_bytes.has_value() && *cgroup.memory_bytes < size.bytes) {
    size = {*cgroup.memory_bytes, cgroup.memory_source};
  }
  return size;
}

MemorySize DetectMemory(const std::string& cgroup_root, const std::string& self_cgroup) {
  return MemoryOf(ReadCgroup({cgroup_root, self_cgroup}));
}

int64_t DefaultServerMemoryBytes(const MemorySize& memory) {
  return static_cast<int64_t>(static_cast<double>(memory.bytes) * kServerBudgetShare);
}

int64_t DefaultGrpcMemoryBytes(const MemorySize& memory) {
  return static_cast<int64_t>(static_cast<double>(memory.bytes) * kGrpcQuotaShare);
}

int64_t CacheBytes(const MemorySize& memory, int64_t own_bound) {
  return std::min(own_bound, static_cast<int64_t>(static_cast<double>(memory.bytes) * kCacheShare));
}

std::shared_ptr<MemoryBudget> MakeServerMemoryBudget(int64_t bytes) {
  return MemoryBudget::Make(bytes, nullptr, "server memory limit (--max_server_memory_bytes)");
}

}  // namespace gradserve::server
