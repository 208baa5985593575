#include "client/load/timeline.h"

#include <algorithm>

namespace gradserve::load {

Timeline::Timeline(int64_t initial_slice_ns, int max_slices)
    : slice_ns_(std::max<int64_t>(initial_slice_ns, 1)), max_slices_(std::max(max_slices, 2)) {}

void Timeline::Record(int64_t at_ns, int64_t latency_ns, bool ok) {
  at_ns = std::max<int64_t>(at_ns, 0);
  while (at_ns / slice_ns_ >= max_slices_) Coarsen();
  const auto i = static_cast<size_t>(at_ns / slice_ns_);
  if (slices_.size() <= i) slices_.resize(i + 1);
  Slice& slice = slices_[i];
  ++slice.count;
  if (ok) {
    slice.latency.Record(latency_ns);
  } else {
    ++slice.errors;
  }
}

void Timeline::Coarsen() {
  std::vector<Slice> merged((slices_.size() + 1) / 2);
  for (size_t i = 0; i < slices_.size(); ++i) {
    Slice& into = merged[i / 2];
    into.count += slices_[i].count;
    into.errors += slices_[i].errors;
    into.latency.Merge(slices_[i].latency);
  }
  slices_ = std::move(merged);
  slice_ns_ *= 2;
}

}  // namespace gradserve::load
