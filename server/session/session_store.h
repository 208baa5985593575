// Graph sessions: recorded graphs held between a Forward call and its Backward calls.
//
// Note [Graph sessions]
// Forward records a graph as ComputeGradients does and, instead of freeing it, hands it to the
// SessionStore under a new id: 128 bits from the kernel's random source (getrandom), written as
// 32 hex digits, so that an id cannot be guessed. The id is bound to the tenant that made it
// (the implicit tenant "" without a token file); a call of another tenant naming it gets the
// same NOT_FOUND as for an id never made, so that ids of other tenants cannot be probed. What
// the graph holds (tensors, Nodes, saved tensors) stays charged to its own MemoryBudget, which
// lies within the tenant's and the server's (Note [Budgets within a budget]): a held session
// counts against the server's memory for as long as it is held, and only until then.
// Bounds: a tenant holds at most max_per_tenant sessions (RESOURCE_EXHAUSTED naming the flag);
// a session no call used for idle_ttl ends (a reaper thread checks a few times per TTL); a
// session with a call running never expires, its clock restarts when the call ends. Release
// ends one, EndAll (draining) ends all and refuses new ones. An ended session is forgotten: its
// id is NOT_FOUND afterwards, and the graph is freed once the last call using it (which holds
// a shared_ptr) is done, outside the store's lock.
//
// Note [Concurrent backward calls on a session]
// PyTorch lets two threads run backward over one graph at once; with retain_graph both
// succeed, without it the first to free a saved tensor makes the other fail ("Trying to
// backward through the graph a second time"), depending on timing. A session runs its calls one
// at a time (Session::mutex), in arrival order: each pair of calls behaves as PyTorch's two
// threads do when one finishes before the other starts. With retain_graph both succeed with the
// same gradients; without, the second fails with FAILED_PRECONDITION. It is the outcome PyTorch
// can give, made deterministic, and it also serializes the accumulation into .grad.

#ifndef GRADSERVE_SERVER_SESSION_SESSION_STORE_H_
#define GRADSERVE_SERVER_SESSION_SESSION_STORE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/device/device.h"
#include "engine/graph/interpreter.h"
#include "engine/util/mutex.h"
#include "server/base/periodic_thread.h"

namespace gradserve::server {

// One held graph.
class Session {
 public:
  // pass_cost: Note [Inline or pool]'s estimate of one pass over graph (EstimateInlineCost of
  // the Forward that recorded it, calls aside), or kUnboundedCost.
  // devices: the Forward's choice for bare device names (Note [Bare device names]).
  Session(std::string id, std::string tenant, std::unique_ptr<graph::RecordedGraph> graph,
          int64_t pass_cost, DeviceChoice devices)
      : id_(std::move(id)),
        tenant_(std::move(tenant)),
        devices_(devices),
        pass_cost_(pass_cost),
        graph_(std::move(graph)) {}

  const std::string& id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  // Where the session's later calls put their bare "cuda" and "sim": the Forward's devices.
  DeviceChoice devices() const { return devices_; }

  // Held while a call runs on the graph (Note [Concurrent backward calls on a session]).
  Mutex& mutex() ABSL_LOCK_RETURNED(mutex_) { return mutex_; }
  graph::RecordedGraph& graph() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return *graph_; }
  // The graph's cost per pass (Note [Session calls inline]); an Extend call sets it.
  int64_t pass_cost() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return pass_cost_; }
  void set_pass_cost(int64_t cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { pass_cost_ = cost; }

 private:
  const std::string id_;
  const std::string tenant_;
  const DeviceChoice devices_;
  // Serializes the calls on the graph (Note [Concurrent backward calls on a session]).
  Mutex mutex_;
  int64_t pass_cost_ ABSL_GUARDED_BY(mutex_);
  const std::unique_ptr<graph::RecordedGraph> graph_ ABSL_PT_GUARDED_BY(mutex_);
};

// Thread safety: every method may be called from any thread.
class SessionStore {
 public:
  // idle_ttl positive and finite; max_per_tenant at least 1.
  SessionStore(absl::Duration idle_ttl, int64_t max_per_tenant);
  // Stops the reaper and frees the sessions.
  ~SessionStore();

  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Holds graph, whose cost per pass is pass_cost and whose Forward ran on devices (Session),
  // for tenant under a new id, which it returns. RESOURCE_EXHAUSTED when the tenant holds
  // max_per_tenant sessions; UNAVAILABLE after EndAll.
  absl::StatusOr<std::string> Add(absl::string_view tenant,
                                  std::unique_ptr<graph::RecordedGraph> graph, int64_t pass_cost,
                                  DeviceChoice devices = {});

  // The session id of tenant's, marked in use until Done is called with it (so it does not
  // expire meanwhile). NOT_FOUND naming the id if the store does not hold it for tenant.
  absl::StatusOr<std::shared_ptr<Session>> Use(absl::string_view tenant, absl::string_view id);
  // Ends a use: the session's idle clock starts again.
  void Done(const std::shared_ptr<Session>& session);

  // Ends the session id of tenant's; NOT_FOUND as Use.
  absl::Status Release(absl::string_view tenant, absl::string_view id);

  // Ends every session and refuses new ones (draining): their ids are NOT_FOUND from now on.
  void EndAll();

  // Sessions held now.
  int64_t size() const;
  absl::Duration idle_ttl() const { return idle_ttl_; }
  int64_t max_per_tenant() const { return max_per_tenant_; }

 private:
  struct Entry {
    std::shared_ptr<Session> session;
    int64_t uses = 0;      // calls running on it
    absl::Time last_used;  // when the last call ended, or it was made
  };

  // Ends the sessions idle past the TTL: the reaper's run.
  void Reap();
  // Removes id's entry (under mutex_), returning its session to be freed outside the lock.
  std::shared_ptr<Session> EraseLocked(absl::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const absl::Duration idle_ttl_;
  const int64_t max_per_tenant_;

  // Guards the sessions, the per-tenant counts and the end flag.
  mutable Mutex mutex_;
  absl::flat_hash_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, int64_t> per_tenant_ ABSL_GUARDED_BY(mutex_);
  bool ended_ ABSL_GUARDED_BY(mutex_) = false;
  // Last: started once the rest is made, stopped before it goes. A few checks per TTL, at most
  // one a second: a session lives at most a quarter more.
  PeriodicThread reaper_{std::min(idle_ttl_ / 4, absl::Seconds(1)), [this] { Reap(); }};
};

// The status for an id that the store does not hold: NOT_FOUND naming it (quoted, truncated).
absl::Status SessionNotFound(absl::string_view id);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SESSION_SESSION_STORE_H_
