#include "server/base/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradserve::server {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, absl::string_view flag) {
  const size_t colon = address.rfind(':');
  HostPort parsed;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &parsed.port) || parsed.port < 0 ||
      parsed.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", address, "' is not host:port (port 0 to 65535)"));
  }
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  parsed.host = std::string(host);
  return parsed;
}

}  // namespace gradserve::server
