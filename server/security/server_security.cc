#include "server/security/server_security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace gradserve::server {
namespace {

// The PEM files the credentials are made of: read whole, checked with OpenSSL.
absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, " ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioDeleter> MemoryBio(const std::string& bytes) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// The first certificate of a PEM file, or null.
std::unique_ptr<X509, X509Deleter> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  return std::unique_ptr<X509, X509Deleter>(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// Note [Certificates re-read on change]: the files are what they should be. OpenSSL's error
// queue is cleared, not printed: its entries can quote what it read.
absl::Status CheckFiles(const SecurityOptions& o) {
  absl::StatusOr<std::string> cert = ReadFile("tls_cert", o.tls_cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("tls_key", o.tls_key);
  if (!key.ok()) return key.status();
  auto x509 = FirstCertificate(*cert);
  auto key_bio = MemoryBio(*key);
  std::unique_ptr<EVP_PKEY, KeyDeleter> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert ", o.tls_cert, ": no PEM certificate in it"));
  }
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key ", o.tls_key, ": no PEM private key in it (or one with a passphrase)"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key ", o.tls_key, " is not the key of --tls_cert ", o.tls_cert));
  }
  if (!o.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("tls_client_ca", o.tls_client_ca);
    if (!ca.ok()) return ca.status();
    auto first = FirstCertificate(*ca);
    ERR_clear_error();
    if (first == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_client_ca ", o.tls_client_ca, ": no PEM certificate in it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerSecurity> SetUpSecurity(const SecurityOptions& options) {
  if (absl::Status s = CheckSecurityOptions(options); !s.ok()) return s;
  ServerSecurity security;
  if (!options.tls()) {
    security.credentials = grpc::InsecureServerCredentials();
    security.description = "tls: off (plaintext); tokens: off";
    return security;
  }
  if (absl::Status s = CheckFiles(options); !s.ok()) return s;
  const auto seconds = static_cast<unsigned int>(
      std::max(1.0, std::ceil(absl::ToDoubleSeconds(options.reload_interval))));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.tls_key, options.tls_cert, options.tls_client_ca, seconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!options.tls_client_ca.empty()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  security.credentials = grpc::experimental::TlsServerCredentials(tls);
  if (security.credentials == nullptr) {
    return absl::InvalidArgumentError("gRPC could not make TLS credentials of --tls_cert");
  }
  security.description = absl::StrCat(
      "tls: on", options.tls_client_ca.empty() ? "" : ", client certificates required");
  if (options.tokens()) {
    absl::StatusOr<std::shared_ptr<TokenAuth>> auth =
        TokenAuth::Load(options.auth_tokens_file, options.reload_interval);
    if (!auth.ok()) return auth.status();
    security.auth = *std::move(auth);
    security.credentials->SetAuthMetadataProcessor(security.auth);
    const std::shared_ptr<const TokenTable> table = security.auth->table();
    absl::StrAppend(&security.description, "; tokens: ", table->entries().size(), " clients of ",
                    table->tenant_count(), " tenants");
  } else {
    absl::StrAppend(&security.description, "; tokens: off");
  }
  absl::StrAppend(&security.description, "; files checked every ",
                  absl::FormatDuration(options.reload_interval));
  return security;
}

}  // namespace gradserve::server
