#include "server/service/server_options.h"

#include "absl/strings/str_cat.h"

namespace gradserve::server {
namespace {

absl::Status Positive(const char* name, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", name, " must be positive, got ", value));
}

}  // namespace

const char* LogRequestsName(ServerOptions::LogRequests value) {
  switch (value) {
    case ServerOptions::LogRequests::kAll:
      return "all";
    case ServerOptions::LogRequests::kErrors:
      return "errors";
    case ServerOptions::LogRequests::kNone:
      return "none";
  }
  return "all";
}

absl::Status ParseLogRequests(const std::string& text, ServerOptions::LogRequests* value) {
  for (ServerOptions::LogRequests v :
       {ServerOptions::LogRequests::kAll, ServerOptions::LogRequests::kErrors,
        ServerOptions::LogRequests::kNone}) {
    if (text == LogRequestsName(v)) {
      *value = v;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--log_requests must be all, errors or none, got '", text, "'"));
}

absl::Status CheckOptions(const ServerOptions& o) {
  for (auto [name, value] :
       {std::pair<const char*, absl::Duration>{"max_connection_idle", o.max_connection_idle},
        {"max_connection_age", o.max_connection_age},
        {"max_connection_age_grace", o.max_connection_age_grace},
        {"keepalive_time", o.keepalive_time},
        {"keepalive_timeout", o.keepalive_timeout},
        {"min_client_ping_interval", o.min_client_ping_interval}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be positive, got ", absl::FormatDuration(value)));
    }
  }
  if (o.max_concurrent_streams > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_concurrent_streams is at most ", INT32_MAX, " (HTTP/2's limit)"));
  }
  if (o.worker_threads < 0) {
    return absl::InvalidArgumentError("--worker_threads must be 0 (one per core) or more");
  }
  if (o.max_inline_cost < 0) {
    return absl::InvalidArgumentError("--max_inline_cost must be 0 (never inline) or more");
  }
  if (o.max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes is at most ", INT32_MAX, " (gRPC's limit)"));
  }
  if (o.chunk_bytes > o.max_message_bytes - 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_bytes (", o.chunk_bytes,
        ") must leave 64 bytes of framing below --max_message_bytes (", o.max_message_bytes, ")"));
  }
  if (o.max_server_memory_bytes < 0 || o.grpc_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.max_server_memory_bytes < 0 ? "--max_server_memory_bytes" : "--grpc_memory_bytes",
        " must be 0 (sized from the container's memory) or more"));
  }
  if (o.upload_idle_timeout <= absl::ZeroDuration() ||
      o.upload_idle_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--upload_idle_timeout must be positive and finite, got ",
                     absl::FormatDuration(o.upload_idle_timeout)));
  }
  if (o.session_idle_ttl <= absl::ZeroDuration() ||
      o.session_idle_ttl == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--session_idle_ttl must be positive and finite, got ",
                     absl::FormatDuration(o.session_idle_ttl)));
  }
  if (o.shared_memory.idle_ttl <= absl::ZeroDuration() ||
      o.shared_memory.idle_ttl == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared_memory_idle_ttl must be positive and finite, got ",
                     absl::FormatDuration(o.shared_memory.idle_ttl)));
  }
  if (!o.shared_memory.prefix.empty() &&
      (o.shared_memory.prefix.front() != '/' ||
       o.shared_memory.prefix.find('/', 1) != std::string::npos ||
       o.shared_memory.prefix.size() < 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shared_memory_prefix must be empty (off) or '/' then a name without '/' "
                     "(a POSIX shared-memory name's start), got '",
                     o.shared_memory.prefix, "'"));
  }
  for (auto [name, value] :
       {std::pair<const char*, int64_t>{"max_message_bytes", o.max_message_bytes},
        {"max_sessions_per_tenant", o.max_sessions_per_tenant},
        {"max_shared_memory_regions", o.shared_memory.max_per_tenant},
        {"max_uploads", o.max_uploads},
        {"max_request_bytes", o.max_request_bytes},
        {"chunk_bytes", o.chunk_bytes},
        {"max_in_flight", o.max_in_flight},
        {"max_concurrent_streams", o.max_concurrent_streams},
        {"log_refusals_per_second", o.log_refusals_per_second},
        {"max_ops", o.limits.max_ops},
        {"max_leaves", o.limits.max_leaves},
        {"max_tensor_elements", o.limits.max_tensor_elements},
        {"max_memory_bytes", o.limits.max_memory_bytes},
        {"max_nesting", o.limits.max_nesting},
        {"max_backward_calls", o.limits.max_backward_calls},
        {"max_name_bytes", o.limits.max_name_bytes}}) {
    if (absl::Status s = Positive(name, value); !s.ok()) return s;
  }
  return CheckSecurityOptions(o.security);
}

}  // namespace gradserve::server
