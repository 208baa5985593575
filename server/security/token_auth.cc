#include "server/security/token_auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/log.h"

namespace gradserve::server {
namespace {

// The longest token file read: a line per client.
constexpr int64_t kMaxFileBytes = int64_t{16} << 20;

bool SameStamp(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// The file's stamp and table; the error names the flag and file, never the contents.
absl::StatusOr<TokenTable> ReadTable(const std::string& path, struct stat* stamp) {
  if (stat(path.c_str(), stamp) != 0) {
    return absl::NotFoundError(
        absl::StrCat("--auth_tokens_file ", path, ": ", std::strerror(errno)));
  }
  if (stamp->st_size > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file ", path, " is over ", kMaxFileBytes >> 20, " MiB"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file ", path, ": cannot read it"));
  }
  return TokenTable::Parse(text.str(), path);
}

std::string Describe(const TokenTable& table) {
  return absl::StrCat(table.entries().size(), " clients of ", table.tenant_count(), " tenants");
}

}  // namespace

absl::StatusOr<std::shared_ptr<TokenAuth>> TokenAuth::Load(const std::string& path,
                                                           absl::Duration interval) {
  std::shared_ptr<TokenAuth> auth(new TokenAuth(path, interval));
  absl::StatusOr<TokenTable> table = ReadTable(path, &auth->stamp_);
  if (!table.ok()) return table.status();
  {
    MutexLock lock(&auth->mutex_);
    auth->table_ = std::make_shared<const TokenTable>(*std::move(table));
  }
  auth->poller_ = std::thread([raw = auth.get()] { raw->PollLoop(); });
  return auth;
}

TokenAuth::TokenAuth(std::string path, absl::Duration interval)
    : path_(std::move(path)), interval_(interval) {}

TokenAuth::~TokenAuth() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    stop_.SignalAll();
  }
  if (poller_.joinable()) poller_.join();
}

void TokenAuth::PollLoop() {
  for (;;) {
    {
      MutexLock lock(&mutex_);
      if (stop_.WaitWithDeadline(&mutex_, absl::Now() + interval_,
                                 [this]()
                                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return stopping_; })) {
        return;
      }
    }
    ReloadIfChanged();
  }
}

void TokenAuth::ReloadIfChanged() {
  struct stat now = {};
  if (stat(path_.c_str(), &now) == 0 && SameStamp(now, stamp_)) return;
  absl::StatusOr<TokenTable> table = ReadTable(path_, &now);
  if (!table.ok()) {
    const std::string error(table.status().message());
    if (error != last_error_) {  // once per change, not every interval
      std::shared_ptr<const TokenTable> kept = this->table();
      LogLine(absl::StrCat("auth tokens: not reloaded, keeping the previous ", Describe(*kept),
                           ": ", error));
      last_error_ = error;
    }
    return;
  }
  last_error_.clear();
  stamp_ = now;
  LogLine(absl::StrCat("auth tokens: reloaded ", path_, ": ", Describe(*table)));
  auto fresh = std::make_shared<const TokenTable>(*std::move(table));
  MutexLock lock(&mutex_);
  table_ = std::move(fresh);
}

std::shared_ptr<const TokenTable> TokenAuth::table() const {
  MutexLock lock(&mutex_);
  return table_;
}

grpc::Status TokenAuth::Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                                OutputMetadata* /*consumed_auth_metadata*/,
                                OutputMetadata* /*response_metadata*/) {
  absl::string_view path;
  absl::string_view authorization;
  for (const auto& [key, value] : auth_metadata) {
    const absl::string_view k(key.data(), key.size());
    if (k == ":path") path = absl::string_view(value.data(), value.size());
    if (k == "authorization") authorization = absl::string_view(value.data(), value.size());
  }
  const uint32_t needed = PermissionFor(path);
  if (needed == kPermitNone) return grpc::Status::OK;  // health
  const absl::string_view token = BearerToken(authorization);
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server needs a client token: send the metadata "
                        "'authorization: Bearer TOKEN' (docs/security.md)");
  }
  const std::shared_ptr<const TokenTable> table = this->table();
  const TokenEntry* entry = table->Find(token);
  if (entry == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the bearer token is not one of this server's clients' (unknown or "
                        "revoked)");
  }
  if ((entry->permissions & needed) == 0) {
    // path is one the server serves (needed has one bit), so it is no client string.
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("client ", entry->name, " may not call ", path, ": it needs '",
                                     PermissionNames(needed),
                                     "' in the client's METHODS in --auth_tokens_file (it has '",
                                     PermissionNames(entry->permissions), "')"));
  }
  return grpc::Status::OK;
}

std::string TokenAuth::TenantOf(
    const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata) const {
  const auto found = client_metadata.find("authorization");
  if (found == client_metadata.end()) return "";
  const std::shared_ptr<const TokenTable> table = this->table();
  const TokenEntry* entry =
      table->Find(BearerToken(absl::string_view(found->second.data(), found->second.size())));
  return entry == nullptr ? "" : entry->tenant;
}

}  // namespace gradserve::server
