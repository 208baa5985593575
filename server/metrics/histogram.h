// The buckets of the server's duration histograms.

#ifndef GRADSERVE_SERVER_METRICS_HISTOGRAM_H_
#define GRADSERVE_SERVER_METRICS_HISTOGRAM_H_

#include <array>
#include <cstdint>

namespace gradserve::server::metrics {

// Upper bounds of the buckets, in microseconds: 1-2.5-5 steps from 10 µs (a grad_tiny call
// takes tens of µs) to 2 minutes (a large streamed request), so both ends are resolved. The
// last bucket, +Inf, is implicit.
inline constexpr std::array<int64_t, 21> kBucketBoundsUs = {
    10,    25,     50,     100,    250,     500,     1000,    2500,     5000,     10000,    25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 120000000};
inline constexpr int kBuckets = static_cast<int>(kBucketBoundsUs.size()) + 1;

// The bucket of a duration of us microseconds: the first whose bound is at least us, or the
// +Inf bucket (kBuckets - 1).
int BucketOf(int64_t us);

}  // namespace gradserve::server::metrics

#endif  // GRADSERVE_SERVER_METRICS_HISTOGRAM_H_
