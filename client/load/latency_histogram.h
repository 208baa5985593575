// LatencyHistogram: latencies in log-spaced buckets, for percentiles of any number of samples
// in fixed memory.
//
// Note [Histogram precision]
// Bucket i holds latencies in [g^i, g^(i+1)) nanoseconds with g = 1 + precision. A percentile
// is reported as the geometric middle of its bucket, clamped to the exact min and max, so it
// is within precision/2 of a recorded value (0.5% with the default 1%). min, max, mean and
// count are exact. Buckets cover 1 ns to about 3 hours; longer latencies land in the last one.

#ifndef GRADSERVE_CLIENT_LOAD_LATENCY_HISTOGRAM_H_
#define GRADSERVE_CLIENT_LOAD_LATENCY_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace gradserve::load {

// Thread safety: none; callers serialize access (ResultRecorder holds its own lock).
class LatencyHistogram {
 public:
  // precision: relative width of a bucket, in (0, 1].
  explicit LatencyHistogram(double precision = 0.01);

  void Record(int64_t latency_ns);
  // Adds other's samples; both must have the same precision.
  void Merge(const LatencyHistogram& other);

  int64_t count() const { return count_; }
  int64_t min_ns() const { return count_ == 0 ? 0 : min_ns_; }
  int64_t max_ns() const { return max_ns_; }
  double mean_ns() const { return count_ == 0 ? 0 : sum_ns_ / static_cast<double>(count_); }
  // The q-quantile (q in [0, 1]) in nanoseconds; 0 when empty.
  int64_t Quantile(double q) const;

  // Samples counted in [lo_ns, hi_ns), by bucket middles: for coarse display histograms.
  int64_t CountInRange(int64_t lo_ns, int64_t hi_ns) const;

 private:
  int BucketOf(int64_t latency_ns) const;
  // The value reported for bucket i (its geometric middle, within [min, max]).
  int64_t Representative(int i) const;

  double log_growth_;  // log(1 + precision)
  std::vector<int64_t> buckets_;
  int64_t count_ = 0;
  int64_t min_ns_ = 0;
  int64_t max_ns_ = 0;
  double sum_ns_ = 0;
};

// One bar of a display histogram: samples in [from_ns, to_ns).
struct HistogramBin {
  int64_t from_ns = 0;
  int64_t to_ns = 0;
  int64_t count = 0;
};

// `bins` equal-width bars from the histogram's min to its max (the last one includes the max);
// empty when the histogram is.
std::vector<HistogramBin> DisplayBins(const LatencyHistogram& histogram, int bins);

// The quantiles every report lists, with their labels.
struct ReportedQuantile {
  const char* label;  // "p50"
  double q;           // 0.5
};
const std::vector<ReportedQuantile>& ReportedQuantiles();

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LATENCY_HISTOGRAM_H_
