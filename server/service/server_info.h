// The static part of the ServerInfo message: version, limits, devices and ops.

#ifndef GRADSERVE_SERVER_SERVICE_SERVER_INFO_H_
#define GRADSERVE_SERVER_SERVICE_SERVER_INFO_H_

#include <string>

#include "gradserve/v1/gradserve.pb.h"
#include "server/service/server_options.h"

namespace gradserve::server {

// The server's version string (the CMake project version).
const char* ServerVersion();

// Describes the server: limits from options, the devices of the DeviceRegistry, every op of
// the OpRegistry plus the interpreter's graph-level ops (grad, checkpoint, hook, detach).
// Counters are left empty for the caller. Call after devices are registered.
v1::ServerInfo DescribeServer(const ServerOptions& options);

// "max_message_bytes=33554432 ... max_name_bytes=256": every field of limits, in the order of
// the contract, for the line the server logs at start.
std::string DescribeLimits(const v1::Limits& limits);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_SERVER_INFO_H_
