#include "server/run/request_runner.h"

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/util/math_mode.h"
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

// Runs run, turning what the engine may throw into the status for the client.
template <typename F>
absl::Status Catching(F run) {
  try {
    return run();
  } catch (const StatusError& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("the server ran out of memory for this request");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  }
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

absl::Status RequestRunner::ReturnValues(
    const graph::RecordedGraph& g, const google::protobuf::RepeatedPtrField<std::string>& names,
    v1::GradResponse* response, ChunkedResponse* deferred) {
  for (int i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    absl::StatusOr<Tensor> value = g.Value(name);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("return_values[", i, "]: the graph has no value named ", Quote(name)));
    }
    if (absl::Status s = ReserveResponse(ToProtoNewBytes(*value, deferred), g.budget()); !s.ok()) {
      return Prefixed(s, absl::StrCat("return_values[", i, "]: "));
    }
    v1::NamedTensor* out = response->add_values();
    out->set_name(name);
    ToProto(*value, out->mutable_value(), deferred);
  }
  return absl::OkStatus();
}

absl::Status RequestRunner::RunCalls(graph::RecordedGraph& g,
                                     const std::vector<graph::BackwardCall>& calls,
                                     const std::vector<Destinations>& destinations,
                                     const std::shared_ptr<autograd::CancellationToken>& cancel,
                                     google::protobuf::RepeatedPtrField<v1::CallResult>* out_calls,
                                     ChunkedResponse* deferred) {
  for (size_t c = 0; c < calls.size(); ++c) {
    absl::StatusOr<graph::CallResult> result =
        cancel != nullptr ? g.Backward(calls[c], cancel) : g.Backward(calls[c]);
    if (!result.ok()) return Prefixed(result.status(), absl::StrCat("call #", c, ": "));
    v1::CallResult* out = out_calls->Add();
    const Destinations* to = c < destinations.size() ? &destinations[c] : nullptr;
    for (size_t k = 0; k < result->names.size(); ++k) {
      v1::Gradient* grad = out->add_gradients();
      grad->set_name(result->names[k]);
      grad->set_connected(k < result->connected.size() && result->connected[k]);
      if (to != nullptr) {
        if (auto it = to->find(result->names[k]); it != to->end()) {
          // Note [Shared-memory regions]: the bytes go to the client's region, not the response.
          if (k < result->grads.size()) {
            const std::string what =
                absl::StrCat("call #", c, ": gradient of ", Quote(result->names[k]));
            if (absl::Status s =
                    ToSharedMemory(result->grads[k], it->second, what, grad->mutable_value());
                !s.ok()) {
              return s;
            }
          }
          continue;
        }
      }
      if (k < result->grads.size() && result->grads[k].defined()) {
        if (absl::Status s =
                ReserveResponse(ToProtoNewBytes(result->grads[k], deferred), g.budget());
            !s.ok()) {
          return Prefixed(s, absl::StrCat("call #", c, ": "));
        }
        ToProto(result->grads[k], grad->mutable_value(), deferred);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RequestRunner::RunOrThrow(const v1::GradRequest& request, const graph::Limits& limits,
                                       const std::shared_ptr<autograd::CancellationToken>& cancel,
                                       absl::Time admitted, v1::GradResponse* response,
                                       ChunkedRequest* chunked, ChunkedResponse* deferred,
                                       const std::string* op_records, bool held) {
  const absl::Time picked = absl::Now();
  v1::Timings* timings = response->mutable_timings();
  timings->set_queue_us(Micros(picked - admitted));
  if (absl::Status s = cancel->Check(); !s.ok()) return s;

  // Note [Reusing a validated graph]; a streamed request is too big to be worth it.
  // nor is a graph a session holds, which no later request could reuse while it is held.
  GraphLease& lease =
      lease_.emplace(request.graph(), limits, /*enabled=*/chunked == nullptr && !held, op_records);
  // The request's budget holds its leaves too, not only what its ops compute.
  std::shared_ptr<MemoryBudget> budget = graph::RequestBudget(limits);
  absl::StatusOr<EngineRequest> converted = [&] {
    MemoryBudgetScope leaves_in_budget(budget);
    return FromProto(request, limits, chunked, lease.reusable(), regions_);
  }();
  if (chunked != nullptr) chunked->Clear();
  if (!converted.ok()) return converted.status();
  // Note [Values freed after their last use]: a graph no later call reads keeps only what
  // this request's calls and return values name. (A gradient destination names one of its
  // call's inputs, or a leaf when the call lists none: FindDestinations.)
  std::vector<absl::string_view> keep_only;
  if (!held) {
    for (const graph::BackwardCall& call : converted->calls) {
      keep_only.insert(keep_only.end(), call.roots.begin(), call.roots.end());
      keep_only.insert(keep_only.end(), call.inputs.begin(), call.inputs.end());
    }
    keep_only.insert(keep_only.end(), request.return_values().begin(),
                     request.return_values().end());
  }
  // Note [Elementwise chains] in engine/ops/elementwise.h: only for one plain backward call.
  const bool chains = converted->calls.size() <= 1 &&
                      absl::c_none_of(converted->calls, [](const graph::BackwardCall& call) {
                        return call.create_graph || call.anomaly_mode;
                      });
  // Shared, not copied: the recorded Nodes share it for their labels (Note [Node labels]).
  absl::StatusOr<std::unique_ptr<graph::RecordedGraph>> recorded = lease.Record(
      std::move(converted->graph), cancel, held ? nullptr : &keep_only, std::move(budget), chains);
  if (!recorded.ok()) return recorded.status();
  recorded_ = *std::move(recorded);
  graph::RecordedGraph& g = *recorded_;
  // A request's graph is its own, and a session's is run under the session's lock.
  g.PromiseOneCallAtATime();
  response->set_num_nodes(g.num_nodes());
  if (absl::Status s = ReturnValues(g, request.return_values(), response, deferred); !s.ok()) {
    return s;
  }
  const absl::Time forward_done = absl::Now();
  timings->set_forward_us(Micros(forward_done - picked));

  if (absl::Status s = RunCalls(g, converted->calls, converted->destinations, nullptr,
                                response->mutable_calls(), deferred);
      !s.ok()) {
    return s;
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
  MathModeScope math_mode({.allow_tf32 = request.allow_tf32()});  // Note [TF32 per request]
  return Catching([&] {
    return RunOrThrow(request, limits, cancel, admitted, response, chunked, deferred, op_records,
                      /*held=*/false);
  });
}

absl::Status RequestRunner::RunForward(const v1::GradRequest& request, const graph::Limits& limits,
                                       const std::shared_ptr<autograd::CancellationToken>& cancel,
                                       absl::Time admitted, v1::GradResponse* response) {
  response->set_request_id(request.request_id());
  MathModeScope math_mode({.allow_tf32 = request.allow_tf32()});  // Note [TF32 per request]
  return Catching([&] {
    return RunOrThrow(request, limits, cancel, admitted, response, nullptr, nullptr, nullptr,
                      /*held=*/true);
  });
}

std::unique_ptr<graph::RecordedGraph> RequestRunner::TakeRecorded() { return std::move(recorded_); }

absl::Status RequestRunner::RunBackward(graph::RecordedGraph& g, const v1::GradRequest& calls,
                                        const graph::Limits& limits,
                                        const std::shared_ptr<autograd::CancellationToken>& cancel,
                                        absl::Time admitted, v1::GradResponse* response) {
  response->set_request_id(calls.request_id());
  MathModeScope math_mode({.allow_tf32 = calls.allow_tf32()});  // Note [TF32 per request]
  return Catching([&]() -> absl::Status {
    const absl::Time picked = absl::Now();
    v1::Timings* timings = response->mutable_timings();
    timings->set_queue_us(Micros(picked - admitted));
    if (absl::Status s = cancel->Check(); !s.ok()) return s;
    // The calls alone: the census checks their strings and seeds; the graph is empty.
    absl::StatusOr<EngineRequest> converted = FromProto(calls, limits, nullptr, nullptr, regions_);
    if (!converted.ok()) return converted.status();
    if (absl::Status s = RunCalls(g, converted->calls, converted->destinations, cancel,
                                  response->mutable_calls(), nullptr);
        !s.ok()) {
      return s;
    }
    const absl::Time done = absl::Now();
    timings->set_backward_us(Micros(done - picked));
    timings->set_total_us(Micros(done - admitted));
    return absl::OkStatus();
  });
}

absl::Status RequestRunner::RunExtend(graph::RecordedGraph& g, const v1::GradRequest& extension,
                                      const graph::Limits& limits,
                                      const std::shared_ptr<autograd::CancellationToken>& cancel,
                                      absl::Time admitted, v1::GradResponse* response) {
  response->set_request_id(extension.request_id());
  MathModeScope math_mode({.allow_tf32 = extension.allow_tf32()});  // Note [TF32 per request]
  return Catching([&]() -> absl::Status {
    const absl::Time picked = absl::Now();
    v1::Timings* timings = response->mutable_timings();
    timings->set_queue_us(Micros(picked - admitted));
    if (absl::Status s = cancel->Check(); !s.ok()) return s;
    absl::StatusOr<EngineRequest> converted;
    {
      // The extension's leaves are the session's from now on (Note [Extending a recorded graph]).
      MemoryBudgetScope session_memory(&g.budget());
      converted = FromProto(extension, limits, nullptr, nullptr, regions_);
    }
    if (!converted.ok()) return converted.status();
    absl::StatusOr<int64_t> nodes = g.Extend(std::move(converted->graph), cancel);
    if (!nodes.ok()) return nodes.status();
    response->set_num_nodes(*nodes);
    if (absl::Status s = ReturnValues(g, extension.return_values(), response, nullptr); !s.ok()) {
      return s;
    }
    const absl::Time done = absl::Now();
    timings->set_forward_us(Micros(done - picked));
    timings->set_total_us(Micros(done - admitted));
    return absl::OkStatus();
  });
}

}  // namespace gradserve::server
