// Helpers for the server tests: an in-process server on a free loopback port with a real
// client, and requests used by several tests.

#ifndef GRADSERVE_TESTS_SERVER_TEST_UTIL_H_
#define GRADSERVE_TESTS_SERVER_TEST_UTIL_H_

#include <sys/types.h>

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/library/gradserve_client.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/status.h"
#include "server/base/cgroup.h"
#include "server/service/grad_server.h"
#include "server/service/server_options.h"

namespace gradserve::testing {

namespace v1 = ::gradserve::v1;
using client::HostTensor;
using client::RequestBuilder;

// Small limits, so that every limit can be passed cheaply.
server::ServerOptions TestOptions();

// A GradServer on 127.0.0.1, port 0 (picked free), and a Client connected to it. Shuts the
// server down (no grace) when destroyed.
class TestServer {
 public:
  explicit TestServer(const server::ServerOptions& options = TestOptions());
  ~TestServer();

  client::Client& client() { return *client_; }
  server::GradServer& server() { return *server_; }
  std::string target() const;

 private:
  std::unique_ptr<server::GradServer> server_;
  std::unique_ptr<client::Client> client_;
};

// The gradserve-server binary as a child process on 127.0.0.1 (port picked free), its stderr
// in a file. Killed (SIGKILL) when destroyed if it still runs.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> flags);
  ~ServerProcess();

  // The port from the "listening on" log line, or 0 if it does not come within timeout.
  int WaitForPort(absl::Duration timeout);
  // Its stderr and stdout so far.
  std::string Log() const;
  void Signal(int sig);
  pid_t pid() const { return pid_; }
  // The exit status, or -1 if it does not exit within timeout.
  int WaitForExit(absl::Duration timeout);

 private:
  std::string log_path_;
  pid_t pid_ = -1;
};

// A fake cgroup filesystem and /proc/self/cgroup in a temporary directory, removed when
// destroyed: Write("/self", ...) is the process's cgroup file, Write("/fs/...", ...) the files
// under the cgroup root (Note [Reading the cgroup] in server/base/cgroup.h).
class FakeCgroup {
 public:
  FakeCgroup();
  ~FakeCgroup();
  void Write(const std::string& path, const std::string& text);
  server::CgroupPaths paths() const { return {root_ + "/fs", root_ + "/self"}; }
  // The root to give gradserve-server's --cgroup_root.
  std::string root() const { return root_ + "/fs"; }

 private:
  std::string root_;
};

// The text of /proc/PID/maps: the files process pid has mapped (empty if it cannot be read).
std::string MappedFiles(pid_t pid);

// loss = sum(x * x) with x = [1, 2, 3] float32 requiring grad; one grad call for x.
v1::GradRequest SquareRequest();

// A request that runs for a while, with little memory: x [1, n] requires grad, W = a^T b
// ([n, n], built on the server), `steps` times h = tanh(h @ W), loss = sum(h); one grad call.
v1::GradRequest SlowRequest(int steps, int n = 1024);

// Keeps one SlowRequest(2000) in flight through client (up to 60 s) until destroyed; the
// destructor cancels it and waits for it, so a test may return early. The call is sent at once;
// WaitForInFlight tells when the server has admitted it.
class SlowCallInFlight {
 public:
  explicit SlowCallInFlight(client::Client& client);
  ~SlowCallInFlight();

  SlowCallInFlight(const SlowCallInFlight&) = delete;
  SlowCallInFlight& operator=(const SlowCallInFlight&) = delete;

 private:
  client::CallCanceller canceller_;
  std::thread thread_;
};

// Polls the server's counters until in_flight == expected or timeout; true if it got there.
bool WaitForInFlight(client::Client& client, int64_t expected, absl::Duration timeout);

// Sends bytes as they are as a unary ComputeGradients call on channel, bypassing the client
// library's serialization; returns the call's status.
grpc::Status SendUnaryBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& bytes);

// A ByteBuffer's bytes, joined.
std::string Flatten(const grpc::ByteBuffer& buffer);

// Sends each of messages as it is as one message of a ComputeGradientsStream call on channel
// (bytes that should be Chunks, bypassing the client library), half-closes, reads the
// response to its end and returns the call's status.
grpc::Status SendStreamMessages(const std::shared_ptr<grpc::Channel>& channel,
                                const std::vector<std::string>& messages);

// Runs the same request against the running server and checks 2x. Returns the status.
absl::Status CheckSquareWorks(client::Client& client);

// A ComputeGradientsStream call on channel that sends one small chunk and then nothing: the
// stalled upload of a careless or hostile client. Its status arrives when the server ends the
// call; the destructor cancels it if it is still open and waits for its end.
class StalledUpload : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit StalledUpload(const std::shared_ptr<grpc::Channel>& channel);
  ~StalledUpload() override;

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  // The call's status, if it ended within timeout.
  std::optional<grpc::Status> Wait(absl::Duration timeout);

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer first_;
  grpc::ByteBuffer read_;
  std::promise<grpc::Status> done_;
  std::shared_future<grpc::Status> status_;
};

// n channels to target, each with a connection of its own (a connection carries a bounded
// number of streams).
std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target, int n);

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_SERVER_TEST_UTIL_H_
