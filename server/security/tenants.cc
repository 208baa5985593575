#include "server/security/tenants.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradserve::server {

Tenant::Tenant(std::string name, int64_t max_in_flight, int64_t memory_bytes,
               std::shared_ptr<MemoryBudget> server_memory, int index)
    : name_(std::move(name)),
      index_(index),
      max_in_flight_(max_in_flight),
      memory_(MemoryBudget::Make(
          memory_bytes, std::move(server_memory),
          absl::StrCat("tenant ", name_, "'s memory share (--tenant_memory_share)"))) {}

absl::Status Tenant::Admit() {
  int64_t n = in_flight_.load(std::memory_order_relaxed);
  do {
    if (n >= max_in_flight_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", name_, " is at its share: ", n, " of its requests in flight, its limit is ",
          max_in_flight_, " (--tenant_max_in_flight); retry later"));
    }
  } while (!in_flight_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
  return absl::OkStatus();
}

Tenants::Tenants(int64_t max_in_flight, int64_t memory_bytes,
                 std::shared_ptr<MemoryBudget> server_memory)
    : max_in_flight_(max_in_flight),
      memory_bytes_(memory_bytes),
      server_memory_(std::move(server_memory)) {}

Tenant* Tenants::Get(absl::string_view name) {
  MutexLock lock(&mutex_);
  auto [it, inserted] = tenants_.try_emplace(name);
  if (inserted) {
    it->second = std::make_unique<Tenant>(std::string(name), max_in_flight_, memory_bytes_,
                                          server_memory_, static_cast<int>(in_order_.size()));
    in_order_.push_back(it->second.get());
  }
  return it->second.get();
}

std::vector<const Tenant*> Tenants::All() const {
  MutexLock lock(&mutex_);
  return in_order_;
}

}  // namespace gradserve::server
