// The server's one logging helper: whole lines to stderr, prefixed with the time, and the rate
// limit on the lines of refused requests.
//
// Note [Refusals logged at a bounded rate]
// A client can make the server refuse requests as fast as it can send them: malformed ones,
// ones over a limit, or any while the server is full. Each refusal's log line is a write to
// stderr, so a burst of them would flood whatever collects the log and spend the server's CPU
// on it. GradService therefore writes the lines of failed and refused requests through a
// RateLimitedLog: at most lines_per_window lines in each window of time (a second), the others
// only counted. A window that left lines out is summed up in one line, "N refusals not logged
// in the last 2.5s", written before the next line that is logged, or by Flush (when the service
// stops), whichever comes first; so every refusal is either logged or counted in a summary.
// Lines of requests that succeeded (--log_requests=all) are the operator's choice and are not
// limited.

// Note [JSON log lines]
// --log_format=json makes every line one JSON object, for a log collector to parse without a
// pattern: the server's own sentences as {"time":"...","source":"gradserve-server","msg":"..."}
// and a request's line (a LogRecord) with its fields as members, numbers as numbers:
// {"time":"...","source":"gradserve-server","msg":"request","id":"r-1","rpc":"unary",
// "status":"OK","duration_ms":0.151,...}. Strings are JSON-escaped, and every byte outside
// printable ASCII is written \u00XX, so a line is valid JSON and one line whatever a client
// sent; client strings are bounded as in text. LogLine writes a line that begins with '{' as
// it is: only LogRecord makes such lines, the server's sentences never begin so.

#ifndef GRADSERVE_SERVER_BASE_LOG_H_
#define GRADSERVE_SERVER_BASE_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

// The format of every log line: text (the default) or JSON (Note [JSON log lines]).
enum class LogFormat { kText, kJson };
// Sets the process's log format; call it at start, before any line is written.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
// "text" or "json" (--log_format); INVALID_ARGUMENT for anything else.
absl::Status ParseLogFormat(absl::string_view text, LogFormat* format);

// One line of named fields: "message key=value ..." in text, an object in JSON (Note [JSON log
// lines]). Fields are written in the order they were added.
class LogRecord {
 public:
  explicit LogRecord(absl::string_view message) : message_(message) {}

  // The server's own word, written as it is in text (rpc=unary).
  LogRecord& Word(absl::string_view key, absl::string_view value);
  // A client's string: quoted and bounded in text (Note [Quoting client strings]), bounded and
  // escaped in JSON.
  LogRecord& Client(absl::string_view key, absl::string_view value);
  // A message already made safe for one line (ClientMessage), written as it is in text.
  LogRecord& Message(absl::string_view key, absl::string_view value);
  LogRecord& Number(absl::string_view key, int64_t value);
  // Microseconds as milliseconds with three decimals (duration_ms=1.234).
  LogRecord& Millis(absl::string_view key, int64_t us);

  // The line in the process's format, for LogLine or a RateLimitedLog.
  std::string Line() const;

 private:
  enum class Kind { kWord, kClient, kNumber };
  struct Field {
    std::string key;
    std::string value;
    Kind kind;
  };
  std::string message_;
  std::vector<Field> fields_;
};

// Writes "<RFC 3339 time> gradserve-server: <line>\n" to stderr in one write, so lines from
// different threads never interleave. Bytes of line outside printable ASCII (a newline, say)
// are written escaped (\n, \xNN), so a line is always one line (Note [Quoting client strings]
// in engine/util/quote.h). Thread safe.
void LogLine(absl::string_view line);

// A log whose lines are limited in rate (Note [Refusals logged at a bounded rate]).
//
// Thread safety: Log and Flush may be called from any thread at once; the sink is called
// under the log's lock, so it sees the lines one at a time, in order.
class RateLimitedLog {
 public:
  using Clock = std::function<absl::Time()>;
  using Sink = std::function<void(absl::string_view)>;

  // At most lines_per_window lines (at least one) per window; the clock and the sink (LogLine)
  // may be replaced in tests.
  explicit RateLimitedLog(
      int64_t lines_per_window, absl::Duration window = absl::Seconds(1),
      Clock clock = [] { return absl::Now(); },
      Sink sink = [](absl::string_view line) { LogLine(line); });
  // Flushes.
  ~RateLimitedLog();

  RateLimitedLog(const RateLimitedLog&) = delete;
  RateLimitedLog& operator=(const RateLimitedLog&) = delete;

  // Writes make_line() to the sink if this window has room for it, preceded by the summary of
  // the last window if that left lines out; otherwise counts it. make_line is called only for
  // a line that is written. Returns whether it was.
  bool Log(absl::FunctionRef<std::string()> make_line);
  // Writes the summary of the lines left out since the last line written, if any.
  void Flush();

  // Lines left out since the start.
  int64_t lines_left_out() const;

 private:
  // Writes the summary of left_out_ lines since left_out_since_, and resets it; `now` ends it.
  void WriteSummary(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t lines_per_window_;
  const absl::Duration window_;
  const Clock clock_;
  const Sink sink_;

  mutable Mutex mutex_;
  absl::Time window_start_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  int64_t lines_in_window_ ABSL_GUARDED_BY(mutex_) = 0;
  // Lines left out and not yet summed up, and when the first of them came.
  int64_t left_out_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Time left_out_since_ ABSL_GUARDED_BY(mutex_);
  int64_t total_left_out_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_LOG_H_
