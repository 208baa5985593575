#include "client/load/latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace gradserve::load {
namespace {

// 1e13 ns (about 2.8 hours): the top of the covered range.
constexpr double kMaxCoveredNs = 1e13;

}  // namespace

LatencyHistogram::LatencyHistogram(double precision)
    : log_growth_(std::log1p(std::clamp(precision, 1e-4, 1.0))),
      buckets_(static_cast<size_t>(std::ceil(std::log(kMaxCoveredNs) / log_growth_)) + 1, 0) {}

int LatencyHistogram::BucketOf(int64_t latency_ns) const {
  if (latency_ns <= 1) return 0;
  const int i = static_cast<int>(std::log(static_cast<double>(latency_ns)) / log_growth_);
  return std::min(i, static_cast<int>(buckets_.size()) - 1);
}

int64_t LatencyHistogram::Representative(int i) const {
  const double middle = std::exp((i + 0.5) * log_growth_);
  return std::clamp(static_cast<int64_t>(std::llround(middle)), min_ns(), max_ns_);
}

void LatencyHistogram::Record(int64_t latency_ns) {
  latency_ns = std::max<int64_t>(latency_ns, 0);
  ++buckets_[BucketOf(latency_ns)];
  min_ns_ = count_ == 0 ? latency_ns : std::min(min_ns_, latency_ns);
  max_ns_ = std::max(max_ns_, latency_ns);
  sum_ns_ += static_cast<double>(latency_ns);
  ++count_;
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  const size_t n = std::min(buckets_.size(), other.buckets_.size());
  for (size_t i = 0; i < n; ++i) buckets_[i] += other.buckets_[i];
  min_ns_ = count_ == 0 ? other.min_ns_ : std::min(min_ns_, other.min_ns_);
  max_ns_ = std::max(max_ns_, other.max_ns_);
  sum_ns_ += other.sum_ns_;
  count_ += other.count_;
}

int64_t LatencyHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  if (q <= 0) return min_ns_;
  if (q >= 1) return max_ns_;
  // The smallest bucket whose cumulative count reaches ceil(q * count).
  const auto rank = static_cast<int64_t>(std::ceil(q * static_cast<double>(count_)));
  int64_t seen = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    seen += buckets_[i];
    if (seen >= rank) return Representative(static_cast<int>(i));
  }
  return max_ns_;
}

int64_t LatencyHistogram::CountInRange(int64_t lo_ns, int64_t hi_ns) const {
  int64_t n = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] == 0) continue;
    const int64_t v = Representative(static_cast<int>(i));
    if (v >= lo_ns && v < hi_ns) n += buckets_[i];
  }
  return n;
}

std::vector<HistogramBin> DisplayBins(const LatencyHistogram& histogram, int bins) {
  std::vector<HistogramBin> out;
  if (histogram.count() == 0 || bins < 1) return out;
  const int64_t lo = histogram.min_ns();
  const int64_t hi = histogram.max_ns() + 1;
  const double width = static_cast<double>(hi - lo) / bins;
  for (int i = 0; i < bins; ++i) {
    HistogramBin bin;
    bin.from_ns = lo + static_cast<int64_t>(width * i);
    bin.to_ns = i + 1 == bins ? hi : lo + static_cast<int64_t>(width * (i + 1));
    if (bin.to_ns <= bin.from_ns) continue;  // narrower than a nanosecond
    bin.count = histogram.CountInRange(bin.from_ns, bin.to_ns);
    out.push_back(bin);
  }
  return out;
}

const std::vector<ReportedQuantile>& ReportedQuantiles() {
  static const auto* const quantiles = new std::vector<ReportedQuantile>{
      {"p50", 0.5}, {"p90", 0.9}, {"p95", 0.95}, {"p99", 0.99}, {"p99.9", 0.999}};
  return *quantiles;
}

}  // namespace gradserve::load
