#include "server/base/log.h"

#include <algorithm>
#include <atomic>
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

std::atomic<LogFormat> log_format{LogFormat::kText};

// Appends s as a JSON string, quotes included: every byte outside printable ASCII as \u00XX
// (Note [JSON log lines]).
void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20 || u > 0x7e) {
      absl::StrAppend(out, "\\u00", absl::Hex(u, absl::kZeroPad2));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

// {"time":"...","source":"gradserve-server","msg": and msg's string.
void AppendJsonHead(absl::string_view msg, std::string* out) {
  out->append("{\"time\":\"");
  AppendTime(absl::Now(), out);
  out->append("\",\"source\":\"gradserve-server\",\"msg\":");
  AppendJsonString(msg, out);
}

}  // namespace

void SetLogFormat(LogFormat format) { log_format.store(format, std::memory_order_relaxed); }

LogFormat GetLogFormat() { return log_format.load(std::memory_order_relaxed); }

absl::Status ParseLogFormat(absl::string_view text, LogFormat* format) {
  if (text == "text") {
    *format = LogFormat::kText;
  } else if (text == "json") {
    *format = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format must be text or json, got ", Quote(text)));
  }
  return absl::OkStatus();
}

LogRecord& LogRecord::Word(absl::string_view key, absl::string_view value) {
  fields_.push_back({std::string(key), std::string(value), Kind::kWord});
  return *this;
}

LogRecord& LogRecord::Client(absl::string_view key, absl::string_view value) {
  fields_.push_back({std::string(key),
                     GetLogFormat() == LogFormat::kText
                         ? LogField(value)
                         : std::string(value.substr(0, std::min(value.size(), kQuotedBytes))),
                     Kind::kClient});
  return *this;
}

LogRecord& LogRecord::Message(absl::string_view key, absl::string_view value) {
  fields_.push_back({std::string(key), std::string(value), Kind::kClient});
  if (GetLogFormat() == LogFormat::kText) fields_.back().kind = Kind::kWord;
  return *this;
}

LogRecord& LogRecord::Number(absl::string_view key, int64_t value) {
  fields_.push_back({std::string(key), absl::StrCat(value), Kind::kNumber});
  return *this;
}

LogRecord& LogRecord::Millis(absl::string_view key, int64_t us) {
  fields_.push_back({std::string(key),
                     absl::StrCat(us / 1000, ".", absl::Dec(us % 1000, absl::kZeroPad3)),
                     Kind::kNumber});
  return *this;
}

std::string LogRecord::Line() const {
  std::string line;
  if (GetLogFormat() == LogFormat::kText) {
    line = message_;
    for (const Field& f : fields_) absl::StrAppend(&line, " ", f.key, "=", f.value);
    return line;
  }
  AppendJsonHead(message_, &line);
  for (const Field& f : fields_) {
    line.push_back(',');
    AppendJsonString(f.key, &line);
    line.push_back(':');
    if (f.kind == Kind::kNumber) {
      line.append(f.value);
    } else {
      AppendJsonString(f.value, &line);
    }
  }
  line.push_back('}');
  return line;
}

void LogLine(absl::string_view line) {
  std::string text;
  text.reserve(64 + line.size());
  if (GetLogFormat() == LogFormat::kJson) {
    if (!line.empty() && line.front() == '{') {
      text.append(line.data(), line.size());  // a LogRecord's object (Note [JSON log lines])
    } else {
      AppendJsonHead(line, &text);
      text.push_back('}');
    }
  } else {
    AppendTime(absl::Now(), &text);
    text.append(" gradserve-server: ");
    AppendEscaped(line, "", &text);  // one line, whatever it quotes
  }
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
