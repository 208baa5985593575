#include "client/load/load_options.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/library/channel_target.h"
#include "proto/trace_context.h"

namespace gradserve::load {

absl::Status ValidateLoadOptions(const LoadOptions& o) {
  if (o.targets.empty()) return absl::InvalidArgumentError("no target given");
  if (!o.trace_prefix.empty() &&
      (o.trace_prefix.size() > 100 || !trace_context::IsRequestId(o.trace_prefix))) {
    return absl::InvalidArgumentError(
        "--trace_prefix must be at most 100 printable ASCII bytes without spaces");
  }
  for (const std::string& target : o.targets) {
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == target.size()) {
      return absl::InvalidArgumentError(absl::StrCat("target '", target, "' is not host:port"));
    }
  }
  if (o.balance == LoadOptions::Balance::kRoundRobin) {  // one channel to the whole list
    if (absl::Status s = client::GrpcTarget(absl::StrJoin(o.targets, ",")).status(); !s.ok()) {
      return s;
    }
  }
  if (o.concurrency < 1 || o.concurrency > kMaxConcurrency) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrency must be in [1, ", kMaxConcurrency, "]"));
  }
  if (o.connections < 1 || o.connections > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections must be in [1, ", kMaxConnections, "]"));
  }
  if (!(o.rate >= 0) || o.rate > kMaxRate) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate must be 0 (closed loop) or in (0, ", kMaxRate, "] calls/s"));
  }
  if (o.requests < 0 || o.requests > kMaxRequests) {
    return absl::InvalidArgumentError(absl::StrCat("requests must be in [0, ", kMaxRequests, "]"));
  }
  if (o.duration < absl::ZeroDuration() || o.duration > MaxRunDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration must be in [0, ", absl::FormatDuration(MaxRunDuration()), "]"));
  }
  if (o.requests == 0 && o.duration == absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "unbounded load refused: give a number of requests, a duration, or both");
  }
  if (o.warmup < 0 || o.warmup > kMaxWarmup) {
    return absl::InvalidArgumentError(absl::StrCat("warmup must be in [0, ", kMaxWarmup, "]"));
  }
  if (o.call_timeout <= absl::ZeroDuration() || o.call_timeout > MaxRunDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("the call timeout must be positive and at most ",
                                                   absl::FormatDuration(MaxRunDuration())));
  }
  if (o.max_duration <= absl::ZeroDuration() || o.max_duration > MaxRunDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_duration must be positive and at most ",
                                                   absl::FormatDuration(MaxRunDuration())));
  }
  return absl::OkStatus();
}

}  // namespace gradserve::load
