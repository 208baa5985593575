#include "server/metrics/histogram.h"

namespace gradserve::server::metrics {

int BucketOf(int64_t us) {
  // Linear: most calls fall in the first few buckets, and it is a handful of compares.
  int i = 0;
  while (i < static_cast<int>(kBucketBoundsUs.size()) && us > kBucketBoundsUs[i]) ++i;
  return i;
}

}  // namespace gradserve::server::metrics
