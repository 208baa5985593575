#include "server/shared_memory/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/util/quote.h"

namespace gradserve::server {

SharedMemoryRegistry::SharedMemoryRegistry(SharedMemoryOptions options)
    : options_([&] {
        options.max_per_tenant = std::max<int64_t>(1, options.max_per_tenant);
        return std::move(options);
      }()) {}

SharedMemoryRegistry::~SharedMemoryRegistry() { EndAll(); }

absl::StatusOr<absl::Duration> SharedMemoryRegistry::Register(
    absl::string_view tenant, absl::string_view name, absl::string_view key, int64_t byte_size,
    bool writable, absl::Duration idle_ttl, const std::shared_ptr<MemoryBudget>& budget) {
  if (absl::Status s = CheckSharedMemoryKey(key, options_.prefix);
      !s.ok() && s.code() == absl::StatusCode::kFailedPrecondition) {
    return s;
  }
  if (name.empty()) {
    return absl::InvalidArgumentError("a shared-memory region needs a name");
  }
  if (idle_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory region ", Quote(name), ": idle_ttl_ms is negative"));
  }
  if (idle_ttl == absl::ZeroDuration() || idle_ttl > options_.idle_ttl)
    idle_ttl = options_.idle_ttl;
  {
    // The cheap refusals first, before the object is opened.
    MutexLock lock(&mutex_);
    if (absl::Status s = RefusalLocked(tenant, name, key); !s.ok()) return s;
  }
  MemoryReservation memory(budget);
  if (absl::Status s = memory.Grow(byte_size > 0 ? byte_size : 0); !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("shared-memory region ", Quote(name), " of ",
                                                     byte_size,
                                                     " bytes does not fit: ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Open(name, key, options_.prefix, byte_size, writable);
  if (!region.ok()) return region.status();

  std::shared_ptr<const SharedMemoryRegion> opened = *std::move(region);
  MutexLock lock(&mutex_);
  // Again, as another call may have registered meanwhile; the region just opened is unmapped
  // on return (outside the lock: `opened` was declared before it).
  if (absl::Status s = RefusalLocked(tenant, name, key); !s.ok()) return s;
  ++per_tenant_[tenant];
  auto& key_owner = keys_[key];
  key_owner.first = std::string(tenant);
  ++key_owner.second;
  bytes_ += byte_size;
  Entry& entry = regions_[name];
  entry.region = std::move(opened);
  entry.tenant = std::string(tenant);
  entry.memory = std::move(memory);
  entry.idle_ttl = idle_ttl;
  entry.last_used = absl::Now();
  return idle_ttl;
}

absl::Status SharedMemoryRegistry::RefusalLocked(absl::string_view tenant, absl::string_view name,
                                                 absl::string_view key) const {
  if (ended_) {
    return absl::UnavailableError(
        "the server is shutting down and registers no shared memory; use another replica");
  }
  if (auto it = regions_.find(name); it != regions_.end()) {
    if (it->second.tenant != tenant) {
      return absl::PermissionDeniedError(absl::StrCat("shared-memory region name ", Quote(name),
                                                      " is another tenant's; choose another"));
    }
    return absl::AlreadyExistsError(
        absl::StrCat("shared-memory region ", Quote(name),
                     " is registered already; unregister it first (UnregisterSharedMemory)"));
  }
  if (auto owner = keys_.find(key); owner != keys_.end() && owner->second.first != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared-memory object ", Quote(key), " is registered by another tenant"));
  }
  if (auto count = per_tenant_.find(tenant);
      count != per_tenant_.end() && count->second >= options_.max_per_tenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tenant holds ", count->second, " shared-memory regions, the limit is ",
                     options_.max_per_tenant,
                     " (--max_shared_memory_regions); unregister one (UnregisterSharedMemory)"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Unregister(absl::string_view tenant, absl::string_view name) {
  Entry ended;  // unmapped after the lock is released
  MutexLock lock(&mutex_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "shared-memory region ", Quote(name),
        " is not registered: never, unregistered, or ended idle (--shared_memory_idle_ttl)"));
  }
  if (it->second.tenant != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared-memory region ", Quote(name), " is another tenant's"));
  }
  ended = EraseLocked(name);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> SharedMemoryRegistry::Use(
    absl::string_view tenant, absl::string_view name, absl::string_view what) {
  if (options_.prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": names shared-memory region ", Quote(name),
                     " but shared memory is off on this server (--shared_memory_prefix is empty)"));
  }
  MutexLock lock(&mutex_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shared-memory region ", Quote(name),
        " is not registered: never, unregistered, or ended idle (--shared_memory_idle_ttl); "
        "register it (RegisterSharedMemory)"));
  }
  if (it->second.tenant != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": shared-memory region ", Quote(name), " is another tenant's"));
  }
  ++it->second.uses;
  return it->second.region;
}

void SharedMemoryRegistry::Done(const std::shared_ptr<const SharedMemoryRegion>& region) {
  MutexLock lock(&mutex_);
  auto it = regions_.find(region->name());
  if (it == regions_.end() || it->second.region != region) return;  // ended meanwhile
  --it->second.uses;
  it->second.last_used = absl::Now();
}

SharedMemoryRegistry::Entry SharedMemoryRegistry::EraseLocked(absl::string_view name) {
  auto it = regions_.find(name);
  Entry entry = std::move(it->second);
  regions_.erase(it);
  auto count = per_tenant_.find(entry.tenant);
  if (--count->second == 0) per_tenant_.erase(count);
  auto key = keys_.find(entry.region->key());
  if (--key->second.second == 0) keys_.erase(key);
  bytes_ -= entry.region->byte_size();
  return entry;
}

void SharedMemoryRegistry::EndAll() {
  absl::flat_hash_map<std::string, Entry> ended;  // unmapped after the lock is released
  MutexLock lock(&mutex_);
  ended_ = true;
  ended.swap(regions_);
  per_tenant_.clear();
  keys_.clear();
  bytes_ = 0;
}

int64_t SharedMemoryRegistry::size() const {
  MutexLock lock(&mutex_);
  return static_cast<int64_t>(regions_.size());
}

int64_t SharedMemoryRegistry::bytes() const {
  MutexLock lock(&mutex_);
  return bytes_;
}

void SharedMemoryRegistry::Reap() {
  std::vector<Entry> expired;  // unmapped after the lock is released
  MutexLock lock(&mutex_);
  const absl::Time now = absl::Now();
  std::vector<std::string> names;
  for (const auto& [name, entry] : regions_) {
    if (entry.uses == 0 && now - entry.last_used >= entry.idle_ttl) names.push_back(name);
  }
  for (const std::string& name : names) expired.push_back(EraseLocked(name));
}

RequestRegions::~RequestRegions() {
  for (auto& [name, region] : held_) registry_->Done(region);
}

absl::StatusOr<const SharedMemoryRegion*> RequestRegions::Find(absl::string_view name,
                                                               absl::string_view what) {
  if (auto it = held_.find(name); it != held_.end()) return it->second.get();
  if (registry_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": names shared-memory region ",
                                                   Quote(name),
                                                   " but this call takes no shared memory"));
  }
  absl::StatusOr<std::shared_ptr<const SharedMemoryRegion>> region =
      registry_->Use(tenant_, name, what);
  if (!region.ok()) return region.status();
  const SharedMemoryRegion* found = region->get();
  held_.emplace(std::string(name), *std::move(region));
  return found;
}

}  // namespace gradserve::server
