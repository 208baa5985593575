// A listening address as the flags give it: host:port, [IPv6]:port.

#ifndef GRADSERVE_SERVER_BASE_HOST_PORT_H_
#define GRADSERVE_SERVER_BASE_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {

struct HostPort {
  std::string host;  // without an IPv6 address's brackets
  int port = 0;      // 0 to 65535; 0: pick a free one
};

// Splits address at its last ':'. INVALID_ARGUMENT naming flag (e.g. "--listen") if it is not
// host:port with a port from 0 to 65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, absl::string_view flag);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_HOST_PORT_H_
