#include "server/service/grad_service.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/util/quote.h"
#include "proto/chunk_slices.h"
#include "proto/chunking.h"
#include "server/base/log.h"
#include "server/limits/server_memory.h"
#include "server/metrics/text_format.h"
#include "server/run/dispatch.h"
#include "server/run/request_runner.h"
#include "server/service/calls.h"
#include "server/service/engine_metrics.h"
#include "server/service/grpc_status.h"
#include "server/service/server_info.h"
#include "server/wire/chunk_message.h"

namespace gradserve::server {
namespace {

constexpr metrics::Rpc kUnary = metrics::Rpc::kComputeGradients;
constexpr metrics::Rpc kStream = metrics::Rpc::kComputeGradientsStream;

// Whether this build has the CUDA backend (engine/CMakeLists.txt), for build_info.
#ifdef GRADSERVE_HAS_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

// The rpc as the log line names it.
const char* LogName(metrics::Rpc rpc) {
  switch (rpc) {
    case metrics::Rpc::kComputeGradients:
      return "unary";
    case metrics::Rpc::kComputeGradientsStream:
      return "stream";
    case metrics::Rpc::kForward:
      return "forward";
    case metrics::Rpc::kBackward:
      return "backward";
    case metrics::Rpc::kExtend:
      return "extend";
    case metrics::Rpc::kRelease:
      return "release";
    case metrics::Rpc::kRegisterSharedMemory:
      return "register_shm";
    case metrics::Rpc::kUnregisterSharedMemory:
      return "unregister_shm";
    case metrics::Rpc::kPing:
      return "ping";
    case metrics::Rpc::kGetServerInfo:
      return "info";
  }
  return "";
}

// The metrics' slot of a call's tenant (null without a token file).
int TenantSlot(const Tenant* tenant) {
  return metrics::RequestMetrics::TenantSlot(tenant == nullptr ? -1 : tenant->index());
}

// A request log line's tenant (the operator's name, Note [The token file]; the token is never
// logged) and trace id (Note [Trace ids]), when there are.
void AddCallFields(const Tenant* tenant, absl::string_view trace, LogRecord* record) {
  if (tenant != nullptr) record->Word("tenant", tenant->name());
  if (!trace.empty()) record->Client("trace", trace);
}

}  // namespace

// Note [Request flow], unary form, on the pool. The reactor owns the call's messages and the
// memory they are charged for; the worker serializes the response into gRPC's buffer, which
// stays valid until OnDone.
class GradService::UnaryGradReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryGradReactor(GradService* service, grpc::CallbackServerContext* context, Job job,
                   UnaryMessages::Ptr messages, MemoryReservation request_memory,
                   grpc::ByteBuffer* response)
      : cancel_(MakeToken(context)),
        messages_(std::move(messages)),
        request_memory_(std::move(request_memory)),
        response_(response) {
    job.cancel = cancel_;
    job.done = [this](const absl::Status& status) {
      Finish(ToGrpcStatus(status.ok() ? messages_->SerializeResponse(response_) : status));
    };
    service->Execute(std::move(job));
  }

