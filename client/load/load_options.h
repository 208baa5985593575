// LoadOptions: how a load run sends its calls, and the bounds every run obeys.
//
// Note [Bounded load]
// A run always ends: it stops issuing calls after `requests` measured calls or after
// `duration` of measurement, whichever comes first (at least one must be set), and whatever
// happens it ends within `max_duration` of its start, cancelling the calls still in flight.
// ValidateLoadOptions refuses settings past the caps below, so that no typo becomes an
// endless or unbounded load.

#ifndef GRADSERVE_CLIENT_LOAD_LOAD_OPTIONS_H_
#define GRADSERVE_CLIENT_LOAD_LOAD_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"

namespace gradserve::load {

inline constexpr int kMaxConcurrency = 10'000;
inline constexpr int kMaxConnections = 1'000;
inline constexpr double kMaxRate = 1e6;  // calls per second
inline constexpr int64_t kMaxRequests = 100'000'000;
inline constexpr int64_t kMaxWarmup = 10'000'000;
inline absl::Duration MaxRunDuration() { return absl::Hours(1); }

struct LoadOptions {
  // host:port of each server; calls go to them round-robin.
  std::vector<std::string> targets;
  // Closed loop: calls kept in flight at once. Open loop: the most in flight at once; a call
  // due while all are busy waits for one, and its latency counts that wait.
  int concurrency = 1;
  // How calls are spread over several targets (Note [Several replicas] in
  // client/library/channel_target.h).
  enum class Balance {
    // Each connection is one gRPC channel to every target, round_robin with UNAVAILABLE
    // retried: a target that fails or drains gets no calls, its calls go to the others.
    kRoundRobin,
    // Each connection is a channel to one target, calls dealt to them strictly in turn: each
    // target's share is exact, and a target that fails fails its share.
    kPerTarget,
  };
  Balance balance = Balance::kRoundRobin;
  // TCP connections (gRPC channels): with kRoundRobin, channels over all the targets (each
  // with a connection to every target); with kPerTarget, channels per target. Calls are
  // spread over them in turn.
  int connections = 1;
  // 0: closed loop (each finished call starts the next). > 0: open loop, calls started at
  // this fixed rate per second, latency measured from each call's intended send time.
  double rate = 0;
  // Measured calls to make (0: bounded by duration only).
  int64_t requests = 0;
  // How long to measure (zero: bounded by requests only).
  absl::Duration duration = absl::ZeroDuration();
  // Calls made first and left out of every figure.
  int64_t warmup = 0;
  // Deadline of each call.
  absl::Duration call_timeout = absl::Seconds(60);
  // The whole run, warm-up included, ends by then (Note [Bounded load]).
  absl::Duration max_duration = absl::Minutes(10);
  // What every connection is made with (client/library/channel_credentials.h: TLS, mutual TLS,
  // a token); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Non-empty: each call sends `x-request-id: PREFIX-N` (N: the call's number, warm-up
  // included), which the server logs and echoes (Note [Trace ids] in
  // server/service/trace_id.h). Printable ASCII without spaces, at most 100 bytes.
  std::string trace_prefix;
};

// INVALID_ARGUMENT naming the first option that is missing or out of range.
absl::Status ValidateLoadOptions(const LoadOptions& options);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LOAD_OPTIONS_H_
