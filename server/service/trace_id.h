// A call's trace id: the W3C `traceparent` or the `x-request-id` its client sent.
//
// Note [Trace ids]
// A client (or a proxy or service mesh in front of the server) may send a `traceparent`
// metadata entry (W3C Trace Context: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>) or
// an `x-request-id` one. The server takes the first of the two that is well formed, writes it
// in the call's log line (trace=...) and sends it back, under the same key, in the call's
// trailing metadata, so that a client can match its call to the server's line and a tracer
// sees the call's trace go through. It is the client's string: only a traceparent of the W3C
// form, or an x-request-id of at most 128 printable ASCII bytes, is taken
// (proto/trace_context.h); anything else is ignored, as if absent. It never becomes a metric
// label (Note [Label values] in server/metrics/text_format.h), and is quoted and bounded in the
// log line like any client string (Note [Quoting client strings]).

#ifndef GRADSERVE_SERVER_SERVICE_TRACE_ID_H_
#define GRADSERVE_SERVER_SERVICE_TRACE_ID_H_

#include <string>

#include "grpcpp/server_context.h"

namespace gradserve::server {

struct TraceId {
  const char* key = nullptr;  // "traceparent" or "x-request-id"; null: none
  std::string value;
};

// The call's trace id (Note [Trace ids]), or none.
TraceId TraceIdOf(const grpc::CallbackServerContext& context);

// Echoes trace (if any) in the call's trailing metadata; call it before the call finishes.
void EchoTraceId(const TraceId& trace, grpc::CallbackServerContext* context);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_TRACE_ID_H_