  void OnCancel() override { CancelWork(*cancel_); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<autograd::CancellationToken> cancel_;
  const UnaryMessages::Ptr messages_;
  MemoryReservation request_memory_;  // the request's bytes, until the call is done
  grpc::ByteBuffer* const response_;  // gRPC's
};

// Note [Request flow], streaming form. The call is an upload until the client half-closes
// (Note [Uploads apart from work]): tracked by the service's UploadTracker, its bytes charged
// to the server's budget, and taking no engine slot. Then it is admitted, and reads, the work
// and writes happen one after another, so no two of them touch the reactor's fields at once;
// OnCancel touches only the token, and the tracker's reaper only mutex_'s fields and Finish,
// while a read is outstanding. The request and response never exist as one string (Note
// [Zero-copy streaming]): received chunks' bytes are moved into a ChunkedRequest, parsed once
// the client half-closes, whose big tensor bytes the engine uses in place (Note [Tensor bytes
// left in the chunks]); the response is serialized into slices, its big tensors' bytes slices
// over the engine's tensors (ChunkedResponse), and each chunk written is a frame around some of
// those slices, not a copy (Note [Chunks sent without a copy]).
class GradService::StreamGradReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public UploadTracker::Upload {
 public:
  StreamGradReactor(GradService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        cancel_(MakeToken(context)),
        received_at_(absl::Now()),
        trace_(TraceIdOf(*context)) {
    EchoTraceId(trace_, context);  // Note [Trace ids]
    absl::StatusOr<Tenant*> tenant = service->TenantOf(context);
    if (!tenant.ok()) {
      service->Reject("", trace_.value, kStream, nullptr, tenant.status(),
                      metrics::RejectReason::kUnauthenticated);
      Finish(ToGrpcStatus(tenant.status()));
      return;
    }
    tenant_ = *tenant;
    if (absl::Status begun = service->uploads_.Begin(this); !begun.ok()) {
      service->Reject("", trace_.value, kStream, tenant_, begun,
                      metrics::RejectReason::kUploadsFull);
      Finish(ToGrpcStatus(begun));
      return;
    }
    received_.memory() = MemoryReservation(service->BudgetOf(tenant_));
    *chunk_.mutable_data() = chunking::BufferPool::Default().Take();
    StartNextRead();
  }

  void OnReadDone(bool ok) override {
    {
      MutexLock lock(&mutex_);
      if (expired_) return;  // the reaper ended the call; this read failed because of it
      reading_ = false;
    }
    if (!ok) {
      chunking::BufferPool::Default().Give(std::move(*chunk_.mutable_data()));  // reads are over
      service_->uploads_.End(this);
      RunRequest();
      return;
    }
    UploadTracker::Progress(this);
    if (!ParseChunk(&read_, &chunk_)) {
      FailUpload(absl::InvalidArgumentError(
                     absl::StrCat("chunk ", chunks_read_ + 1,
                                  " of the stream is malformed: not a gradserve.v1.Chunk message")),
                 metrics::RejectReason::kUploadMalformed);
      return;
    }
    ++chunks_read_;
    // total_bytes is only a claim: it can fail a call early, never size an allocation.
    const int64_t limit = service_->options_.max_request_bytes;
    const int64_t size = static_cast<int64_t>(chunk_.data().size());
    if (chunk_.total_bytes() > limit || received_.size() + size > limit) {
      FailUpload(absl::ResourceExhaustedError(
                     absl::StrCat("the streamed request is larger than the limit of ", limit,
                                  " bytes (--max_request_bytes)")),
                 metrics::RejectReason::kUploadTooLarge);
      return;
    }
    // Counted decompressed, as received, before the server keeps them.
    if (absl::Status s = received_.memory().Grow(size); !s.ok()) {
      FailUpload(absl::ResourceExhaustedError(absl::StrCat(
                     "the server cannot hold the rest of this streamed request: ", s.message())),
                 metrics::RejectReason::kUploadMemory);
      return;
    }
    // Note [Chunk buffer pool]: the next read fills a pooled buffer; a chunk much smaller than
    // its buffer is copied out, so that the buffer serves the next read.
    std::string* data = chunk_.mutable_data();
    if (data->size() >= data->capacity() / 2) {
      received_.Append(std::move(*data));
      *data = chunking::BufferPool::Default().Take();
    } else {
      received_.Append(std::string(*data));
    }
    StartNextRead();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the response stream broke"));
      return;
    }
    WriteNextChunk();
  }

  void OnCancel() override { CancelWork(*cancel_); }
  void OnDone() override {
    service_->uploads_.End(this);  // waits for a scan of the reaper in progress
    delete this;
  }

