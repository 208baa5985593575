// GradService's session calls: Forward, Backward, Extend and Release (Note [Graph sessions] in
// server/session/session_store.h).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/tensor/memory_budget.h"
#include "server/run/dispatch.h"
#include "server/run/request_runner.h"
#include "server/service/calls.h"
#include "server/service/grad_service.h"
#include "server/service/grpc_status.h"

namespace gradserve::server {
namespace {

// Note [Session calls inline]
// A Backward call over a small held graph is as cheap as a small one-shot request, and the
// worker pool's hand-off between threads would be most of its time (docs/benchmarks.md, the
// session row: 112-120 us at p50 on the pool against 71-75 for the same graph's one-shot
// request run inline). So Backward is first tried on gRPC's thread, as Note [Inline or pool]
// runs a one-shot request: each session keeps the estimate of one pass over its graph,
// EstimateInlineCost of the Forward that recorded it; a Backward runs inline when
// EstimateBackwardCost (that cost per call, plus the calls' own names and seeds and the
// request's bytes) is at most --max_inline_cost and no other call holds the session. The
// session's lock is only tried: gRPC's thread never waits for another call on the same
// session, which may be long; a busy session sends the call to the pool, where it waits its
// turn as before (Note [Concurrent backward calls on a session]). Extend marks the graph
// unbounded rather than estimating it again, so an extended session's calls use the pool;
// Forward and Extend record graphs and always use the pool. Inline calls count in
// gradserve_inline_requests_total, and, as for one-shot requests, a client's cancel cannot
// stop one (gRPC delivers it after the handler returns) while its deadline can.

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

// Runs run on tenant's session id, one call at a time (Note [Concurrent backward calls on a
// session]), with budget (the tenant's) current, and marks the use done. NOT_FOUND naming the
// id if the store does not hold it for tenant.
absl::Status OnSession(SessionStore& sessions, const Tenant* tenant, const std::string& id,
                       const std::shared_ptr<MemoryBudget>& budget,
                       absl::FunctionRef<absl::Status(Session&)> run) {
  absl::StatusOr<std::shared_ptr<Session>> session = sessions.Use(TenantKey(tenant), id);
  if (!session.ok()) return session.status();
  absl::Status status;
  {
    MutexLock lock(&(*session)->mutex());
    MemoryBudgetScope server_memory(&budget);
    status = run(**session);
  }
  sessions.Done(*session);
  return status;
}

// As OnSession, but only if no other call holds the session and fits(its cost per pass) says
// so (Note [Session calls inline]): std::nullopt, having run nothing, otherwise. An unknown id
// is answered at once (NOT_FOUND), which needs no engine.
std::optional<absl::Status> OnSessionIfFree(SessionStore& sessions, const Tenant* tenant,
                                            const std::string& id,
                                            const std::shared_ptr<MemoryBudget>& budget,
                                            absl::FunctionRef<bool(int64_t)> fits,
                                            absl::FunctionRef<absl::Status(Session&)> run) {
  absl::StatusOr<std::shared_ptr<Session>> session = sessions.Use(TenantKey(tenant), id);
  if (!session.ok()) return session.status();
  std::optional<absl::Status> status;
  Session& s = **session;
  if (s.mutex().TryLock()) {
    if (fits(s.pass_cost())) {
      MemoryBudgetScope server_memory(&budget);
      status = run(s);
    }
    s.mutex().Unlock();
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

  SessionReactor(GradService* service, std::shared_ptr<autograd::CancellationToken> cancel,
                 Work work)
      : cancel_(std::move(cancel)) {
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
                                                        metrics::Rpc rpc, SessionWork work,
                                                        InlineSessionWork try_inline) {
  const absl::Time received = absl::Now();
  TraceId trace = TraceIdOf(*context);
  EchoTraceId(trace, context);  // Note [Trace ids]
  absl::StatusOr<Tenant*> tenant = AdmitSessionCall(context, request_id, trace.value, rpc);
  if (!tenant.ok()) return FinishNow(context, ToGrpcStatus(tenant.status()));
  const int64_t bytes_in = static_cast<int64_t>(request.ByteSizeLong());
  std::shared_ptr<autograd::CancellationToken> cancel = MakeToken(context);
  if (try_inline != nullptr) {
    int64_t nodes = 0;
    const std::optional<absl::Status> status =
        try_inline(*tenant, cancel, received, bytes_in, &nodes);
    if (status.has_value()) {
      requests_inline_.fetch_add(1, std::memory_order_relaxed);
      EndCall(request_id, trace.value, rpc, *tenant, *status, received, nodes, bytes_in,
              status->ok() ? static_cast<int64_t>(response.ByteSizeLong()) : 0);
      return FinishNow(context, ToGrpcStatus(*status));
    }
  }
  return new SessionReactor(
      this, std::move(cancel),
      [this, tenant = *tenant, &request_id, &response, rpc, received, bytes_in,
       trace = std::move(trace.value),
       work = std::move(work)](const std::shared_ptr<autograd::CancellationToken>& cancel) {
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
        int64_t pass_cost = kUnboundedCost;
        {
          MemoryReservation request_memory(BudgetOf(tenant));
          status = HoldRequest(request_memory, bytes_in);
          // Note [Bare device names]: the session's devices from now on.
          const DeviceLoad::Lease devices = device_load_.Acquire();
          DeviceChoiceScope device_choice(devices.choice());
          RequestRegions regions(shared_memory_.get(), TenantKey(tenant));
          RequestRunner runner;
          runner.set_regions(&regions);
          if (status.ok()) {
            // The forward pass: a GradRequest without calls.
            v1::GradRequest grad;
            grad.set_request_id(request->request_id());
            *grad.mutable_graph() = request->graph();
            *grad.mutable_return_values() = request->return_values();
            pass_cost = EstimateInlineCost(grad, 0);  // Note [Session calls inline]
            // The held graph's budget lies within the tenant's and the server's.
            MemoryBudgetScope server_memory(&BudgetOf(tenant));
            status = runner.RunForward(grad, options_.limits, cancel, received, &out);
          }
          if (status.ok()) {
            absl::StatusOr<std::string> id = sessions_->Add(
                TenantKey(tenant), runner.TakeRecorded(), pass_cost, devices.choice());
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
  // The call on this thread (inline) or on a worker; inline, std::nullopt when it is not
  // cheap or the session is busy (Note [Session calls inline]).
  auto backward = [this, request, response](
                      Tenant* tenant, const std::shared_ptr<autograd::CancellationToken>& cancel,
                      absl::Time received, int64_t bytes_in,
                      bool inline_only) -> std::optional<absl::Status> {
    v1::GradRequest grad;  // the calls alone
    grad.set_request_id(request->request_id());
    *grad.mutable_calls() = request->calls();
    v1::GradResponse out;
    RequestRegions regions(shared_memory_.get(), TenantKey(tenant));
    RequestRunner runner;
    runner.set_regions(&regions);
    auto run = [&](Session& s) {
      const DeviceLoad::Lease devices = device_load_.Hold(s.devices());
      DeviceChoiceScope device_choice(s.devices());  // Note [Bare device names]
      return runner.RunBackward(s.graph(), grad, options_.limits, cancel, received, &out);
    };
    std::optional<absl::Status> status;
    if (inline_only) {
      status = OnSessionIfFree(
          *sessions_, tenant, request->session_id(), BudgetOf(tenant),
          [&](int64_t pass_cost) {
            const int64_t cost = EstimateBackwardCost(pass_cost, request->calls(), bytes_in);
            return cost != kUnboundedCost && cost <= options_.max_inline_cost;
          },
          run);
      if (!status.has_value()) return status;
    } else {
      status = OnSession(*sessions_, tenant, request->session_id(), BudgetOf(tenant), run);
    }
    if (!status->ok()) return status;
    response->set_request_id(request->request_id());
    response->mutable_calls()->Swap(out.mutable_calls());
    *response->mutable_timings() = out.timings();
    return status;
  };
  InlineSessionWork try_inline;
  if (options_.max_inline_cost > 0) {
    try_inline = [backward](Tenant* tenant,
                            const std::shared_ptr<autograd::CancellationToken>& cancel,
                            absl::Time received, int64_t bytes_in, int64_t* /*nodes*/) {
      return backward(tenant, cancel, received, bytes_in, /*inline_only=*/true);
    };
  }
  return StartSessionCall(
      context, *request, request->request_id(), *response, metrics::Rpc::kBackward,
      [backward](Tenant* tenant, const std::shared_ptr<autograd::CancellationToken>& cancel,
                 absl::Time received, int64_t bytes_in, int64_t* /*nodes*/) {
        return *backward(tenant, cancel, received, bytes_in, /*inline_only=*/false);
      },
      std::move(try_inline));
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
            status = OnSession(
                *sessions_, tenant, request->session_id(), BudgetOf(tenant), [&](Session& s) {
                  // Note [Session calls inline]: an extended graph is not
                  // estimated again; its calls go to the pool.
                  s.set_pass_cost(kUnboundedCost);
                  const DeviceLoad::Lease devices = device_load_.Hold(s.devices());
                  DeviceChoiceScope device_choice(s.devices());  // Note [Bare device names]
                  return runner.RunExtend(s.graph(), grad, options_.limits, cancel, received, &out);
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
