// The shared-memory regions clients registered: by name, per tenant, ended when idle.
//
// Note [Shared-memory regions]
// A client on the server's host puts big tensors in a POSIX shared-memory object and registers
// it (RegisterSharedMemory) under a name of its choosing; its requests then name ranges of the
// region (SharedMemoryRange) as leaf values, seeds and gradient destinations, and those bytes
// never cross the connection. What the server does with a range:
//   - a tensor's values are checked against the region in the request's census (Note [Validate
//     before allocating]) and copied out of it into the request's own tensor, charged to the
//     request's budget like any other;
//   - a gradient with a destination is copied into the range once its call is done, and the
//     response carries its dtype, shape and range instead of its bytes.
// Both copies are guarded (Note [A region shrunk under the server]). Names are one space for
// the whole server, each bound to the tenant that registered it (the implicit tenant "" without
// a token file): a request naming another tenant's region, or registering an object another
// tenant registered, gets PERMISSION_DENIED. A region's mapped bytes are charged to its
// tenant's share of the server's memory budget for as long as it is registered. Bounds: a
// tenant holds at most max_per_tenant regions; a region no request named for its idle TTL
// (at most the server's) ends (a reaper checks a few times per TTL); a region in use by a
// request never expires, and its mapping lives until the last request using it is done, even
// if it is unregistered meanwhile. EndAll (draining) ends every region and refuses new ones.
//
// Thread safety: every method may be called from any thread.

#ifndef GRADSERVE_SERVER_SHARED_MEMORY_REGISTRY_H_
#define GRADSERVE_SERVER_SHARED_MEMORY_REGISTRY_H_

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
#include "engine/tensor/memory_budget.h"
#include "engine/util/mutex.h"
#include "server/base/periodic_thread.h"
#include "server/shared_memory/region.h"

namespace gradserve::server {

struct SharedMemoryOptions {
  // Every key must start with it (Note [Shared-memory keys]); empty, the default, turns shared
  // memory off. "/gradserve" is the usual choice.
  std::string prefix;
  // Regions one tenant may hold at once; at least 1.
  int64_t max_per_tenant = 16;
  // The longest idle TTL, and the TTL of a region registered without one; positive.
  absl::Duration idle_ttl = absl::Minutes(10);
};

class SharedMemoryRegistry {
 public:
  explicit SharedMemoryRegistry(SharedMemoryOptions options);
  // Stops the reaper and ends every region.
  ~SharedMemoryRegistry();

  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  // Maps byte_size bytes of the object key for tenant under name, charging them to budget (the
  // tenant's), and returns the region's idle TTL: idle_ttl, or the server's when it is zero or
  // longer. Errors: as SharedMemoryRegion::Open; INVALID_ARGUMENT for an empty name or a
  // negative idle_ttl; ALREADY_EXISTS for a name tenant holds; PERMISSION_DENIED for a name or
  // key another tenant holds; RESOURCE_EXHAUSTED past max_per_tenant or the budget;
  // FAILED_PRECONDITION when shared memory is off; UNAVAILABLE after EndAll.
  absl::StatusOr<absl::Duration> Register(absl::string_view tenant, absl::string_view name,
                                          absl::string_view key, int64_t byte_size, bool writable,
                                          absl::Duration idle_ttl,
                                          const std::shared_ptr<MemoryBudget>& budget);

  // Ends tenant's region name. NOT_FOUND if tenant holds no such region; PERMISSION_DENIED if
  // another tenant does.
  absl::Status Unregister(absl::string_view tenant, absl::string_view name);

  // tenant's region name, in use until Done is called with it (so it does not expire
  // meanwhile). INVALID_ARGUMENT naming it (`what` first) if no tenant holds it or shared memory is
  // off; PERMISSION_DENIED if another tenant does.
  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> Use(absl::string_view tenant,
                                                                absl::string_view name,
                                                                absl::string_view what);
  // Ends a use: the region's idle clock starts again.
  void Done(const std::shared_ptr<const SharedMemoryRegion>& region);

  // Ends every region and refuses new ones (draining).
  void EndAll();

  // Regions registered now, and their mapped bytes.
  int64_t size() const;
  int64_t bytes() const;
  const SharedMemoryOptions& options() const { return options_; }

 private:
  struct Entry {
    std::shared_ptr<const SharedMemoryRegion> region;
    std::string tenant;
    MemoryReservation memory;  // the mapped bytes, on the tenant's budget
    absl::Duration idle_ttl;
    int64_t uses = 0;      // requests holding it
    absl::Time last_used;  // when the last use ended, or it was registered
  };

  // Why tenant may not register name for key now (draining, a name or key taken, the tenant at
  // its bound), or OK. Register asks before opening the object and again after.
  absl::Status RefusalLocked(absl::string_view tenant, absl::string_view name,
                             absl::string_view key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Ends the regions idle past their TTL: the reaper's run.
  void Reap();
  // Removes name's entry, returning it to be freed outside the lock.
  Entry EraseLocked(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const SharedMemoryOptions options_;

  // Guards the regions, the per-tenant counts, the keys' owners and the end flag.
  mutable Mutex mutex_;
  absl::flat_hash_map<std::string, Entry> regions_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, int64_t> per_tenant_ ABSL_GUARDED_BY(mutex_);
  // Per key: the tenant that registered it, and under how many names.
  absl::flat_hash_map<std::string, std::pair<std::string, int64_t>> keys_ ABSL_GUARDED_BY(mutex_);
  int64_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool ended_ ABSL_GUARDED_BY(mutex_) = false;
  // Last: started once the rest is made, stopped before it goes.
  PeriodicThread reaper_{
      std::clamp(options_.idle_ttl / 4, absl::Milliseconds(10), absl::Seconds(1)),
      [this] { Reap(); }};
};

// One request's regions: each found in the registry once, for the caller's tenant, and held
// (in use) until the request is done, so that none ends or is unmapped under it.
//
// Thread safety: one request's thread at a time.
class RequestRegions {
 public:
  // registry may be null: then every range is INVALID_ARGUMENT (shared memory off).
  RequestRegions(SharedMemoryRegistry* registry, std::string tenant)
      : registry_(registry), tenant_(std::move(tenant)) {}
  ~RequestRegions();

  RequestRegions(const RequestRegions&) = delete;
  RequestRegions& operator=(const RequestRegions&) = delete;

  // The region name of the request's tenant, valid while this lives; errors as Use's.
  absl::StatusOr<const SharedMemoryRegion*> Find(absl::string_view name, absl::string_view what);

 private:
  SharedMemoryRegistry* const registry_;
  const std::string tenant_;
  absl::flat_hash_map<std::string, std::shared_ptr<const SharedMemoryRegion>> held_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SHARED_MEMORY_REGISTRY_H_
