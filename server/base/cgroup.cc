#include "server/base/cgroup.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/util/quote.h"

namespace gradserve::server {
namespace {

// Limit files are a line; anything longer is garbage, read no further.
constexpr std::streamsize kMaxFileBytes = 4096;

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text(kMaxFileBytes, '\0');
  in.read(text.data(), kMaxFileBytes);
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// Reads a limit file's stripped text (in directory dir): leaves *limit unset where it sets no
// limit ("max", -1), else sets it and *source. False for contents it does not understand,
// which are warned about.
template <typename T>
using Parser = std::function<bool(absl::string_view text, const std::string& dir,
                                  std::optional<T>* limit, std::string* source)>;

// Note [Reading the cgroup]: the smallest limit that `parse` finds in file of dir and of each
// directory above it up to root. Returns the limit and sets *source to the one that set it.
template <typename T>
std::optional<T> SmallestLimitUp(const std::string& root, std::string dir, const std::string& file,
                                 const Parser<T>& parse, std::string* source,
                                 std::vector<std::string>* warnings) {
  std::optional<T> smallest;
  while (true) {
    const std::string path = root + dir + (dir.empty() || dir.back() != '/' ? "/" : "") + file;
    if (std::optional<std::string> text = ReadFile(path); text.has_value()) {
      const absl::string_view stripped = absl::StripAsciiWhitespace(*text);
      std::optional<T> limit;
      std::string limit_source;
      if (!parse(stripped, root + dir, &limit, &limit_source)) {
        warnings->push_back(absl::StrCat("cgroup: ignored ", Quote(path), ", which holds ",
                                         Quote(stripped, 64), ": not a limit"));
      } else if (limit.has_value() && (!smallest.has_value() || *limit < *smallest)) {
        smallest = limit;
        *source = limit_source;
      }
    }
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "" : dir.substr(0, slash);
  }
  return smallest;
}

// Memory files: a whole number > 0, or "max" (no limit); false for anything else. The
// source is the file's name.
Parser<int64_t> BytesIn(std::string file_source) {
  return [file_source](absl::string_view text, const std::string& /*dir*/,
                       std::optional<int64_t>* limit, std::string* source) {
    if (text == "max") return true;
    int64_t value = 0;
    if (!absl::SimpleAtoi(text, &value) || value <= 0) return false;
    *limit = value;
    *source = file_source;
    return true;
  };
}

// v2 cpu.max: "QUOTA PERIOD" or "max PERIOD".
bool ParseCpuMax(absl::string_view text, const std::string& /*dir*/, std::optional<double>* limit,
                 std::string* source) {
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ', absl::SkipEmpty());
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[1], &period) || period <= 0) return false;
  if (fields[0] == "max") return true;
  if (!absl::SimpleAtoi(fields[0], &quota) || quota <= 0) return false;
  *limit = static_cast<double>(quota) / static_cast<double>(period);
  *source = absl::StrCat("cgroup cpu.max ", quota, " ", period);
  return true;
}

// v1 cpu.cfs_quota_us (-1: none) with the cpu.cfs_period_us beside it.
bool ParseCfsQuota(absl::string_view text, const std::string& dir, std::optional<double>* limit,
                   std::string* source) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(text, &quota) || quota == 0 || quota < -1) return false;
  if (quota == -1) return true;
  std::optional<std::string> period_text = ReadFile(dir + "/cpu.cfs_period_us");
  if (!period_text.has_value() ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(*period_text), &period) || period <= 0) {
    return false;
  }
  *limit = static_cast<double>(quota) / static_cast<double>(period);
  *source = absl::StrCat("cgroup cpu.cfs_quota_us ", quota, " / cpu.cfs_period_us ", period);
  return true;
}

// Keeps the smaller of *limit and found (with its source).
template <typename T>
void KeepSmaller(const std::optional<T>& found, const std::string& found_source,
                 std::optional<T>* limit, std::string* source) {
  if (!found.has_value() || (limit->has_value() && **limit <= *found)) return;
  *limit = found;
  *source = found_source;
}

}  // namespace

CgroupLimits ReadCgroup(const CgroupPaths& paths) {
  CgroupLimits limits;
  std::optional<std::string> lines = ReadFile(paths.self);
  if (!lines.has_value()) lines = "0::/\n";
  for (absl::string_view line : absl::StrSplit(*lines, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    const std::string& dir = parts[2];
    std::string source;
    if (parts[0] == "0" && parts[1].empty()) {  // v2: one hierarchy, every controller
      std::optional<double> cpus = SmallestLimitUp<double>(paths.root, dir, "cpu.max", ParseCpuMax,
                                                           &source, &limits.warnings);
      KeepSmaller(cpus, source, &limits.cpus, &limits.cpu_source);
      std::optional<int64_t> memory = SmallestLimitUp<int64_t>(
          paths.root, dir, "memory.max", BytesIn("cgroup memory.max"), &source, &limits.warnings);
      KeepSmaller(memory, source, &limits.memory_bytes, &limits.memory_source);
      continue;
    }
    const std::vector<std::string> controllers = absl::StrSplit(parts[1], ',');
    auto has = [&](const char* name) {
      return std::find(controllers.begin(), controllers.end(), name) != controllers.end();
    };
    if (has("cpu")) {
      // Mounted under its controllers' names ("cpu,cpuacct"), often also linked as "cpu".
      std::string mount = paths.root + "/" + parts[1];
      std::error_code error;  // the overload that cannot throw
      if (!std::filesystem::is_directory(mount, error)) mount = paths.root + "/cpu";
      std::optional<double> cpus = SmallestLimitUp<double>(
          mount, dir, "cpu.cfs_quota_us", ParseCfsQuota, &source, &limits.warnings);
      KeepSmaller(cpus, source, &limits.cpus, &limits.cpu_source);
    }
    if (has("memory")) {
      std::optional<int64_t> memory = SmallestLimitUp<int64_t>(
          paths.root + "/memory", dir, "memory.limit_in_bytes",
          BytesIn("cgroup memory.limit_in_bytes"), &source, &limits.warnings);
      KeepSmaller(memory, source, &limits.memory_bytes, &limits.memory_source);
    }
  }
  return limits;
}

}  // namespace gradserve::server
