// Tenants: the shares of the server's engine slots and memory that each tenant's calls draw
// from, so that one tenant cannot starve the others.
//
// Note [Tenants' shares]
// With --auth_tokens_file, every client belongs to a tenant (Note [The token file]), and a
// tenant's grad calls together may have at most --tenant_max_in_flight admitted at once (by
// default half of --max_in_flight) and hold at most --tenant_memory_share of the server's
// memory budget (by default half). Both are checked before the server's own bounds: a tenant
// over its share gets RESOURCE_EXHAUSTED naming the tenant and its limit, while the other
// tenants' calls are admitted as before. A tenant's budget is a MemoryBudget between the
// server's and each request's (Note [Budgets within a budget]): a tensor, an upload's buffered
// bytes or a response counts against its request, its tenant and the server at once, and the
// error names whichever limit it passed. The shares may add up to more than the server's
// bounds (two tenants of half each fill it); they bound each tenant, the server's bounds still
// bound all. Without a token file there is one implicit tenant and no share: the server's
// bounds alone apply, as before.
//
// Thread safety: Tenants::Get may be called from any thread; a Tenant's methods too. Tenants
// are never removed (their names come from the operator's file, not from clients), so a
// Tenant* lives as long as the Tenants.

#ifndef GRADSERVE_SERVER_SECURITY_TENANTS_H_
#define GRADSERVE_SERVER_SECURITY_TENANTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

class Tenant {
 public:
  // index: the tenant's place in the order its Tenants made them (0, 1, ...).
  Tenant(std::string name, int64_t max_in_flight, int64_t memory_bytes,
         std::shared_ptr<MemoryBudget> server_memory, int index = 0);

  const std::string& name() const { return name_; }
  int index() const { return index_; }
  // Within the server's budget (Note [Tenants' shares]).
  const std::shared_ptr<MemoryBudget>& memory() const { return memory_; }
  // Counts one more grad call in flight, or RESOURCE_EXHAUSTED naming the tenant's limit.
  absl::Status Admit();
  // Ends a call that Admit counted.
  void Release() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  const std::string name_;
  const int index_;
  const int64_t max_in_flight_;
  const std::shared_ptr<MemoryBudget> memory_;
  std::atomic<int64_t> in_flight_{0};
};

class Tenants {
 public:
  // Each tenant may have max_in_flight calls admitted and hold memory_bytes of server_memory.
  Tenants(int64_t max_in_flight, int64_t memory_bytes, std::shared_ptr<MemoryBudget> server_memory);

  // The tenant named name, made on first use.
  Tenant* Get(absl::string_view name);
  // Every tenant made so far, in the order they were made (Tenant::index()).
  std::vector<const Tenant*> All() const;

  int64_t max_in_flight() const { return max_in_flight_; }
  int64_t memory_bytes() const { return memory_bytes_; }

 private:
  const int64_t max_in_flight_;
  const int64_t memory_bytes_;
  const std::shared_ptr<MemoryBudget> server_memory_;
  // Guards the map of tenants; a Tenant's own state is atomic.
  mutable Mutex mutex_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> tenants_ ABSL_GUARDED_BY(mutex_);
  std::vector<const Tenant*> in_order_ ABSL_GUARDED_BY(mutex_);  // tenants_' Tenants, by index
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SECURITY_TENANTS_H_
