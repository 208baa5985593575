#include "server/session/session_store.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/util/quote.h"

namespace gradserve::server {
namespace {

// 128 bits of the kernel's random source as 32 hex digits (Note [Graph sessions]).
absl::StatusOr<std::string> NewId() {
  unsigned char bits[16];
  size_t got = 0;
  while (got < sizeof(bits)) {
    const ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom failed making a session id: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  id.reserve(2 * sizeof(bits));
  for (unsigned char b : bits) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

}  // namespace

absl::Status SessionNotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat(
      "session ", Quote(id),
      " is not held by this server: expired (--session_idle_ttl), released, or never made "
      "here; run the forward pass again"));
}

SessionStore::SessionStore(absl::Duration idle_ttl, int64_t max_per_tenant)
    : idle_ttl_(idle_ttl), max_per_tenant_(std::max<int64_t>(1, max_per_tenant)) {}

SessionStore::~SessionStore() { EndAll(); }

absl::StatusOr<std::string> SessionStore::Add(absl::string_view tenant,
                                              std::unique_ptr<graph::RecordedGraph> graph,
                                              int64_t pass_cost, DeviceChoice devices) {
  absl::StatusOr<std::string> id = NewId();
  if (!id.ok()) return id.status();
  MutexLock lock(&mutex_);
  if (ended_) {
    return absl::UnavailableError(
        "the server is shutting down and holds no new sessions; run the forward pass on "
        "another replica");
  }
  int64_t& count = per_tenant_[tenant];
  if (count >= max_per_tenant_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tenant holds ", count, " sessions, the limit is ", max_per_tenant_,
                     " (--max_sessions_per_tenant); release one (Release) or let one expire"));
  }
  // 128 random bits: a collision is not going to happen, but would be a wrong answer.
  if (sessions_.contains(*id)) return absl::InternalError("session id collision");
  ++count;
  Entry& entry = sessions_[*id];
  entry.session =
      std::make_shared<Session>(*id, std::string(tenant), std::move(graph), pass_cost, devices);
  entry.last_used = absl::Now();
  return id;
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Use(absl::string_view tenant,
                                                           absl::string_view id) {
  MutexLock lock(&mutex_);
  auto it = sessions_.find(id);
  // Another tenant's id is not found either (Note [Graph sessions]).
  if (it == sessions_.end() || it->second.session->tenant() != tenant) return SessionNotFound(id);
  ++it->second.uses;
  return it->second.session;
}

void SessionStore::Done(const std::shared_ptr<Session>& session) {
  MutexLock lock(&mutex_);
  auto it = sessions_.find(session->id());
  if (it == sessions_.end() || it->second.session != session) return;  // ended meanwhile
  --it->second.uses;
  it->second.last_used = absl::Now();
}

absl::Status SessionStore::Release(absl::string_view tenant, absl::string_view id) {
  std::shared_ptr<Session> ended;  // freed after the lock is released
  MutexLock lock(&mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.session->tenant() != tenant) return SessionNotFound(id);
  ended = EraseLocked(id);
  return absl::OkStatus();
}

std::shared_ptr<Session> SessionStore::EraseLocked(absl::string_view id) {
  auto it = sessions_.find(id);
  std::shared_ptr<Session> session = std::move(it->second.session);
  sessions_.erase(it);
  auto count = per_tenant_.find(session->tenant());
  if (--count->second == 0) per_tenant_.erase(count);
  return session;
}

void SessionStore::EndAll() {
  absl::flat_hash_map<std::string, Entry> ended;  // freed after the lock is released
  MutexLock lock(&mutex_);
  ended_ = true;
  ended.swap(sessions_);
  per_tenant_.clear();
}

int64_t SessionStore::size() const {
  MutexLock lock(&mutex_);
  return static_cast<int64_t>(sessions_.size());
}

void SessionStore::Reap() {
  std::vector<std::shared_ptr<Session>> expired;  // freed after the lock is released
  MutexLock lock(&mutex_);
  const absl::Time now = absl::Now();
  std::vector<std::string> ids;
  for (const auto& [id, entry] : sessions_) {
    if (entry.uses == 0 && now - entry.last_used >= idle_ttl_) ids.push_back(id);
  }
  for (const std::string& id : ids) expired.push_back(EraseLocked(id));
}

}  // namespace gradserve::server
