#include "client/load/result_recorder.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"

namespace gradserve::load {

void ResultRecorder::SetMeasurementStart(int64_t ns) {
  absl::MutexLock lock(&mutex_);
  if (measure_start_ns_ < 0) measure_start_ns_ = ns;
}

void ResultRecorder::Record(const CallOutcome& c) {
  absl::MutexLock lock(&mutex_);
  if (c.ticket < warmup_) {
    ++result_.warmup_calls;
    return;
  }
  const bool ok = c.code == 0;
  const int64_t latency_ns = c.end_ns - c.intended_ns;
  ++result_.count;
  if (ok) {
    ++result_.ok;
    result_.latency.Record(latency_ns);
  }
  // gRPC's status codes and absl's have the same numbers and names.
  ++result_.status_counts[absl::StatusCodeToString(static_cast<absl::StatusCode>(c.code))];
  result_.bytes_up += c.bytes_up;
  result_.bytes_down += c.bytes_down;
  const int64_t start = measure_start_ns_ < 0 ? c.intended_ns : measure_start_ns_;
  result_.timeline.Record(c.intended_ns - start, latency_ns, ok);
  last_end_ns_ = std::max(last_end_ns_, c.end_ns);
}

ProgressSnapshot ResultRecorder::Progress(int64_t now_ns) {
  absl::MutexLock lock(&mutex_);
  ProgressSnapshot p;
  p.done = result_.count;
  p.errors = result_.count - result_.ok;
  p.warmup_done = result_.warmup_calls;
  p.p99_ns = result_.latency.Quantile(0.99);
  if (measure_start_ns_ >= 0 && now_ns > measure_start_ns_) {
    p.rate =
        static_cast<double>(result_.count) * 1e9 / static_cast<double>(now_ns - measure_start_ns_);
  }
  return p;
}

LoadResult ResultRecorder::Result() {
  absl::MutexLock lock(&mutex_);
  LoadResult r = result_;
  if (measure_start_ns_ >= 0 && last_end_ns_ > measure_start_ns_) {
    r.elapsed = absl::Nanoseconds(last_end_ns_ - measure_start_ns_);
  }
  return r;
}

}  // namespace gradserve::load
