// Timeline: latency over the course of a run, in time slices, for the latency-over-time chart.
//
// Slices start 10 ms wide. When a call lands past the last of max_slices slices, neighbouring
// slices are merged in pairs and the width doubles, so memory stays bounded whatever the
// run's length. Each slice keeps a coarse histogram (5%), enough for p50, p99 and max.

#ifndef GRADSERVE_CLIENT_LOAD_TIMELINE_H_
#define GRADSERVE_CLIENT_LOAD_TIMELINE_H_

#include <cstdint>
#include <vector>

#include "client/load/latency_histogram.h"

namespace gradserve::load {

// Thread safety: none; ResultRecorder serializes access.
class Timeline {
 public:
  struct Slice {
    int64_t count = 0;               // calls sent in the slice
    int64_t errors = 0;              // of which failed
    LatencyHistogram latency{0.05};  // of the successful ones
  };

  explicit Timeline(int64_t initial_slice_ns = 10'000'000, int max_slices = 400);

  // A call sent (intended) at at_ns after the start of measurement.
  void Record(int64_t at_ns, int64_t latency_ns, bool ok);

  int64_t slice_ns() const { return slice_ns_; }
  // Slice i covers [i * slice_ns, (i + 1) * slice_ns).
  const std::vector<Slice>& slices() const { return slices_; }

 private:
  void Coarsen();

  int64_t slice_ns_;
  int max_slices_;
  std::vector<Slice> slices_;
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_TIMELINE_H_
