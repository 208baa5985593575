// The metadata a call's trace id travels in, shared by the server and the C++ client (Note
// [Trace ids] in server/service/trace_id.h): W3C Trace Context's `traceparent`, or
// `x-request-id`. Header-only; needs nothing but absl.

#ifndef GRADSERVE_PROTO_TRACE_CONTEXT_H_
#define GRADSERVE_PROTO_TRACE_CONTEXT_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace gradserve::trace_context {

inline constexpr char kTraceparentKey[] = "traceparent";
inline constexpr char kRequestIdKey[] = "x-request-id";
// The longest x-request-id the server takes.
inline constexpr size_t kMaxRequestIdBytes = 128;

// Whether v has the W3C traceparent form: version 00, lowercase hex, ids not all zero
// ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").
inline bool IsTraceparent(absl::string_view v) {
  auto hex = [](absl::string_view s) {
    for (char c : s) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
  };
  auto zero = [](absl::string_view s) { return s.find_first_not_of('0') == s.npos; };
  if (v.size() != 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  const absl::string_view trace = v.substr(3, 32), parent = v.substr(36, 16);
  return v.substr(0, 2) == "00" && hex(trace) && hex(parent) && hex(v.substr(53, 2)) &&
         !zero(trace) && !zero(parent);
}

// Whether v is an x-request-id the server takes: 1 to kMaxRequestIdBytes printable ASCII
// bytes, no space.
inline bool IsRequestId(absl::string_view v) {
  if (v.empty() || v.size() > kMaxRequestIdBytes) return false;
  for (char c : v) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// The key a client sends trace id id under: traceparent for the W3C form, else x-request-id.
inline const char* KeyFor(absl::string_view id) {
  return IsTraceparent(id) ? kTraceparentKey : kRequestIdKey;
}

}  // namespace gradserve::trace_context

#endif  // GRADSERVE_PROTO_TRACE_CONTEXT_H_
