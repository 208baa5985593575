#include "server/log.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradserve::server {

void LogLine(absl::string_view line) {
  const std::string text =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3S%Ez", absl::Now(), absl::LocalTimeZone()),
                   " gradserve-server: ", line, "\n");
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace gradserve::server
