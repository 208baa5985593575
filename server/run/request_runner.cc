#include "server/run/request_runner.h"

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"
#include "server/run/graph_cache.h"
#include "server/wire/wire.h"

namespace gradserve::server {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

RequestRunner::RequestRunner() = default;
RequestRunner::~RequestRunner() = default;

absl::Status RequestRunner::ReserveResponse(int64_t bytes,
                                            const std::shared_ptr<MemoryBudget>& fallback) {
  if (!response_memory_.has_value()) {
    response_memory_.emplace(recorded_ != nullptr ? recorded_->budget() : fallback);
  }
  if (absl::Status s = response_memory_->Grow(bytes); !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the response (", bytes, " bytes more) does not fit: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status RequestRunner::RunOrThrow(const v1::GradRequest& request, const graph::Limits& limits,
                                       const std::shared_ptr<autograd::CancellationToken>& cancel,
                                       absl::Time admitted, v1::GradResponse* response,
                                       ChunkedRequest* chunked, ChunkedResponse* deferred,
                                       const std::string* op_records) {
  const absl::Time picked = absl::Now();
  v1::Timings* timings = response->mutable_timings();
  timings->set_queue_us(Micros(picked - admitted));
  if (absl::Status s = cancel->Check(); !s.ok()) return s;

  // Note [Reusing a validated graph]; a streamed request is too big to be worth it.
  GraphLease& lease =
      lease_.emplace(request.graph(), limits, /*enabled=*/chunked == nullptr, op_records);
  absl::StatusOr<EngineRequest> converted = FromProto(request, limits, chunked, lease.reusable());
  if (chunked != nullptr) chunked->Clear();
  if (!converted.ok()) return converted.status();
  // Shared, not copied: the recorded Nodes share it for their labels (Note [Node labels]).
  absl::StatusOr<std::unique_ptr<graph::RecordedGraph>> recorded =
      lease.Record(std::move(converted->graph), cancel);
  if (!recorded.ok()) return recorded.status();
  recorded_ = *std::move(recorded);
  graph::RecordedGraph& g = *recorded_;
  response->set_num_nodes(g.num_nodes());

  for (int i = 0; i < request.return_values_size(); ++i) {
    const std::string& name = request.return_values(i);
    absl::StatusOr<Tensor> value = g.Value(name);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("return_values[", i, "]: the graph has no value named ", Quote(name)));
    }
    if (absl::Status s = ReserveResponse(static_cast<int64_t>(value->nbytes()), nullptr); !s.ok()) {
      return Prefixed(s, absl::StrCat("return_values[", i, "]: "));
    }
    v1::NamedTensor* out = response->add_values();
    out->set_name(name);
    ToProto(*value, out->mutable_value(), deferred);
  }
  const absl::Time forward_done = absl::Now();
  timings->set_forward_us(Micros(forward_done - picked));

  for (size_t c = 0; c < converted->calls.size(); ++c) {
    absl::StatusOr<graph::CallResult> result = g.Backward(converted->calls[c]);
    if (!result.ok()) return Prefixed(result.status(), absl::StrCat("call #", c, ": "));
    v1::CallResult* out = response->add_calls();
    for (size_t k = 0; k < result->names.size(); ++k) {
      v1::Gradient* grad = out->add_gradients();
      grad->set_name(result->names[k]);
      grad->set_connected(k < result->connected.size() && result->connected[k]);
      if (k < result->grads.size() && result->grads[k].defined()) {
        if (absl::Status s =
                ReserveResponse(static_cast<int64_t>(result->grads[k].nbytes()), nullptr);
            !s.ok()) {
          return Prefixed(s, absl::StrCat("call #", c, ": "));
        }
        ToProto(result->grads[k], grad->mutable_value(), deferred);
      }
    }
  }
  const absl::Time done = absl::Now();
  timings->set_backward_us(Micros(done - forward_done));
  timings->set_total_us(Micros(done - admitted));
  return absl::OkStatus();
}

absl::Status RequestRunner::Run(const v1::GradRequest& request, const graph::Limits& limits,
                                const std::shared_ptr<autograd::CancellationToken>& cancel,
                                absl::Time admitted, v1::GradResponse* response,
                                ChunkedRequest* chunked, ChunkedResponse* deferred,
                                const std::string* op_records) {
  response->set_request_id(request.request_id());
  try {
    return RunOrThrow(request, limits, cancel, admitted, response, chunked, deferred, op_records);
  } catch (const StatusError& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("the server ran out of memory for this request");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  }
}

}  // namespace gradserve::server