  // Note [Uploads apart from work]: called by the reaper with the tracker's lock held.
  bool ExpireIfWaiting() override {
    MutexLock lock(&mutex_);
    if (!reading_ || expired_) return false;
    expired_ = true;
    const absl::Status status = absl::DeadlineExceededError(
        absl::StrCat("the streamed request made no progress for ",
                     absl::FormatDuration(service_->uploads_.idle_timeout()),
                     " (--upload_idle_timeout); the call was ended"));
    service_->Reject("", trace_.value, kStream, tenant_, status,
                     metrics::RejectReason::kUploadIdle);
    // Legal with a read outstanding: it then completes with ok false (and is ignored).
    Finish(ToGrpcStatus(status));
    return true;
  }

 private:
  // Reads the next chunk; the reaper may end the call while the read is outstanding.
  void StartNextRead() {
    {
      MutexLock lock(&mutex_);
      reading_ = true;
    }
    StartRead(&read_);
  }

  // The client half-closed (or the call broke): admit the request, parse what came (cheap: big
  // tensor bytes are not copied) and run it on a worker.
  void RunRequest() {
    if (context_->IsCancelled()) {
      FailUpload(absl::CancelledError("the client cancelled the call while sending it"),
                 metrics::RejectReason::kCancelled);
      return;
    }
    metrics::RejectReason reason;
    if (absl::Status admitted = service_->Admit(tenant_, &reason); !admitted.ok()) {
      FailUpload(admitted, reason);
      return;
    }
    if (absl::Status parsed = received_.Parse(&request_); !parsed.ok()) {
      FailEarly(parsed);
      return;
    }
    Job job;
    job.rpc = kStream;
    job.trace = trace_.value;
    job.tenant = tenant_;
    job.received = received_at_;
    job.request = &request_;
    job.response = &response_;
    job.request_bytes = received_.size();
    job.chunked = &received_;
    job.deferred = &deferred_;
    job.cancel = cancel_;
    job.done = [this](const absl::Status& status) {
      std::vector<grpc::Slice> out;  // the serialized response
      if (status.ok() && !deferred_.SerializeToSlices(response_, &out)) {
        Finish(ToGrpcStatus(absl::ResourceExhaustedError(
            "the response is larger than 2 GiB, more than one streamed message can carry")));
        return;
      }
      deferred_.Clear();
      response_.Clear();
      if (!status.ok()) {
        Finish(ToGrpcStatus(status));
        return;
      }
      size_t total = 0;
      for (const grpc::Slice& slice : out) total += slice.size();
      frames_ = chunking::CutIntoChunks(out, std::max<int64_t>(1, service_->options_.chunk_bytes),
                                        static_cast<int64_t>(total));
      WriteNextChunk();
    };
    service_->Execute(std::move(job));
  }

  // Ends a call that was never admitted: an upload refused, broken or over a limit.
  void FailUpload(const absl::Status& status, metrics::RejectReason reason) {
    service_->uploads_.End(this);
    received_.Clear();
    service_->Reject(request_.request_id(), trace_.value, kStream, tenant_, status, reason);
    Finish(ToGrpcStatus(status));
  }

  // Ends an admitted call that did not reach a worker.
  void FailEarly(const absl::Status& status) {
    service_->EndCall(request_.request_id(), trace_.value, kStream, tenant_, status, received_at_,
                      0, received_.size(), 0);
    received_.Clear();
    Finish(ToGrpcStatus(status));
  }

  // Writes the next of frames_ (chunk_bytes of the response each, the first one carrying the
  // total size; an empty response is one empty chunk), or finishes once all were written. A
  // frame's bytes are the serialized response's slices or parts of them, not copies (Note
  // [Chunks sent without a copy], Note [Unary tensor bytes taken]); each frame is let go once
  // it is sent, and with it the engine tensors it alone still held.
  void WriteNextChunk() {
    if (next_ > 0) frames_[next_ - 1].Clear();
    if (next_ == frames_.size()) {
      std::vector<grpc::ByteBuffer>().swap(frames_);
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&frames_[next_++]);
  }

