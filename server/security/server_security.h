// The credentials of the serving port: TLS or mutual TLS from files re-read when they change,
// with TokenAuth as their metadata processor when there is a token file; plaintext otherwise.
//
// Note [Certificates re-read on change]
// The server's certificate and key (--tls_cert, --tls_key) and the client CA (--tls_client_ca)
// are served by gRPC's FileWatcherCertificateProvider, which reads them again every
// --reload_interval (rounded up to whole seconds): cert-manager and Kubernetes Secrets rotate
// them in place, and the next handshake uses the new ones, with no restart, while
// connections already open, and their calls, go on with what they were made with. gRPC keeps
// the previous pair if a new read fails (a key that does not match its certificate, a file
// caught half written) and logs it itself. The files are checked here at start, so that a
// server never starts unable to make a handshake: both must be PEM, and the key must be the
// certificate's. Write a rotated pair the way Kubernetes does (a new directory and a renamed
// link), so that no read sees a new certificate with an old key. Errors name the flag and the
// file, never their contents.
//
// Thread safety: SetUpSecurity may be called from any thread; what it returns is gRPC's and
// TokenAuth's to share.

#ifndef GRADSERVE_SERVER_SECURITY_SERVER_SECURITY_H_
#define GRADSERVE_SERVER_SECURITY_SERVER_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/security/security_options.h"
#include "server/security/token_auth.h"

namespace gradserve::server {

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Null without --auth_tokens_file.
  std::shared_ptr<TokenAuth> auth;
  // For the start-up log: "tls: on, client certificates required (--tls_client_ca); tokens:
  // 3 clients of 2 tenants (--auth_tokens_file); files checked every 5s".
  std::string description;
};

// The serving port's credentials for options (checked with CheckSecurityOptions). NOT_FOUND
// or INVALID_ARGUMENT naming the flag when a file cannot be read or is not what it should be.
absl::StatusOr<ServerSecurity> SetUpSecurity(const SecurityOptions& options);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SECURITY_SERVER_SECURITY_H_
