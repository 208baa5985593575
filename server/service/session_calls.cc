// GradService's session calls: Forward, Backward, Extend and Release (Note [Graph sessions] in
// server/session/session_store.h).

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/tensor/memory_budget.h"
#include "server/run/request_runner.h"
#include "server/service/calls.h"
#include "server/service/grad_service.h"
#include "server/service/grpc_status.h"

namespace gradserve::server {
namespace {

// A refusal at admission, said in the session's terms when the server drains.
absl::Status SessionRefusal(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  return absl::UnavailableError(
      "the server is shutting down and ended its sessions; run the forward pass again on "
      "another replica");
}

// Charges the request, and the copy of it the runner reads, to reservation while the call runs.
// RESOURCE_EXHAUSTED when they do not fit.
absl::Status HoldRequest(MemoryReservation& reservation, int64_t bytes_in) {
  absl::Status status = reservation.Grow(2 * bytes_in);
  if (status.ok()) return status;
  return absl::ResourceExhaustedError(
      absl::StrCat("the server cannot hold this request now: ", status.message()));
}

// Runs run on the graph of tenant's session id, one call at a time (Note [Concurrent backward
// calls on a session]), with budget (the tenant's) current, and marks the use done. NOT_FOUND
// naming the id if the store does not hold it for tenant.
absl::Status OnSession(SessionStore& sessions, const Tenant* tenant, const std::string& id,
                       const std::shared_ptr<MemoryBudget>& budget,
                       absl::FunctionRef<absl::Status(graph::RecordedGraph&)> run) {
  absl::StatusOr<std::shared_ptr<Session>> session = sessions.Use(TenantKey(tenant), id);
  if (!session.ok()) return session.status();
  absl::Status status;
  {
    MutexLock lock(&(*session)->mutex());
    MemoryBudgetScope server_memory(&budget);
    status = run((*session)->graph());
  }
  sessions.Done(*session);
  return status;
}

}  // namespace

// A session call on the worker pool (Note [Request flow]): work runs on an engine worker with
// the call's token, and its status finishes the call. The reactor owns itself (deleted in
// OnDone); work must not touch it.
class GradService::SessionReactor final : public grpc::ServerUnaryReactor {
 public:
  using Work = std::function<absl::Status(const std::shared_ptr<autograd::CancellationToken>&)>;

  SessionReactor(GradService* service, grpc::CallbackServerContext* context, Work work)
      : cancel_(MakeToken(context)) {
    service->pool_->Submit([this, work = std::move(work)] {
      const absl::Status status = work(cancel_);
      Finish(ToGrpcStatus(status));  // the last use of this
    });
  }