  GradService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<autograd::CancellationToken> cancel_;
  const absl::Time received_at_;
  const TraceId trace_;
  Tenant* tenant_ = nullptr;  // set by the constructor; null without a token file
  // Guards what the reaper reads (Note [Uploads apart from work]).
  Mutex mutex_;
  bool reading_ ABSL_GUARDED_BY(mutex_) = false;  // a read is outstanding
  bool expired_ ABSL_GUARDED_BY(mutex_) = false;  // the reaper finished the call
  grpc::ByteBuffer read_;                         // the read in progress
  v1::Chunk chunk_;          // the last chunk read, parsed; its data buffer is pooled
  int64_t chunks_read_ = 0;  // for errors
  ChunkedRequest received_;  // the request's chunks; parsed, then cleared, by the worker
  v1::GradRequest request_;
  v1::GradResponse response_;
  ChunkedResponse deferred_;  // response_'s big tensors, until the response is serialized
  std::vector<grpc::ByteBuffer> frames_;  // the response's chunks; each let go once sent
  size_t next_ = 0;                       // the frame written next
};

GradService::GradService(ServerOptions options, std::shared_ptr<TokenAuth> auth)
    : options_(std::move(options)),
      started_(absl::Now()),
      info_(DescribeServer(options_)),
      refusal_log_(options_.log_refusals_per_second),
      memory_(MakeServerMemoryBudget(options_.max_server_memory_bytes > 0
                                         ? options_.max_server_memory_bytes
                                         : DefaultServerMemoryBytes(options_.memory.has_value()
                                                                        ? *options_.memory
                                                                        : DetectMemory()))),
      uploads_(options_.max_uploads, options_.upload_idle_timeout),
      auth_(std::move(auth)),
      sessions_(std::make_unique<SessionStore>(options_.session_idle_ttl,
                                               options_.max_sessions_per_tenant)),
      shared_memory_(std::make_unique<SharedMemoryRegistry>(options_.shared_memory)),
      pool_(std::make_unique<WorkerPool>(
          options_.worker_threads > 0
              ? options_.worker_threads
              : std::max(1, static_cast<int>(std::thread::hardware_concurrency())))) {
  if (auth_ != nullptr) {  // Note [Tenants' shares]
    const SecurityOptions& security = options_.security;
    tenants_ = std::make_unique<Tenants>(
        security.tenant_max_in_flight > 0 ? security.tenant_max_in_flight
                                          : std::max<int64_t>(1, options_.max_in_flight / 2),
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(memory_->limit()) *
                                                  security.tenant_memory_share)),
        memory_);
  }
}

GradService::~GradService() {
  pool_.reset();
  refusal_log_.Flush();
}

