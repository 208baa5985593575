#include "server/limits/server_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The number in a cgroup limit file; nullopt for "max", a missing file or anything else.
std::optional<int64_t> ReadLimit(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  int64_t value = 0;
  if (!text.has_value() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) ||
      value <= 0) {
    return std::nullopt;
  }
  return value;
}

int64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{1} << 30;  // unknown: assume 1 GiB
  return static_cast<int64_t>(pages) * page_size;
}

// The smallest limit in file of directory dir and of each directory above it up to root (a
// cgroup is bounded by its ancestors' limits too).
std::optional<int64_t> SmallestLimitUp(const std::string& root, std::string dir,
                                       const std::string& file) {
  std::optional<int64_t> smallest;
  while (true) {
    if (std::optional<int64_t> limit = ReadLimit(root + dir + "/" + file);
        limit.has_value() && (!smallest.has_value() || *limit < *smallest)) {
      smallest = limit;
    }
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return smallest;
}

}  // namespace

MemorySize DetectMemory(const std::string& cgroup_root, const std::string& self_cgroup) {
  MemorySize size{PhysicalMemory(), "physical memory"};
  // Each line of /proc/self/cgroup is "id:controllers:path": v2's is "0::path", v1's memory
  // hierarchy names "memory" among its controllers. In a container with its own cgroup
  // namespace the path is "/", and cgroup_root holds the container's own files.
  std::optional<std::string> lines = ReadFile(self_cgroup);
  if (!lines.has_value()) lines = "0::/\n";
  for (absl::string_view line : absl::StrSplit(*lines, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    std::optional<int64_t> limit;
    const char* source = nullptr;
    if (parts[0] == "0" && parts[1].empty()) {
      limit = SmallestLimitUp(cgroup_root, parts[2], "memory.max");
      source = "cgroup memory.max";
    } else if (absl::StrContains(parts[1], "memory")) {
      const std::vector<std::string> controllers = absl::StrSplit(parts[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "memory") == controllers.end()) {
        continue;
      }
      limit = SmallestLimitUp(cgroup_root + "/memory", parts[2], "memory.limit_in_bytes");
      source = "cgroup memory.limit_in_bytes";
    }
    // v1 reports "no limit" as a huge number, which the comparison with physical memory drops.
    if (limit.has_value() && *limit < size.bytes) size = {*limit, source};
  }
  return size;
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
  return std::make_shared<MemoryBudget>(bytes, nullptr,
                                        "server memory limit (--max_server_memory_bytes)");
}

}  // namespace gradserve::server
