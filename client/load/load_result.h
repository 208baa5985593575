// LoadResult: what a load run measured, the input of every report format.

#ifndef GRADSERVE_CLIENT_LOAD_LOAD_RESULT_H_
#define GRADSERVE_CLIENT_LOAD_LOAD_RESULT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "client/load/latency_histogram.h"
#include "client/load/load_options.h"
#include "client/load/timeline.h"

namespace gradserve::load {

struct LoadResult {
  std::string scenario;
  LoadOptions options;
  int64_t request_bytes = 0;  // of one request, serialized

  int64_t warmup_calls = 0;  // made and left out
  int64_t count = 0;         // measured calls that finished, successful or not
  int64_t ok = 0;
  // Measured calls by final gRPC status code name ("OK", "UNAVAILABLE", ...).
  std::map<std::string, int64_t> status_counts;
  // Latency of the successful measured calls, from intended send time to completion.
  LatencyHistogram latency;
  Timeline timeline;
  // Message bytes (serialized requests, responses or chunks) of the measured calls.
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
  // From the first measured call's intended send time to the last one's completion.
  absl::Duration elapsed = absl::ZeroDuration();
  // Set when the run hit max_duration and cancelled calls in flight (Note [Bounded load]).
  bool cut_short = false;

  int64_t errors() const { return count - ok; }
  // Measured calls per second.
  double rate() const;
  // (bytes_up + bytes_down) per second.
  double bytes_per_second() const;
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LOAD_RESULT_H_