grpc::ServerUnaryReactor* GradService::ComputeGradients(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  const absl::Time received = absl::Now();
  TraceId trace = TraceIdOf(*context);
  EchoTraceId(trace, context);  // Note [Trace ids]
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  if (!tenant.ok()) {
    Reject(UnaryMessages::PeekRequestId(*request), trace.value, kUnary, nullptr, tenant.status(),
           metrics::RejectReason::kUnauthenticated);
    return FinishNow(context, ToGrpcStatus(tenant.status()));
  }
  // Admitted before it is parsed: a full or draining server refuses a call without spending
  // the parse's time and memory on it; its log line has the request id read from the bytes.
  metrics::RejectReason reason;
  if (absl::Status admitted = Admit(*tenant, &reason); !admitted.ok()) {
    Reject(UnaryMessages::PeekRequestId(*request), trace.value, kUnary, *tenant, admitted, reason);
    return FinishNow(context, ToGrpcStatus(admitted));
  }
  // The parsed request holds about as many bytes as the serialized one (Note [Request flow]).
  MemoryReservation request_memory(BudgetOf(*tenant));
  if (absl::Status s = request_memory.Grow(static_cast<int64_t>(request->Length())); !s.ok()) {
    const absl::Status refused = absl::ResourceExhaustedError(
        absl::StrCat("the server cannot hold this request now: ", s.message()));
    EndCall(UnaryMessages::PeekRequestId(*request), trace.value, kUnary, *tenant, refused, received,
            0, static_cast<int64_t>(request->Length()), 0);
    return FinishNow(context, ToGrpcStatus(refused));
  }
  UnaryMessages::Ptr messages = UnaryMessages::Take();
  if (const absl::Status parsed = messages->ParseRequest(*request); !parsed.ok()) {
    EndCall(UnaryMessages::PeekRequestId(*request), trace.value, kUnary, *tenant, parsed, received,
            0, messages->request_bytes(), 0);
    return FinishNow(context, ToGrpcStatus(parsed));
  }
  Job job;
  job.rpc = kUnary;
  job.trace = std::move(trace.value);
  job.tenant = *tenant;
  job.received = received;
  job.request = &messages->request();
  job.response = messages->response();
  job.request_bytes = messages->request_bytes();
  job.op_records = messages->op_records();
  // Note [Unary tensor bytes taken].
  job.chunked = messages->chunked();
  job.deferred = messages->deferred();
  if (!RunsInline(messages->request(), job.request_bytes, options_.max_inline_cost)) {
    return new UnaryGradReactor(this, context, std::move(job), std::move(messages),
                                std::move(request_memory), response);
  }
  // Note [Inline or pool]: small enough to run on this thread.
  requests_inline_.fetch_add(1, std::memory_order_relaxed);
  job.cancel = MakeToken(context);
  // Destroyed after FinishNow, but gRPC sends an inline response only once this returns
  // (Note [Teardown after the reply]).
  RequestRunner runner;
  absl::Status status = Run(job, runner);
  if (status.ok()) status = messages->SerializeResponse(response);
  return FinishNow(context, ToGrpcStatus(status));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* GradService::ComputeGradientsStream(
    grpc::CallbackServerContext* context) {
  return new StreamGradReactor(this, context);
}

grpc::ServerUnaryReactor* GradService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const v1::ServerInfoRequest* /*request*/,
                                                     v1::ServerInfo* response) {
  const absl::Time received = absl::Now();
  if (!options_.security.admin_listen.empty() && auth_ == nullptr) {
    // Moved to the admin address; with tokens, TokenAuth decides (Note [Who may call]).
    return FinishCounted(context, metrics::Rpc::kGetServerInfo, nullptr, received,
                         grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                      "GetServerInfo is served on the admin address "
                                      "(--admin_listen), not on this port"));
  }
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  *response = Info();
  return FinishCounted(context, metrics::Rpc::kGetServerInfo, tenant.ok() ? *tenant : nullptr,
                       received, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GradService::FinishCounted(grpc::CallbackServerContext* context,
                                                     metrics::Rpc rpc, const Tenant* tenant,
                                                     absl::Time received,
                                                     const grpc::Status& status) {
  metrics::CallTimes times;
  times.total_us = absl::ToInt64Microseconds(absl::Now() - received);
  metrics_.Ended(rpc, TenantSlot(tenant), static_cast<absl::StatusCode>(status.error_code()), times,
                 0, 0, 0);
  return FinishNow(context, status);
}

v1::ServerInfo GradService::Info() const {
  v1::ServerInfo info = info_;
  *info.mutable_counters() = counters();
  return info;
}

absl::StatusOr<Tenant*> GradService::TenantOf(const grpc::CallbackServerContext* context) {
  if (auth_ == nullptr) return nullptr;
  const std::string name = auth_->TenantOf(context->client_metadata());
  if (name.empty()) {
    return absl::UnauthenticatedError(
        "the bearer token is not one of this server's clients' (revoked)");
  }
  return tenants_->Get(name);
}

grpc::ServerUnaryReactor* GradService::Ping(grpc::CallbackServerContext* context,
                                            const v1::PingRequest* request,
                                            v1::PingResponse* response) {
  const absl::Time received = absl::Now();
  response->set_payload(request->payload());
  absl::StatusOr<Tenant*> tenant = TenantOf(context);
  return FinishCounted(context, metrics::Rpc::kPing, tenant.ok() ? *tenant : nullptr, received,
                       grpc::Status::OK);
}

absl::Status GradService::Admit(Tenant* tenant, metrics::RejectReason* reason) {
  requests_total_.fetch_add(1, std::memory_order_relaxed);
  auto unavailable = [reason] {
    *reason = metrics::RejectReason::kDraining;
    return absl::UnavailableError("the server is shutting down; retry on another replica");
  };
  if (draining_.load()) return unavailable();
  // Note [Tenants' shares]: the tenant's share first, so that a tenant over it takes no slot.
  if (tenant != nullptr) {
    if (absl::Status s = tenant->Admit(); !s.ok()) {
      *reason = metrics::RejectReason::kTenantFull;
      return s;
    }
  }
  int64_t n = in_flight_.load(std::memory_order_relaxed);
  do {
    if (n >= options_.max_in_flight) {
      if (tenant != nullptr) tenant->Release();
      *reason = metrics::RejectReason::kServerFull;
      return absl::ResourceExhaustedError(
          absl::StrCat("the server is full: ", n, " requests in flight, the limit is ",
                       options_.max_in_flight, " (--max_in_flight); retry later"));
    }
  } while (!in_flight_.compare_exchange_weak(n, n + 1));
  // Note [Admission without a lock]: admitted, unless draining began meanwhile.
  if (draining_.load()) {
    if (tenant != nullptr) tenant->Release();
    EndInFlight();
    return unavailable();
  }
  return absl::OkStatus();
}

void GradService::EndInFlight() {
  if (in_flight_.fetch_sub(1) == 1) {
    MutexLock lock(&idle_mutex_);
    idle_.SignalAll();
  }
}

void GradService::Execute(Job job) {
  pool_->Submit([this, job = std::move(job)] {
    RequestRunner runner;  // destroyed after job.done (Note [Teardown after the reply])
    job.done(Run(job, runner));
  });
}

absl::Status GradService::Run(const Job& job, RequestRunner& runner) {
  if (options_.before_run_for_testing) options_.before_run_for_testing(*job.request, *job.cancel);
  absl::Status status;
  {
    // Every tensor of the request counts against the server's budget too (Note [Budgets
    // within a budget]).
    MemoryBudgetScope server_memory(&BudgetOf(job.tenant));
    // Note [Bare device names]: the least loaded GPU for "cuda", for this request's life.
    const DeviceLoad::Lease devices = device_load_.Acquire();
    DeviceChoiceScope device_choice(devices.choice());
    RequestRegions regions(shared_memory_.get(), TenantKey(job.tenant));
    runner.set_regions(&regions);
    status = runner.Run(*job.request, options_.limits, job.cancel, job.received, job.response,
                        job.chunked, job.deferred, job.op_records);
    runner.set_regions(nullptr);
  }
  int64_t bytes_out = 0;
  if (status.ok()) {
    bytes_out =
        static_cast<int64_t>(job.deferred != nullptr ? job.deferred->SerializedSize(*job.response)
                                                     : job.response->ByteSizeLong());
    // The serialized response, until the runner is destroyed after the reply; the deferred
    // tensors in it are their own bytes, charged already (Note [Tensor bytes left in the
    // chunks]).
    const int64_t copied =
        bytes_out -
        static_cast<int64_t>(job.deferred != nullptr ? job.deferred->DeferredBytes() : 0);
    status = runner.ReserveResponse(copied, BudgetOf(job.tenant));
    if (!status.ok()) bytes_out = 0;
  }
  EndCall(job.request->request_id(), job.trace, job.rpc, job.tenant, status, job.received,
          job.response->num_nodes(), job.request_bytes, bytes_out, &job.response->timings());
  return status;
}

void GradService::EndCall(const std::string& request_id, absl::string_view trace, metrics::Rpc rpc,
                          Tenant* tenant, const absl::Status& status, absl::Time received,
                          int64_t nodes, int64_t bytes_in, int64_t bytes_out,
                          const v1::Timings* timings) {
  (status.ok() ? requests_ok_ : requests_failed_).fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes_in, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes_out, std::memory_order_relaxed);
  const int64_t us = absl::ToInt64Microseconds(absl::Now() - received);
  metrics::CallTimes times;
  times.total_us = us;
  if (timings != nullptr) {
    times.ran = true;
    times.queue_us = timings->queue_us();
    times.forward_us = timings->forward_us();
    times.backward_us = timings->backward_us();
  }
  // The code the client sees (ToGrpcStatus: UNKNOWN is never sent, INTERNAL is).
  metrics_.Ended(
      rpc, TenantSlot(tenant),
      status.code() == absl::StatusCode::kUnknown ? absl::StatusCode::kInternal : status.code(),
      times, nodes, bytes_in, bytes_out);
  if (Logs(status)) {
    auto line = [&] {
      // The client's strings in it are quoted, its message escaped (Note [Quoting client
      // strings]); in JSON, escaped (Note [JSON log lines]).
      const grpc::Status grpc_status = ToGrpcStatus(status);
      LogRecord record("request");
      record.Client("id", request_id)
          .Word("rpc", LogName(rpc))
          .Word("status",
                absl::StatusCodeToString(static_cast<absl::StatusCode>(grpc_status.error_code())))
          .Millis("duration_ms", us)
          .Number("nodes", nodes)
          .Number("bytes_in", bytes_in)
          .Number("bytes_out", bytes_out);
      AddCallFields(tenant, trace, &record);
      if (!status.ok()) record.Message("error", grpc_status.error_message().substr(0, 200));
      return record.Line();
    };
    // Note [Refusals logged at a bounded rate]
    if (status.ok()) {
      LogLine(line());
    } else {
      refusal_log_.Log(line);
    }
  }
  if (tenant != nullptr) tenant->Release();
  EndInFlight();
}

