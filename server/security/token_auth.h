// TokenAuth: gRPC's auth metadata processor that lets a call in only with a known client's
// bearer token allowed its method, and reloads the token file when it changes.
//
// Note [Who may call]
// With --auth_tokens_file, every call on the serving port but health's (probes must need no
// secret) is checked by TokenAuth::Process before any handler sees it, on gRPC's thread (it is
// not blocking: a hash and a scan of a short table): no `authorization: Bearer TOKEN`, or a
// token that is no client's, ends the call with UNAUTHENTICATED; a client's token not allowed
// the method (Note [The token file]: grad, info, reflection) with PERMISSION_DENIED. So
// reflection and GetServerInfo (limits, devices, counters) need `info` or `reflection`, and the
// grad methods `grad`. Neither message names the token, nor does any log line: the table
// holds only digests, and a reload that fails logs the file, the line and the field. gRPC
// calls a processor only on secure credentials, and a bearer token in plaintext is anyone's,
// so tokens need TLS (CheckSecurityOptions). With --tls_client_ca, the TLS handshake itself
// refuses a connection without a client certificate signed by that CA; both may be on. The
// tenant of a call is found again by the service (TenantOf), from the same header: the
// processor's AuthContext is the connection's, shared by every call on it, so it cannot carry
// a call's identity.
//
// Note [Token file reloads]
// A thread checks the file every --reload_interval: when its inode, size, mtime or ctime
// changed (an edit, a rename over it, Kubernetes swapping a Secret's ..data link), it is read
// and parsed again. A good file replaces the table at once for the next call (a revoked token
// is refused from then on; calls already admitted go on); a bad or unreadable one keeps the
// previous table and logs one line, once per change, naming the file and what is wrong.
//
// Thread safety: Process and TenantOf are called by gRPC from any thread; the table is
// swapped under mutex_ and read as a shared_ptr, so a lookup never waits for a reload.

#ifndef GRADSERVE_SERVER_SECURITY_TOKEN_AUTH_H_
#define GRADSERVE_SERVER_SECURITY_TOKEN_AUTH_H_

#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "server/security/token_table.h"

namespace gradserve::server {

class TokenAuth final : public grpc::AuthMetadataProcessor {
 public:
  // Reads path and starts checking it every interval (Note [Token file reloads]). NOT_FOUND
  // or INVALID_ARGUMENT naming --auth_tokens_file if it cannot be read or parsed.
  static absl::StatusOr<std::shared_ptr<TokenAuth>> Load(const std::string& path,
                                                         absl::Duration interval);
  // Stops the reloading thread.
  ~TokenAuth() override;

  TokenAuth(const TokenAuth&) = delete;
  TokenAuth& operator=(const TokenAuth&) = delete;

  // Note [Who may call]. Not blocking: runs on gRPC's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // The tenant of the client whose token a call's metadata carries; empty if none (a token
  // revoked since Process let the call in).
  std::string TenantOf(
      const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata) const;

  // The table in force.
  std::shared_ptr<const TokenTable> table() const;
  const std::string& path() const { return path_; }

 private:
  TokenAuth(std::string path, absl::Duration interval);
  // Reads and parses the file if its stamp changed; logs the outcome of a reload.
  void ReloadIfChanged();
  void PollLoop();

  const std::string path_;
  const absl::Duration interval_;
  // Guards the table in force and the poller's stop flag.
  mutable Mutex mutex_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  CondVar stop_;
  // Only the poller (and Load, before it starts) touches these.
  struct stat stamp_ = {};
  std::string last_error_;  // the last failed reload's message, logged once
  std::thread poller_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SECURITY_TOKEN_AUTH_H_
