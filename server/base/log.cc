#include "server/base/log.h"

#include <cstdint>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradserve::server {
namespace {

// Appends now as RFC 3339 local time with milliseconds ("2026-11-22T21:55:34.524+00:00").
// Formatting a time in the local zone is costly next to a request's other work, so each thread
// formats the date, seconds and zone offset once per second and only adds the milliseconds.
void AppendTime(absl::Time now, std::string* out) {
  struct Cached {
    int64_t second = INT64_MIN;
    std::string date;  // up to the seconds
    std::string zone;  // the offset
  };
  thread_local Cached cached;
  const int64_t ms = absl::ToUnixMillis(now);
  const int64_t second = ms >= 0 ? ms / 1000 : (ms - 999) / 1000;
  if (second != cached.second) {
    const absl::Time t = absl::FromUnixSeconds(second);
    const absl::TimeZone zone = absl::LocalTimeZone();
    cached.date = absl::FormatTime("%Y-%m-%dT%H:%M:%S", t, zone);
    cached.zone = absl::FormatTime("%Ez", t, zone);
    cached.second = second;
  }
  absl::StrAppend(out, cached.date, ".", absl::Dec(ms - second * 1000, absl::kZeroPad3),
                  cached.zone);
}

}  // namespace

void LogLine(absl::string_view line) {
  std::string text;
  text.reserve(48 + line.size());
  AppendTime(absl::Now(), &text);
  absl::StrAppend(&text, " gradserve-server: ", line, "\n");
  std::fwrite(text.data(), 1, text.size(), stderr);
}

}  // namespace gradserve::server
