#include "client/library/channel_credentials.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradserve::client {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool IsValidToken(const std::string& token) {
  return !token.empty() &&
         std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = ReadFile(path, what);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  if (!IsValidToken(token)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": its first line must be the token, printable ASCII without spaces"));
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurity& security) {
  if (!security.token.empty() && !IsValidToken(security.token)) {
    return absl::InvalidArgumentError(
        "the token must be printable ASCII without spaces (--token_file, GRADSERVE_TOKEN)");
  }
  if (!security.uses_tls()) {
    if (!security.token.empty()) {
      return absl::InvalidArgumentError(
          "a token is sent only over TLS: add --tls (or --tls_ca) for a server with "
          "--tls_cert");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(security.tls_cert_file.empty()
                                          ? "--tls_key needs --tls_cert"
                                          : "--tls_cert needs --tls_key");
  }
  grpc::SslCredentialsOptions ssl;
  if (!security.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(security.tls_ca_file, "--tls_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!security.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(security.tls_cert_file, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(security.tls_key_file, "--tls_key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!security.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(security.token));
  }
  return credentials;
}

}  // namespace gradserve::client
