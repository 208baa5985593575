#include "client/load/load_calls.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/library/channel_target.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"

namespace gradserve::load {
namespace {

// Called with a unary call's status and response, before its CallDoneFn.
using ResponseFn = std::function<void(const grpc::Status& status, grpc::ByteBuffer& response)>;

// A unary call in flight: owns its request (a reference to the shared bytes) and response
// buffers until gRPC reports its status; deletes itself then. on_response, if set, sees the
// response first.
class UnaryCall {
 public:
  UnaryCall(const grpc::ByteBuffer& request, CallDoneFn done, ResponseFn on_response = nullptr)
      : request_(request), done_(std::move(done)), on_response_(std::move(on_response)) {}

  void Start(grpc::GenericStub& stub, const std::string& method, grpc::ClientContext* context) {
    stub.UnaryCall(
        context, method, grpc::StubOptions(), &request_, &response_, [this](grpc::Status status) {
          const int64_t up = static_cast<int64_t>(request_.Length());
          const int64_t down = status.ok() ? static_cast<int64_t>(response_.Length()) : 0;
          if (on_response_) on_response_(status, response_);
          done_(static_cast<int>(status.error_code()), up, down);
          delete this;
        });
  }

 private:
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  CallDoneFn done_;
  ResponseFn on_response_;
};

// One message's bytes as a ByteBuffer.
grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// A ByteBuffer's bytes.
std::string FromBuffer(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

}  // namespace

// Note [Session load]: the sessions of a session run, shared by its calls (and by the Release
// calls still in flight, which hold it).
struct CallStarter::Sessions {
  struct Held {
    std::string id;
    grpc::ByteBuffer backward;  // the workload's BackwardRequest for this session
    int64_t left = 0;           // Backward calls still to make
    std::shared_ptr<grpc::Channel> channel;
  };

  // A session of connection with Backward calls left and no call in flight, now the caller's;
  // nullopt if there is none.
  std::optional<Held> Take(const LoadConnection* connection) {
    absl::MutexLock lock(&mutex);
    auto it = idle.find(connection);
    if (it == idle.end() || it->second.empty()) return std::nullopt;
    Held held = std::move(it->second.back());
    it->second.pop_back();
    return held;
  }
  void Put(const LoadConnection* connection, Held held) {
    absl::MutexLock lock(&mutex);
    idle[connection].push_back(std::move(held));
  }

  // Sends a Release for held, not timed; its completion only counts down releasing.
  static void Release(const std::shared_ptr<Sessions>& self, const Held& held) {
    struct Call {
      grpc::ClientContext context;
      grpc::ByteBuffer request;
      grpc::ByteBuffer response;
    };
    auto* call = new Call;
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReleaseRequest request;
    request.set_session_id(held.id);
    call->request = ToBuffer(request.SerializeAsString());
    {
      absl::MutexLock lock(&self->mutex);
      ++self->releasing;
    }
    grpc::GenericStub stub(held.channel);
    stub.UnaryCall(&call->context, kReleaseMethod, grpc::StubOptions(), &call->request,
                   &call->response, [self, call](const grpc::Status&) {
                     delete call;
                     absl::MutexLock lock(&self->mutex);
                     --self->releasing;
                   });
  }

  // Guards idle and releasing.
  absl::Mutex mutex;
  absl::flat_hash_map<const LoadConnection*, std::vector<Held>> idle ABSL_GUARDED_BY(mutex);
  int64_t releasing ABSL_GUARDED_BY(mutex) = 0;  // Release calls in flight
};

namespace {

// A streamed ComputeGradientsStream call in flight: writes the workload's serialized chunks
// (shared by all calls, as a unary call's request is) one after another while reading the
// response's chunks as bytes; deletes itself in OnDone. gRPC serializes the reactions of one
// call, so the counters need no lock.
class StreamedCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamedCall(const std::vector<grpc::ByteBuffer>& chunks, CallDoneFn done)
      : chunks_(chunks), done_(std::move(done)) {}

  void Start(grpc::GenericStub& stub, grpc::ClientContext* context) {
    stub.PrepareBidiStreamingCall(context, kStreamMethod, grpc::StubOptions(), this);
    StartRead(&received_);
    WriteNext();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    // A failed write means the call is over; OnDone says why.
    if (!ok) return;
    bytes_up_ += static_cast<int64_t>(chunks_[next_].Length());
    ++next_;
    WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    bytes_down_ += static_cast<int64_t>(received_.Length());
    received_.Clear();
    StartRead(&received_);
  }

  void OnDone(const grpc::Status& status) override {
    done_(static_cast<int>(status.error_code()), bytes_up_, status.ok() ? bytes_down_ : 0);
    delete this;
  }

