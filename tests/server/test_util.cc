#include "tests/server/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"
#include "gtest/gtest.h"

extern char** environ;

namespace gradserve::testing {

server::ServerOptions TestOptions() {
  server::ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.worker_threads = 2;
  o.max_message_bytes = 4 << 20;
  o.chunk_bytes = 256 << 10;
  o.max_request_bytes = 64 << 20;
  o.max_in_flight = 16;
  o.limits.max_ops = 5000;
  o.limits.max_leaves = 20;
  o.limits.max_tensor_elements = 8 << 20;
  o.limits.max_memory_bytes = 256 << 20;
  o.limits.max_nesting = 4;
  o.limits.max_backward_calls = 8;
  return o;
}

TestServer::TestServer(const server::ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<server::GradServer>> s = server::GradServer::Start(options);
  if (!s.ok()) {
    ADD_FAILURE() << "server did not start: " << s.status();
    return;
  }
  server_ = *std::move(s);
  client_ = client::Client::Connect(target());
}

TestServer::~TestServer() {
  if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
}

std::string TestServer::target() const { return absl::StrCat("127.0.0.1:", server_->port()); }

ServerProcess::ServerProcess(std::vector<std::string> flags) {
  static std::atomic<int> processes{0};
  log_path_ = absl::StrCat(::testing::TempDir(), "/gradserve-server-", getpid(), "-",
                           processes.fetch_add(1), ".log");
  std::vector<std::string> argv = {GRADSERVE_SERVER_BINARY, "--listen=127.0.0.1:0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 2, 1);  // stdout too (--help prints there)
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&actions);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // The log is kept only where a test failed, to be read (its path in the failure's output).
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "the server's log is kept: %s\n", log_path_.c_str());
  } else {
    std::remove(log_path_.c_str());
  }
}

int ServerProcess::WaitForPort(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end && pid_ > 0) {
    const std::string log = Log();
    const size_t at = log.find("listening on 127.0.0.1:");
    if (at != std::string::npos) {
      const size_t start = at + std::string("listening on 127.0.0.1:").size();
      int port = 0;
      if (absl::SimpleAtoi(log.substr(start, log.find(' ', start) - start), &port)) return port;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void ServerProcess::Signal(int sig) { kill(pid_, sig); }

int ServerProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

v1::GradRequest SquareRequest() {
  RequestBuilder b;
  b.RequestId("square")
      .Leaf("x", HostTensor::Float32({1, 2, 3}, {3}), true)
      .Op("mul", {"x", "x"}, {"y"})
      .Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

v1::GradRequest SlowRequest(int steps, int n) {
  RequestBuilder b;
  b.RequestId(absl::StrCat("slow-", steps))
      .Leaf("x", HostTensor::Float32(std::vector<float>(n, 0.5f), {1, n}), true)
      .Leaf("a", HostTensor::Float32(std::vector<float>(n, 0.03f), {n, 1}))
      .Leaf("b", HostTensor::Float32(std::vector<float>(n, 0.03f), {1, n}))
      .Op("mul", {"a", "b"}, {"w"});
  std::string h = "x";
  for (int i = 0; i < steps; ++i) {
    const std::string m = absl::StrCat("m", i), t = absl::StrCat("h", i);
    b.Op("matmul", {h, "w"}, {m}).Op("tanh", {m}, {t});
    h = t;
  }
  b.Op("sum", {h}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

SlowCallInFlight::SlowCallInFlight(client::Client& client)
    : thread_([this, &client] {
        client::CallOptions o;
        o.canceller = &canceller_;
        o.timeout = absl::Seconds(60);
        client.ComputeGradients(SlowRequest(2000), o).IgnoreError();
      }) {}

SlowCallInFlight::~SlowCallInFlight() {
  canceller_.Cancel();
  thread_.join();
}

bool WaitForInFlight(client::Client& client, int64_t expected, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
    if (info.ok() && info->counters().in_flight() == expected) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

namespace {

// SendStreamMessages's call: writes each message, half-closes, reads until the end.
class RawStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  grpc::Status Run(const std::shared_ptr<grpc::Channel>& channel,
                   const std::vector<std::string>& messages) {
    grpc::GenericStub stub(channel);
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    for (const std::string& m : messages) {
      grpc::Slice slice(m);
      messages_.emplace_back(&slice, 1);
    }
    stub.PrepareBidiStreamingCall(&context_, "/gradserve.v1.GradService/ComputeGradientsStream",
                                  grpc::StubOptions(), this);
    StartRead(&read_);
    WriteNext();
    StartCall();
    return done_.get_future().get();
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&read_);
  }
  void OnDone(const grpc::Status& status) override { done_.set_value(status); }

 private:
  void WriteNext() {
    if (next_ == messages_.size()) {
      StartWritesDone();
      return;
    }
    StartWrite(&messages_[next_++]);
  }

  grpc::ClientContext context_;
  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;
  grpc::ByteBuffer read_;
  std::promise<grpc::Status> done_;
};

}  // namespace

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

grpc::Status SendStreamMessages(const std::shared_ptr<grpc::Channel>& channel,
                                const std::vector<std::string>& messages) {
  return RawStream().Run(channel, messages);
}

grpc::Status SendUnaryBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/gradserve.v1.GradService/ComputeGradients", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

FakeCgroup::FakeCgroup() {
  char pattern[] = "/tmp/gradserve_cgroup_XXXXXX";
  root_ = mkdtemp(pattern);
}

FakeCgroup::~FakeCgroup() { std::filesystem::remove_all(root_); }

void FakeCgroup::Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(root_ + path).parent_path());
  std::ofstream(root_ + path) << text;
}

std::string MappedFiles(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::stringstream mapped;
  mapped << maps.rdbuf();
  return mapped.str();
}

absl::Status CheckSquareWorks(client::Client& client) {
  client::CallOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<client::GradResult> r = client.Grad(SquareRequest(), options);
  if (!r.ok()) return r.status();
  if (r->calls.size() != 1 || r->calls[0].gradients.size() != 1 ||
      !r->calls[0].gradients[0].value) {
    return absl::InternalError("square: wrong response layout");
  }
  const std::vector<double> g = r->calls[0].gradients[0].value->ToDoubles();
  if (g != std::vector<double>{2, 4, 6}) return absl::InternalError("square: wrong gradient");
  return absl::OkStatus();
}

StalledUpload::StalledUpload(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::Chunk chunk;
  chunk.set_total_bytes(1 << 20);
  chunk.set_data("0123456789");
  const std::string bytes = chunk.SerializeAsString();
  grpc::Slice slice(bytes);
  first_ = grpc::ByteBuffer(&slice, 1);
  stub.PrepareBidiStreamingCall(&context_, "/gradserve.v1.GradService/ComputeGradientsStream",
                                grpc::StubOptions(), this);
  StartRead(&read_);
  StartWrite(&first_);
  StartCall();
  status_ = done_.get_future();
}

StalledUpload::~StalledUpload() {
  context_.TryCancel();
  status_.wait();
}

void StalledUpload::OnReadDone(bool ok) {
  if (ok) StartRead(&read_);
}

void StalledUpload::OnDone(const grpc::Status& status) { done_.set_value(status); }

std::optional<grpc::Status> StalledUpload::Wait(absl::Duration timeout) {
  if (status_.wait_for(absl::ToChronoNanoseconds(timeout)) != std::future_status::ready) {
    return std::nullopt;
  }
  return status_.get();
}

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("gradserve.test_connection", i);  // no subchannel shared between them
    channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

}  // namespace gradserve::testing