  void OnCancel() override { CancelWork(*cancel_); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<autograd::CancellationToken> cancel_;
};

absl::StatusOr<Tenant*> GradService::AdmitSessionCall(const grpc::CallbackServerContext* context,
                                                      const std::string& request_id,
                                                      const std::string& trace, metrics::Rpc rpc) {
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  if (!tenant.ok()) {
    Reject(request_id, trace, rpc, nullptr, tenant.status(),
           metrics::RejectReason::kUnauthenticated);
    return tenant.status();
  }
  metrics::RejectReason reason;
  if (absl::Status admitted = Admit(*tenant, &reason); !admitted.ok()) {
    const absl::Status refused = SessionRefusal(admitted);
    Reject(request_id, trace, rpc, *tenant, refused, reason);
    return refused;
  }
  return tenant;
}

grpc::ServerUnaryReactor* GradService::StartSessionCall(grpc::CallbackServerContext* context,
                                                        const google::protobuf::Message& request,
                                                        const std::string& request_id,
                                                        const google::protobuf::Message& response,
                                                        metrics::Rpc rpc, SessionWork work) {
  const absl::Time received = absl::Now();
  TraceId trace = TraceIdOf(*context);
  EchoTraceId(trace, context);  // Note [Trace ids]
  absl::StatusOr<Tenant*> tenant = AdmitSessionCall(context, request_id, trace.value, rpc);
  if (!tenant.ok()) return FinishNow(context, ToGrpcStatus(tenant.status()));
  return new SessionReactor(
      this, context,
      [this, tenant = *tenant, &request, &request_id, &response, rpc, received,
       trace = std::move(trace.value),
       work = std::move(work)](const std::shared_ptr<autograd::CancellationToken>& cancel) {
        const int64_t bytes_in = static_cast<int64_t>(request.ByteSizeLong());
        int64_t nodes = 0;
        const absl::Status status = work(tenant, cancel, received, bytes_in, &nodes);
        EndCall(request_id, trace, rpc, tenant, status, received, nodes, bytes_in,
                status.ok() ? static_cast<int64_t>(response.ByteSizeLong()) : 0);
        return status;
      });
}

grpc::ServerUnaryReactor* GradService::Forward(grpc::CallbackServerContext* context,
                                               const v1::ForwardRequest* request,
                                               v1::ForwardResponse* response) {
  return StartSessionCall(
      context, *request, request->request_id(), *response, metrics::Rpc::kForward,
      [this, request, response](Tenant* tenant,
                                const std::shared_ptr<autograd::CancellationToken>& cancel,
                                absl::Time received, int64_t bytes_in, int64_t* nodes) {
        v1::GradResponse out;
        absl::Status status;
        {
          MemoryReservation request_memory(BudgetOf(tenant));
          status = HoldRequest(request_memory, bytes_in);
          RequestRegions regions(shared_memory_.get(), TenantKey(tenant));
          RequestRunner runner;
          runner.set_regions(&regions);
          if (status.ok()) {
            // The forward pass: a GradRequest without calls.
            v1::GradRequest grad;
            grad.set_request_id(request->request_id());
            *grad.mutable_graph() = request->graph();
            *grad.mutable_return_values() = request->return_values();
            // The held graph's budget lies within the tenant's and the server's.
            MemoryBudgetScope server_memory(&BudgetOf(tenant));
            status = runner.RunForward(grad, options_.limits, cancel, received, &out);
          }
          if (status.ok()) {
            absl::StatusOr<std::string> id =
                sessions_->Add(TenantKey(tenant), runner.TakeRecorded());
            if (id.ok()) {
              response->set_session_id(*std::move(id));
            } else {
              status = id.status();
            }
          }
        }
        *nodes = out.num_nodes();
        if (!status.ok()) return status;
        response->set_request_id(request->request_id());
        response->mutable_values()->Swap(out.mutable_values());
        response->set_num_nodes(out.num_nodes());
        *response->mutable_timings() = out.timings();
        return status;
      });
}

grpc::ServerUnaryReactor* GradService::Backward(grpc::CallbackServerContext* context,
                                                const v1::BackwardRequest* request,
                                                v1::BackwardResponse* response) {
  return StartSessionCall(
      context, *request, request->request_id(), *response, metrics::Rpc::kBackward,
      [this, request, response](Tenant* tenant,
                                const std::shared_ptr<autograd::CancellationToken>& cancel,
                                absl::Time received, int64_t /*bytes_in*/, int64_t* /*nodes*/) {
        v1::GradRequest grad;  // the calls alone
        grad.set_request_id(request->request_id());
        *grad.mutable_calls() = request->calls();
        v1::GradResponse out;
        RequestRegions regions(shared_memory_.get(), TenantKey(tenant));
        RequestRunner runner;
        runner.set_regions(&regions);
        const absl::Status status =
            OnSession(*sessions_, tenant, request->session_id(), BudgetOf(tenant),
                      [&](graph::RecordedGraph& g) {
                        return runner.RunBackward(g, grad, options_.limits, cancel, received, &out);
                      });
        if (!status.ok()) return status;
        response->set_request_id(request->request_id());
        response->mutable_calls()->Swap(out.mutable_calls());
        *response->mutable_timings() = out.timings();
        return status;
      });
}

grpc::ServerUnaryReactor* GradService::Extend(grpc::CallbackServerContext* context,
                                              const v1::ExtendRequest* request,
                                              v1::ExtendResponse* response) {
  return StartSessionCall(
      context, *request, request->request_id(), *response, metrics::Rpc::kExtend,
      [this, request, response](Tenant* tenant,
                                const std::shared_ptr<autograd::CancellationToken>& cancel,
                                absl::Time received, int64_t bytes_in, int64_t* nodes) {
        v1::GradResponse out;
        absl::Status status;
        {
          MemoryReservation request_memory(BudgetOf(tenant));
          status = HoldRequest(request_memory, bytes_in);
          RequestRegions regions(shared_memory_.get(), TenantKey(tenant));
          RequestRunner runner;
          runner.set_regions(&regions);
          if (status.ok()) {
            v1::GradRequest grad;  // the extension's graph, without calls
            grad.set_request_id(request->request_id());
            *grad.mutable_graph() = request->graph();
            *grad.mutable_return_values() = request->return_values();
            status = OnSession(*sessions_, tenant, request->session_id(), BudgetOf(tenant),
                               [&](graph::RecordedGraph& g) {
                                 return runner.RunExtend(g, grad, options_.limits, cancel, received,
                                                         &out);
                               });
          }
        }
        *nodes = out.num_nodes();
        if (!status.ok()) return status;
        response->set_request_id(request->request_id());
        response->mutable_values()->Swap(out.mutable_values());
        response->set_num_nodes(out.num_nodes());
        *response->mutable_timings() = out.timings();
        return status;
      });
}

grpc::ServerUnaryReactor* GradService::Release(grpc::CallbackServerContext* context,
                                               const v1::ReleaseRequest* request,
                                               v1::ReleaseResponse* /*response*/) {
  const absl::Time received = absl::Now();
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  if (!tenant.ok()) {
    return FinishCounted(context, metrics::Rpc::kRelease, nullptr, received,
                         ToGrpcStatus(tenant.status()));
  }
  // Cheap (the graph's teardown aside): inline, taking no engine slot, and served while
  // draining, when every id is NOT_FOUND.
  return FinishCounted(context, metrics::Rpc::kRelease, *tenant, received,
                       ToGrpcStatus(sessions_->Release(TenantKey(*tenant), request->session_id())));
}

}  // namespace gradserve::server
