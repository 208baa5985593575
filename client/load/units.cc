#include "client/load/units.h"

#include "absl/strings/str_format.h"

namespace gradserve::load {

std::string FormatLatency(int64_t ns) {
  if (ns < 1000) return absl::StrFormat("%d ns", ns);
  if (ns < 1'000'000) return absl::StrFormat("%.1f us", ns / 1e3);
  if (ns < 1'000'000'000) return absl::StrFormat("%.3f ms", ns / 1e6);
  return absl::StrFormat("%.2f s", ns / 1e9);
}

std::string FormatBytes(double bytes) {
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1024.0 * 1024) return absl::StrFormat("%.2f KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f MiB", bytes / (1024.0 * 1024));
  return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

}  // namespace gradserve::load
