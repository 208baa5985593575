#include "server/base/log.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/util/quote.h"

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
  text.append(" gradserve-server: ");
  AppendEscaped(line, "", &text);  // one line, whatever it quotes
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
}

RateLimitedLog::RateLimitedLog(int64_t lines_per_window, absl::Duration window, Clock clock,
                               Sink sink)
    : lines_per_window_(std::max<int64_t>(1, lines_per_window)),
      window_(window),
      clock_(std::move(clock)),
      sink_(std::move(sink)) {}

RateLimitedLog::~RateLimitedLog() { Flush(); }

bool RateLimitedLog::Log(absl::FunctionRef<std::string()> make_line) {
  const absl::Time now = clock_();
  MutexLock lock(&mutex_);
  if (now - window_start_ >= window_ || now < window_start_) {
    window_start_ = now;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ >= lines_per_window_) {
    if (left_out_ == 0) left_out_since_ = now;
    ++left_out_;
    ++total_left_out_;
    return false;
  }
  ++lines_in_window_;
  if (left_out_ > 0) WriteSummary(now);
  sink_(make_line());
  return true;
}

void RateLimitedLog::Flush() {
  const absl::Time now = clock_();
  MutexLock lock(&mutex_);
  if (left_out_ > 0) WriteSummary(now);
}

int64_t RateLimitedLog::lines_left_out() const {
  MutexLock lock(&mutex_);
  return total_left_out_;
}

void RateLimitedLog::WriteSummary(absl::Time now) {
  const double seconds =
      absl::ToDoubleSeconds(std::max(now - left_out_since_, absl::ZeroDuration()));
  sink_(absl::StrFormat("%d refusals not logged in the last %.1fs (at most %d lines per %s)",
                        left_out_, seconds, lines_per_window_, absl::FormatDuration(window_)));
  left_out_ = 0;
}

}  // namespace gradserve::server
