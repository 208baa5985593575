// The credentials a client connects with: plaintext, TLS, mutual TLS, and a bearer token
// sent with every call (docs/security.md; the server's side is Note [Who may call] in
// server/security/token_auth.h).
//
//   client::ChannelSecurity security;
//   security.tls_ca_file = "ca.pem";           // the CA that signed the server's certificate
//   security.tls_cert_file = "client.pem";     // mutual TLS: this client's certificate ...
//   security.tls_key_file = "client-key.pem";  // ... and its key
//   security.token = "s3cret";                 // sent as "authorization: Bearer s3cret"
//   client::ClientOptions options;
//   options.credentials = *client::MakeChannelCredentials(security);
//   auto client = client::Client::Connect("server.example:50051", options);
//
// Thread safety: the functions may be called from any thread.

#ifndef GRADSERVE_CLIENT_LIBRARY_CHANNEL_CREDENTIALS_H_
#define GRADSERVE_CLIENT_LIBRARY_CHANNEL_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"

namespace gradserve::client {

struct ChannelSecurity {
  // TLS even without a CA file (the server's certificate then checked against the system's
  // roots). Any of the files below implies it.
  bool tls = false;
  // PEM file of the CAs the server's certificate must chain to; empty: the system's roots.
  std::string tls_ca_file;
  // PEM files of this client's certificate chain and key, for mutual TLS; both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The bearer token sent with every call as "authorization: Bearer TOKEN"; empty: none. Only
  // over TLS: gRPC refuses to send it in plaintext, and so does MakeChannelCredentials.
  std::string token;

  bool uses_tls() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() || !tls_key_file.empty();
  }
};

// Plaintext credentials when security asks for no TLS; else TLS (with the client's
// certificate, and the token as call credentials). INVALID_ARGUMENT or NOT_FOUND naming the
// field (as --tls_ca, --tls_cert, --tls_key) for a file that cannot be read, half a key pair
// or a token without TLS; never quoting a file's contents or the token.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& security);

// The token in a file: its first line, surrounding whitespace removed. NOT_FOUND or
// INVALID_ARGUMENT (empty, or not printable ASCII) naming `what` (e.g. "--token_file x").
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what);

// Whether token can be sent as a bearer token: printable ASCII, no spaces, not empty.
bool IsValidToken(const std::string& token);

}  // namespace gradserve::client

#endif  // GRADSERVE_CLIENT_LIBRARY_CHANNEL_CREDENTIALS_H_