 private:
  static constexpr char kStreamMethod[] = "/gradserve.v1.GradService/ComputeGradientsStream";

  void WriteNext() {
    if (next_ < chunks_.size()) {
      write_ = chunks_[next_];  // a reference to the shared bytes, not a copy
      StartWrite(&write_);
    } else {
      StartWritesDone();
    }
  }

  const std::vector<grpc::ByteBuffer>& chunks_;
  CallDoneFn done_;
  size_t next_ = 0;
  grpc::ByteBuffer write_;
  grpc::ByteBuffer received_;
  int64_t bytes_up_ = 0;
  int64_t bytes_down_ = 0;
};

}  // namespace

LoadConnection::LoadConnection(std::string target, std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)), channel_(std::move(channel)), generic_(channel_) {}

absl::StatusOr<std::unique_ptr<LoadConnection>> LoadConnection::Open(
    const std::string& target, absl::Duration connect_timeout,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials, bool sessions) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Note [Several replicas]: round_robin over the target's addresses, UNAVAILABLE retried.
  // Note [Session load]: a session run's calls keep to one connection.
  std::shared_ptr<grpc::Channel> channel =
      sessions ? client::CreateSessionChannel(target, credentials, args)
               : client::CreateClientChannel(target, credentials, args);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(connect_timeout));
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", target, " within ",
                                               absl::FormatDuration(connect_timeout)));
  }
  return std::unique_ptr<LoadConnection>(new LoadConnection(target, std::move(channel)));
}

CallStarter::CallStarter(const Workload& workload)
    : workload_(workload), sessions_(std::make_shared<Sessions>()) {
  if (!workload.streamed) unary_request_ = ToBuffer(workload.request);
  for (const v1::Chunk& chunk : workload.chunks) {
    stream_chunks_.push_back(ToBuffer(chunk.SerializeAsString()));
  }
}

CallStarter::~CallStarter() = default;

void CallStarter::StartSessionCall(LoadConnection& connection, grpc::ClientContext* context,
                                   CallDoneFn done) const {
  std::optional<Sessions::Held> held = sessions_->Take(&connection);
  if (!held.has_value()) {
    // A Forward, whose session the next calls on this connection find.
    (new UnaryCall(unary_request_, std::move(done),
                   [sessions = sessions_, connection = &connection, workload = &workload_](
                       const grpc::Status& status, grpc::ByteBuffer& response) {
                     v1::ForwardResponse forward;
                     if (!status.ok() || !forward.ParseFromString(FromBuffer(response))) return;
                     v1::BackwardRequest backward;
                     backward.ParseFromString(workload->backward_request);
                     backward.set_session_id(forward.session_id());
                     sessions->Put(connection,
                                   {forward.session_id(), ToBuffer(backward.SerializeAsString()),
                                    workload->session_backward_calls, connection->channel()});
                   }))
        ->Start(connection.generic(), workload_.method, context);
    return;
  }
  const grpc::ByteBuffer backward = held->backward;
  (new UnaryCall(backward, std::move(done),
                 [sessions = sessions_, connection = &connection, held = *std::move(held)](
                     const grpc::Status& status, grpc::ByteBuffer&) mutable {
                   if (status.ok() && --held.left > 0) {
                     sessions->Put(connection, std::move(held));
                   } else if (status.error_code() != grpc::StatusCode::NOT_FOUND) {
                     Sessions::Release(sessions, held);  // done, or failed
                   }
                 }))
      ->Start(connection.generic(), kBackwardMethod, context);
}

void CallStarter::Finish(absl::Duration timeout) const {
  if (!workload_.session) return;
  std::vector<Sessions::Held> held;
  {
    absl::MutexLock lock(&sessions_->mutex);
    for (auto& [connection, sessions] : sessions_->idle) {
      for (Sessions::Held& h : sessions) held.push_back(std::move(h));
    }
    sessions_->idle.clear();
  }
  for (const Sessions::Held& h : held) Sessions::Release(sessions_, h);
  absl::MutexLock lock(&sessions_->mutex);
  auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_->mutex) {
    return sessions_->releasing == 0;
  };
  sessions_->mutex.AwaitWithTimeout(absl::Condition(&released), timeout);
}

void CallStarter::Start(LoadConnection& connection, grpc::ClientContext* context,
                        CallDoneFn done) const {
  if (workload_.session) {
    StartSessionCall(connection, context, std::move(done));
  } else if (workload_.streamed) {
    (new StreamedCall(stream_chunks_, std::move(done)))->Start(connection.generic(), context);
  } else {
    (new UnaryCall(unary_request_, std::move(done)))
        ->Start(connection.generic(), workload_.method, context);
  }
}

}  // namespace gradserve::load
