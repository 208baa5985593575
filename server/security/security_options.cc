#include "server/security/security_options.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradserve::server {

absl::Status CheckSecurityOptions(const SecurityOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(o.tls_cert.empty()
                                          ? "--tls_key needs --tls_cert (the certificate chain)"
                                          : "--tls_cert needs --tls_key (its private key)");
  }
  if (!o.tls_client_ca.empty() && !o.tls()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key: client certificates are checked in the "
        "TLS handshake");
  }
  if (o.tokens() && !o.tls()) {
    return absl::InvalidArgumentError(
        "--auth_tokens_file needs --tls_cert and --tls_key: a bearer token sent in plaintext "
        "can be read and replayed by anyone on the path");
  }
  if (o.reload_interval <= absl::ZeroDuration() || o.reload_interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--reload_interval must be positive and finite, got ",
                     absl::FormatDuration(o.reload_interval)));
  }
  if (o.tenant_max_in_flight < 0) {
    return absl::InvalidArgumentError(
        "--tenant_max_in_flight must be 0 (half of --max_in_flight) or more");
  }
  if (!(o.tenant_memory_share > 0 && o.tenant_memory_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant_memory_share must be in (0, 1], got ", o.tenant_memory_share));
  }
  if (!o.admin_listen.empty() && o.admin_listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin_listen must be host:port, got '", o.admin_listen, "'"));
  }
  return absl::OkStatus();
}

bool IsLoopbackHost(absl::string_view host) {
  host = absl::StripPrefix(host, "[");
  host = absl::StripSuffix(host, "]");
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::string ExposureWarning(absl::string_view listen_address, const SecurityOptions& options) {
  const size_t colon = listen_address.rfind(':');
  const absl::string_view host =
      colon == absl::string_view::npos ? listen_address : listen_address.substr(0, colon);
  if (IsLoopbackHost(host)) return "";
  const bool authenticates = options.tokens() || !options.tls_client_ca.empty();
  if (options.tls() && authenticates) return "";
  return absl::StrCat(
      "WARNING: listening on ", listen_address, " (not loopback) ",
      !options.tls() ? "without TLS (--tls_cert, --tls_key) and " : "",
      "without client authentication (--auth_tokens_file or --tls_client_ca): anyone who can "
      "reach the port can run requests and read GetServerInfo",
      !options.tls() ? ", and read and alter the traffic" : "", "; see docs/security.md");
}

}  // namespace gradserve::server
