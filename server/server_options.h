// Everything a GradServer is configured with; main.cc fills it from flags.

#ifndef GRADSERVE_SERVER_SERVER_OPTIONS_H_
#define GRADSERVE_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/graph/interpreter.h"

namespace gradserve::server {

struct ServerOptions {
  // host:port; port 0 picks a free port (GradServer::port() tells which).
  std::string listen_address = "127.0.0.1:50051";
  // Engine CPU worker threads: requests that run at once. 0: one per hardware thread.
  int worker_threads = 0;
  // Largest gRPC message the server receives (a unary request, one chunk of a stream).
  int64_t max_message_bytes = int64_t{32} << 20;
  // Largest serialized GradRequest, streamed in chunks.
  int64_t max_request_bytes = int64_t{1} << 30;
  // Size of the chunks a streamed response is cut into.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Grad requests admitted at once (queued or running); more get RESOURCE_EXHAUSTED.
  int64_t max_in_flight = 32;
  // Per-request limits enforced by the interpreter and by the request's validation.
  graph::Limits limits;
};

// INVALID_ARGUMENT naming the first field that is out of range (non-positive sizes, a chunk
// larger than a message).
absl::Status CheckOptions(const ServerOptions& options);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVER_OPTIONS_H_
