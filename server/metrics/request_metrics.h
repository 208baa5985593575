// RequestMetrics: what every grad call adds to, by rpc, status and tenant.
//
// Note [Metrics without a lock]
// A grad_tiny call costs the server tens of microseconds, so what a call adds to its metrics
// must cost it a few hundred instructions at most and no lock: the server's threads would
// otherwise meet on one mutex, or on one cache line, on every call. So the counters are
// relaxed atomics (a counter needs no order with anything else), kept in kShards copies; a
// thread takes a shard when it first counts (ThisThreadShard: Note [Counters sharded by thread]
// in engine/util/sharded_counter.h) and adds only to it, and a scrape sums the shards. Within a
// shard, each (rpc, tenant) pair has its own Series, made on its first call (a
// compare-and-swap, once), so memory grows with the pairs that are used, not with every pair
// there could be. A scrape reads while calls add: each counter is exact, but a scrape may see
// a call in one counter and not yet in another (a request counted, its histogram not yet).

#ifndef GRADSERVE_SERVER_METRICS_REQUEST_METRICS_H_
#define GRADSERVE_SERVER_METRICS_REQUEST_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/util/sharded_counter.h"
#include "server/metrics/histogram.h"
#include "server/metrics/text_format.h"

namespace gradserve::server::metrics {

// The service's rpcs, as it names them (the rpc label): the grad calls, which take an engine
// slot, and the cheap ones it answers at once (Ping, GetServerInfo, the session's Release, the
// shared-memory registrations),
// which are counted (requests_total, request_duration_seconds) but never rejected or queued.
enum class Rpc {
  kComputeGradients,
  kComputeGradientsStream,
  kForward,
  kBackward,
  kExtend,
  kRelease,
  kRegisterSharedMemory,
  kUnregisterSharedMemory,
  kPing,
  kGetServerInfo,
};
inline constexpr int kRpcs = 10;
const char* RpcName(Rpc rpc);

// Why a grad call was refused before it was admitted (the reason label).
enum class RejectReason {
  kUnauthenticated,  // its token was revoked after TokenAuth let it in
  kDraining,         // the server is shutting down
  kServerFull,       // --max_in_flight calls were in flight
  kTenantFull,       // its tenant had --tenant_max_in_flight calls in flight
  kUploadsFull,      // --max_uploads streamed requests were arriving
  kUploadIdle,       // its upload made no progress for --upload_idle_timeout
  kUploadTooLarge,   // over --max_request_bytes
  kUploadMemory,     // the server's (or its tenant's) memory could not hold the upload
  kUploadMalformed,  // a chunk was not a Chunk message
  kCancelled,        // the client cancelled while sending
};
inline constexpr int kRejectReasons = 10;
const char* RejectReasonName(RejectReason reason);

// How long an admitted call took, in microseconds: in all (received to its status known), and
// if it reached the engine (ran), waiting for a worker, recording its graph and its backward.
struct CallTimes {
  int64_t total_us = 0;
  bool ran = false;
  int64_t queue_us = 0;
  int64_t forward_us = 0;
  int64_t backward_us = 0;
};

// Thread safety: Ended and Rejected may be called from any thread at once, and Write with
// them (Note [Metrics without a lock]).
class RequestMetrics {
 public:
  // Tenants with series of their own; any beyond them share one, labelled "_other" (Note
  // [Label values]).
  static constexpr int kMaxTenants = 64;
  // Slot 0: no token file (tenant=""); 1..kMaxTenants: the tenants in the order the server
  // met them; the last: the others.
  static constexpr int kTenantSlots = kMaxTenants + 2;
  static constexpr int kShards = kThreadShards;  // ThisThreadShard()

  // The slot of the tenant with index tenant_index (0, 1, ... in the order they were made), or
  // of no tenant for -1.
  static int TenantSlot(int tenant_index) {
    return tenant_index < 0 ? 0 : tenant_index < kMaxTenants ? tenant_index + 1 : kMaxTenants + 1;
  }

  RequestMetrics();
  ~RequestMetrics();
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // A call ended with code (a grad call once admitted); nodes recorded, bytes received and sent.
  void Ended(Rpc rpc, int tenant_slot, absl::StatusCode code, const CallTimes& times, int64_t nodes,
             int64_t bytes_in, int64_t bytes_out);
  // A call was refused before it was admitted.
  void Rejected(Rpc rpc, int tenant_slot, RejectReason reason);

  // Writes the families gradserve_requests_total, gradserve_request_duration_seconds,
  // gradserve_queue_duration_seconds, gradserve_forward_duration_seconds,
  // gradserve_backward_duration_seconds, gradserve_rejected_total,
  // gradserve_received_bytes_total, gradserve_sent_bytes_total and gradserve_nodes_total.
  // tenant_label(slot) is the tenant label of a slot in use, other than 0 and the last.
  void Write(TextWriter* out, absl::FunctionRef<std::string(int slot)> tenant_label) const;

 private:
  struct Series;  // one (rpc, tenant) of one shard
  // The calling thread's shard's Series for (rpc, slot), made on first use.
  Series& Get(Rpc rpc, int tenant_slot);

  std::array<std::array<std::array<std::atomic<Series*>, kTenantSlots>, kRpcs>, kShards> series_{};
};

}  // namespace gradserve::server::metrics

#endif  // GRADSERVE_SERVER_METRICS_REQUEST_METRICS_H_
