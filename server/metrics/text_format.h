// The Prometheus text exposition format (version 0.0.4), written by the server's /metrics.
//
// Note [Label values]
// A label value is a time series of its own in Prometheus: a client that could choose one
// could make the server and its Prometheus keep without bound. So the server's labels take
// their values only from small fixed sets (the rpc's name from the service, the gRPC code's
// name, the reason from the server's own list) and from the operator's token file (tenants,
// at most RequestMetrics::kMaxTenants of them); never from a request (its id, its ops' or
// values' names). Even so, every value is bounded to kMaxLabelValueBytes and escaped as the
// format says (backslash, double quote, newline), and any byte outside printable ASCII is
// written as '_', so a value can neither end its line nor carry bytes that are not UTF-8.

#ifndef GRADSERVE_SERVER_METRICS_TEXT_FORMAT_H_
#define GRADSERVE_SERVER_METRICS_TEXT_FORMAT_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace gradserve::server::metrics {

// The Content-Type of the text format.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The longest label value written; longer ones are cut (Note [Label values]).
inline constexpr size_t kMaxLabelValueBytes = 128;

// value bounded and escaped for a label (Note [Label values]), without the quotes.
std::string EscapeLabelValue(absl::string_view value);

// Appends metric families to a string, in the text format. Names and label names are the
// server's own (constants); label values are escaped.
//
// Thread safety: none; one writer per scrape.
class TextWriter {
 public:
  using Labels = std::initializer_list<std::pair<absl::string_view, absl::string_view>>;

  // The "# HELP" and "# TYPE" lines of a family: type is "counter", "gauge" or "histogram".
  // Call it once for a name, before its samples.
  void Family(absl::string_view name, absl::string_view type, absl::string_view help);
  // One sample: name{labels} value.
  void Sample(absl::string_view name, Labels labels, int64_t value);
  void Sample(absl::string_view name, Labels labels, double value);
  // One histogram's series: name_bucket{labels,le="..."} (cumulative, from the per-bucket
  // counts of kBuckets buckets), name_sum (seconds, from microseconds) and name_count.
  void Histogram(absl::string_view name, Labels labels, const int64_t* buckets, int64_t sum_us);

  const std::string& text() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  // name{labels[,le="le"]} and a space.
  void Series(absl::string_view name, Labels labels, absl::string_view le = {});

  std::string out_;
};

}  // namespace gradserve::server::metrics

#endif  // GRADSERVE_SERVER_METRICS_TEXT_FORMAT_H_