void GradService::Reject(const std::string& request_id, absl::string_view trace, metrics::Rpc rpc,
                         const Tenant* tenant, const absl::Status& status,
                         metrics::RejectReason reason) {
  requests_rejected_.fetch_add(1, std::memory_order_relaxed);
  metrics_.Rejected(rpc, TenantSlot(tenant), reason);
  if (!Logs(status)) return;
  refusal_log_.Log([&] {  // Note [Refusals logged at a bounded rate]
    LogRecord record("request");
    record.Client("id", request_id)
        .Word("rpc", LogName(rpc))
        .Word("status", absl::StatusCodeToString(status.code()))
        .Number("duration_ms", 0)
        .Number("nodes", 0);
    AddCallFields(tenant, trace, &record);
    record.Message("error", ClientMessage(status.message(), 200));
    return record.Line();
  });
}

bool GradService::Logs(const absl::Status& status) const {
  switch (options_.log_requests) {
    case ServerOptions::LogRequests::kAll:
      return true;
    case ServerOptions::LogRequests::kErrors:
      return !status.ok();
    case ServerOptions::LogRequests::kNone:
      return false;
  }
  return true;
}

void GradService::StartDraining() {
  draining_.store(true);
  sessions_->EndAll();       // Note [Graph sessions]: draining waits for calls, not for sessions
  shared_memory_->EndAll();  // calls using a region hold it until they end
}

