#include "client/load/load_calls.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/library/channel_target.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"

namespace gradserve::load {
namespace {

// A unary call in flight: owns its request (a reference to the shared bytes) and response
// buffers until gRPC reports its status; deletes itself then.
class UnaryCall {
 public:
  UnaryCall(const grpc::ByteBuffer& request, CallDoneFn done)
      : request_(request), done_(std::move(done)) {}

  void Start(grpc::GenericStub& stub, const std::string& method, grpc::ClientContext* context) {
    stub.UnaryCall(
        context, method, grpc::StubOptions(), &request_, &response_, [this](grpc::Status status) {
          const int64_t up = static_cast<int64_t>(request_.Length());
          const int64_t down = status.ok() ? static_cast<int64_t>(response_.Length()) : 0;
          done_(static_cast<int>(status.error_code()), up, down);
          delete this;
        });
  }

 private:
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  CallDoneFn done_;
};

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
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Note [Several replicas]: round_robin over the target's addresses, UNAVAILABLE retried.
  std::shared_ptr<grpc::Channel> channel = client::CreateClientChannel(target, credentials, args);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(connect_timeout));
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", target, " within ",
                                               absl::FormatDuration(connect_timeout)));
  }
  return std::unique_ptr<LoadConnection>(new LoadConnection(target, std::move(channel)));
}

CallStarter::CallStarter(const Workload& workload) : workload_(workload) {
  if (!workload.streamed) {
    grpc::Slice slice(workload.request.data(), workload.request.size());
    unary_request_ = grpc::ByteBuffer(&slice, 1);
  }
  for (const v1::Chunk& chunk : workload.chunks) {
    const std::string bytes = chunk.SerializeAsString();
    grpc::Slice slice(bytes.data(), bytes.size());
    stream_chunks_.emplace_back(&slice, 1);
  }
}

void CallStarter::Start(LoadConnection& connection, grpc::ClientContext* context,
                        CallDoneFn done) const {
  if (workload_.streamed) {
    (new StreamedCall(stream_chunks_, std::move(done)))->Start(connection.generic(), context);
  } else {
    (new UnaryCall(unary_request_, std::move(done)))
        ->Start(connection.generic(), workload_.method, context);
  }
}

}  // namespace gradserve::load
