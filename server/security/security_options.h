// What secures a server: its TLS files, its clients' tokens, the tenants' shares and the admin
// address (Note [Who may call] in server/security/token_auth.h). server/process/main.cc fills
// it from the flags of the same names; ServerOptions carries it.

#ifndef GRADSERVE_SERVER_SECURITY_SECURITY_OPTIONS_H_
#define GRADSERVE_SERVER_SECURITY_SECURITY_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradserve::server {

struct SecurityOptions {
  // PEM files of the server's certificate chain and its private key: TLS on the serving port
  // when both are set. Re-read when they change (Note [Certificates re-read on change] in
  // server/security/tls_credentials.h).
  std::string tls_cert;
  std::string tls_key;
  // PEM file of the CAs that sign client certificates: mutual TLS, every connection must
  // present a certificate signed by one of them. Needs tls_cert.
  std::string tls_client_ca;
  // The clients' tokens (Note [The token file] in server/security/token_table.h); every call
  // but health's needs one. Needs tls_cert: a bearer token sent in plaintext is anyone's.
  std::string auth_tokens_file;
  // How often the TLS files and the token file are checked for changes (the TLS files at
  // whole seconds, at least 1, as gRPC's file watcher takes them).
  absl::Duration reload_interval = absl::Seconds(5);
  // With a token file: grad calls one tenant may have admitted at once; 0: half of
  // --max_in_flight (at least 1). Without one, there is one tenant and no such bound.
  int64_t tenant_max_in_flight = 0;
  // With a token file: the share of the server's memory budget each tenant's requests may
  // hold together, in (0, 1].
  double tenant_memory_share = 0.5;
  // host:port of the admin surface (health, reflection, GetServerInfo), plaintext, meant for
  // loopback or the pod's network; empty: none.
  std::string admin_listen;

  bool tls() const { return !tls_cert.empty(); }
  bool tokens() const { return !auth_tokens_file.empty(); }
};

// INVALID_ARGUMENT naming the flag: half a key pair, a client CA or a token file without
// TLS, a reload interval or a tenant share out of range. Files are read by
// MakeServerCredentials and TokenAuth::Load.
absl::Status CheckSecurityOptions(const SecurityOptions& options);

// Whether host (as in host:port, brackets allowed) is a loopback address: "localhost",
// 127.0.0.0/8 or ::1.
bool IsLoopbackHost(absl::string_view host);

// The start-up warning for a server that listens on listen_address without TLS or without
// client authentication (neither tokens nor client certificates) on a non-loopback address;
// empty when there is nothing to warn about.
std::string ExposureWarning(absl::string_view listen_address, const SecurityOptions& options);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SECURITY_SECURITY_OPTIONS_H_