bool GradService::WaitUntilIdle(absl::Duration timeout) {
  auto idle = [this] { return in_flight_.load() == 0; };
  MutexLock lock(&idle_mutex_);
  if (timeout == absl::InfiniteDuration()) {  // no deadline: a timed wait would overflow
    idle_.Wait(&idle_mutex_, idle);
    return true;
  }
  return idle_.WaitWithDeadline(&idle_mutex_, absl::Now() + timeout, idle);
}

std::string GradService::MetricsText() const {
  metrics::TextWriter out;
  const std::vector<const Tenant*> tenants =
      tenants_ != nullptr ? tenants_->All() : std::vector<const Tenant*>();
  metrics_.Write(&out, [&tenants](int slot) {
    // Slots 1..kMaxTenants are tenants 0..kMaxTenants-1 (RequestMetrics::TenantSlot).
    return slot - 1 < static_cast<int>(tenants.size()) ? tenants[slot - 1]->name()
                                                       : std::string("_unknown");
  });
  auto gauge = [&out](const char* name, const char* help, int64_t value) {
    out.Family(name, "gauge", help);
    out.Sample(name, {}, value);
  };
  gauge("gradserve_in_flight", "Grad calls admitted now (queued or running).",
        in_flight_.load(std::memory_order_relaxed));
  gauge("gradserve_max_in_flight", "Grad calls that may be admitted at once (--max_in_flight).",
        options_.max_in_flight);
  gauge("gradserve_uploads_in_progress", "Streamed grad requests still arriving.", uploads_.open());
  gauge("gradserve_sessions", "Graph sessions held now (Forward, then Backward calls).",
        sessions_->size());
  gauge("gradserve_shared_memory_regions",
        "Shared-memory regions registered now by clients on this host.", shared_memory_->size());
  gauge("gradserve_shared_memory_bytes",
        "Bytes of the shared-memory regions mapped now; they count in "
        "gradserve_memory_used_bytes.",
        shared_memory_->bytes());
  gauge("gradserve_memory_used_bytes",
        "Bytes the server's memory budget has handed out now: requests' tensors and Nodes, "
        "uploads, responses.",
        memory_->used());
  gauge("gradserve_memory_peak_bytes", "The most gradserve_memory_used_bytes has been.",
        memory_->peak());
  gauge("gradserve_memory_limit_bytes",
        "The server's memory budget (--max_server_memory_bytes, or a share of the container's).",
        memory_->limit());
  if (!tenants.empty()) {
    out.Family("gradserve_tenant_in_flight", "gauge", "A tenant's grad calls admitted now.");
    for (const Tenant* t : tenants) {
      out.Sample("gradserve_tenant_in_flight", {{"tenant", t->name()}}, t->in_flight());
    }
    out.Family("gradserve_tenant_memory_used_bytes", "gauge",
               "Bytes of a tenant's memory share in use now.");
    for (const Tenant* t : tenants) {
      out.Sample("gradserve_tenant_memory_used_bytes", {{"tenant", t->name()}},
                 t->memory()->used());
    }
  }
  WriteEngineMetrics(&out);
  gauge("gradserve_engine_workers", "Engine CPU worker threads.", pool_->num_threads());
  out.Family("gradserve_engine_worker_busy_seconds_total", "counter",
             "Time the engine CPU workers spent running requests, all workers together.");
  out.Sample("gradserve_engine_worker_busy_seconds_total", {},
             static_cast<double>(pool_->busy_ns()) / 1e9);
  out.Family("gradserve_inline_requests_total", "counter",
             "Grad and session Backward calls small enough to run on gRPC's thread instead "
             "of a worker.");
  out.Sample("gradserve_inline_requests_total", {},
             requests_inline_.load(std::memory_order_relaxed));
  out.Family("gradserve_uptime_seconds", "gauge", "Seconds since the server started.");
  out.Sample("gradserve_uptime_seconds", {}, absl::ToDoubleSeconds(absl::Now() - started_));
  out.Family("gradserve_build_info", "gauge", "The server's build; always 1.");
  out.Sample("gradserve_build_info",
             {{"version", info_.version()},
              {"malloc", options_.malloc_name},
              {"cuda", kCudaBuilt ? "on" : "off"}},
             int64_t{1});
  return out.Take();
}

v1::Counters GradService::counters() const {
  v1::Counters c;
  c.set_requests_total(requests_total_.load(std::memory_order_relaxed));
  c.set_requests_ok(requests_ok_.load(std::memory_order_relaxed));
  c.set_requests_failed(requests_failed_.load(std::memory_order_relaxed));
  c.set_requests_rejected(requests_rejected_.load(std::memory_order_relaxed));
  c.set_bytes_received(bytes_received_.load(std::memory_order_relaxed));
  c.set_bytes_sent(bytes_sent_.load(std::memory_order_relaxed));
  c.set_uptime_us(absl::ToInt64Microseconds(absl::Now() - started_));
  c.set_in_flight(in_flight_.load(std::memory_order_relaxed));
  c.set_sessions(sessions_->size());
  c.set_shared_memory_regions(shared_memory_->size());
  c.set_shared_memory_bytes(shared_memory_->bytes());
  return c;
}

}  // namespace gradserve::server
