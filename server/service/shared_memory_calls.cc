// GradService's shared-memory calls: RegisterSharedMemory and UnregisterSharedMemory (Note
// [Shared-memory regions] in server/shared_memory/registry.h).

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/service/grad_service.h"
#include "server/service/grpc_status.h"

namespace gradserve::server {

// Both are cheap (an open and a mapping, or an unmapping): answered inline, taking no engine
// slot, counted as Release is. While draining, Register is UNAVAILABLE and Unregister
// NOT_FOUND, since EndAll ended every region.
grpc::ServerUnaryReactor* GradService::RegisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
    v1::RegisterSharedMemoryResponse* response) {
  const absl::Time received = absl::Now();
  constexpr metrics::Rpc kRpc = metrics::Rpc::kRegisterSharedMemory;
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  if (!tenant.ok()) {
    return FinishCounted(context, kRpc, nullptr, received, ToGrpcStatus(tenant.status()));
  }
  absl::StatusOr<absl::Duration> ttl = shared_memory_->Register(
      TenantKey(*tenant), request->name(), request->key(), request->byte_size(),
      request->writable(), absl::Milliseconds(request->idle_ttl_ms()), BudgetOf(*tenant));
  if (ttl.ok()) response->set_idle_ttl_ms(absl::ToInt64Milliseconds(*ttl));
  return FinishCounted(context, kRpc, *tenant, received, ToGrpcStatus(ttl.status()));
}

grpc::ServerUnaryReactor* GradService::UnregisterSharedMemory(
    grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse* /*response*/) {
  const absl::Time received = absl::Now();
  constexpr metrics::Rpc kRpc = metrics::Rpc::kUnregisterSharedMemory;
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  if (!tenant.ok()) {
    return FinishCounted(context, kRpc, nullptr, received, ToGrpcStatus(tenant.status()));
  }
  return FinishCounted(
      context, kRpc, *tenant, received,
      ToGrpcStatus(shared_memory_->Unregister(TenantKey(*tenant), request->name())));
}

}  // namespace gradserve::server
