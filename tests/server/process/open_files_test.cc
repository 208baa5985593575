// Note [Open files] (server/process/main.cc) and Note [Our own listening socket]
// (server/service/listener.h) on the real binary: it raises its soft RLIMIT_NOFILE to the
// hard limit at start, and a new client still connects after an attack that used up every
// file descriptor has ended.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

// The soft limit on open files of process pid, from /proc/PID/limits; -1 if unreadable.
int64_t SoftFileLimitOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/limits"));
  for (std::string line; std::getline(in, line);) {
    if (!absl::StartsWith(line, "Max open files")) continue;
    std::vector<std::string> fields =
        absl::StrSplit(line.substr(std::string("Max open files").size()), ' ', absl::SkipEmpty());
    int64_t soft = -1;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &soft)) return soft;
  }
  return -1;
}

TEST(OpenFilesTest, TheServerRaisesItsSoftLimitToTheHardLimit) {
  rlimit ours;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &ours), 0);
  if (ours.rlim_max != RLIM_INFINITY && ours.rlim_max <= 64) GTEST_SKIP() << "hard limit <= 64";
  const rlim_t expected = ours.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : ours.rlim_max;
  // The server inherits a soft limit of 64 from this process, lowered while it starts.
  rlimit lowered = ours;
  lowered.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  ServerProcess process(std::vector<std::string>{});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &ours), 0);
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  EXPECT_TRUE(absl::StrContains(
      process.Log(), absl::StrCat("open files: soft limit ", expected, ", raised from 64")))
      << process.Log();
  EXPECT_EQ(SoftFileLimitOf(process.pid()), static_cast<int64_t>(expected));
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  EXPECT_TRUE(CheckSquareWorks(*client).ok());
}

// Opens a TCP connection to 127.0.0.1:port and leaves it open; -1 if it cannot.
int OpenConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(OpenFilesTest, ANewClientConnectsAfterTheDescriptorsRanOut) {
  ServerProcess process({"--log_requests=errors"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  // The server, started, may hold 128 descriptors at most (its soft and hard limit): an
  // attacker's connections use them up.
  constexpr int kLimit = 128;
  const rlimit limit = {kLimit, kLimit};
  ASSERT_EQ(prlimit(process.pid(), RLIMIT_NOFILE, &limit, nullptr), 0);
  std::unique_ptr<client::Client> before =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(CheckSquareWorks(*before).ok());

  std::vector<int> attack;
  for (int i = 0; i < 3 * kLimit; ++i) {
    const int fd = OpenConnection(port);
    if (fd >= 0) attack.push_back(fd);
  }
  EXPECT_GT(attack.size(), 2u * kLimit);
  // gRPC 1.51's own listener says "Failed accept4: Too many open files", and accepts no more.
  bool ran_out = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(10); !ran_out && absl::Now() < end;) {
    const std::string log = process.Log();
    ran_out = absl::StrContains(log, "out of file descriptors") ||
              absl::StrContains(log, "Too many open files");
    if (!ran_out) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(ran_out) << process.Log();
  // A connection made before the attack is still served.
  EXPECT_TRUE(CheckSquareWorks(*before).ok());

  // The attack ends; a new client connects and is served. (A channel of its own: gRPC would
  // otherwise share the connection of `before`, made to the same address.)
  for (int fd : attack) close(fd);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  client::Client after(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                 grpc::InsecureChannelCredentials(), args));
  client::CallOptions call;
  call.timeout = absl::Seconds(10);
  absl::StatusOr<v1::GradResponse> r = after.ComputeGradients(SquareRequest(), call);
  EXPECT_TRUE(r.ok()) << r.status() << "\n" << process.Log();
}

}  // namespace
}  // namespace gradserve::testing
