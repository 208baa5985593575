#include "server/service/trace_id.h"

#include "absl/strings/string_view.h"
#include "proto/trace_context.h"

namespace gradserve::server {

TraceId TraceIdOf(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (metadata.empty()) return {};
  for (const auto& [key, valid] :
       {std::pair{trace_context::kTraceparentKey, &trace_context::IsTraceparent},
        std::pair{trace_context::kRequestIdKey, &trace_context::IsRequestId}}) {
    if (auto it = metadata.find(key); it != metadata.end()) {
      const absl::string_view value(it->second.data(), it->second.size());
      if (valid(value)) return {key, std::string(value)};
    }
  }
  return {};
}

void EchoTraceId(const TraceId& trace, grpc::CallbackServerContext* context) {
  if (trace.key != nullptr) context->AddTrailingMetadata(trace.key, trace.value);
}

}  // namespace gradserve::server
