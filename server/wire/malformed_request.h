// The status for a request's bytes that are no GradRequest. Shared by the two parsers of a
// request's bytes, the unary call's (unary_messages.cc) and the stream's (chunked_request.cc),
// and below both of them and wire.h, so that neither parser includes wire.h.
//
// Thread safety: a stateless function.

#ifndef GRADSERVE_SERVER_WIRE_MALFORMED_REQUEST_H_
#define GRADSERVE_SERVER_WIRE_MALFORMED_REQUEST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {

// INVALID_ARGUMENT for `bytes` bytes (streamed: sent in chunks) that do not parse as a
// gradserve.v1.GradRequest; `detail`, if not empty, says what is wrong where.
absl::Status MalformedRequest(int64_t bytes, bool streamed, absl::string_view detail = "");

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_MALFORMED_REQUEST_H_
