// The real gradserve-server under a fake cgroup (--cgroup_root) of 1 CPU and 512 MiB: Note
// [Sizing the server's threads], Note [OpenBLAS's threads] and Note [Sizing the server's
// memory] end to end. The start-up lines say what it sized and from where, OpenBLAS starts
// with one thread (so the process has fewer threads than with one BLAS thread per CPU), flags
// win over the cgroup, and a garbage cgroup file is a warning, not a failed start.

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/library/gradserve_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/process/cpu_sizing.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::HasSubstr;

// The threads of process pid that carry the process's own name: its main thread, the engine
// workers and OpenBLAS's threads, none of which names its threads (gRPC's do, and their
// number varies from run to run). Counted once the count has held still for 300 ms; -1 if
// /proc cannot be read.
int UnnamedThreadsOf(pid_t pid) {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
  };
  auto count = [&] {
    const std::string name = read(absl::StrCat("/proc/", pid, "/comm"));
    DIR* dir = opendir(absl::StrCat("/proc/", pid, "/task").c_str());
    if (dir == nullptr || name.empty()) return -1;
    int n = 0;
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      n += read(absl::StrCat("/proc/", pid, "/task/", entry->d_name, "/comm")) == name;
    }
    closedir(dir);
    return n;
  };
  int last = count();
  for (int stable = 0, i = 0; stable < 3 && i < 100; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    const int now = count();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
  return last;
}

// The value of name in process pid's environment (/proc/PID/environ); "" if not there.
std::string EnvironmentOf(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (absl::StartsWith(entry, name + "=")) return entry.substr(name.size() + 1);
  }
  return "";
}

class CgroupSizingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The test's own environment must not choose OpenBLAS's threads for the server.
    for (const char* name : kBlasVariables) {
      if (const char* v = std::getenv(name); v != nullptr) saved_.emplace_back(name, v);
      unsetenv(name);
    }
    cgroup_.Write("/fs/cpu.max", "100000 100000\n");
    cgroup_.Write("/fs/memory.max", "536870912\n");
  }
  void TearDown() override {
    for (const char* name : kBlasVariables) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  std::string CgroupFlag() const { return "--cgroup_root=" + cgroup_.root(); }

  static constexpr const char* kBlasVariables[] = {"OPENBLAS_NUM_THREADS",
                                                   "OPENBLAS_THREAD_TIMEOUT"};
  FakeCgroup cgroup_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(CgroupSizingTest, OneCpuAnd512MibSizeWorkersBlasAndMemory) {
  ServerProcess server({CgroupFlag()});
  ASSERT_GT(server.WaitForPort(absl::Seconds(20)), 0) << server.Log();
  const int affinity = server::AffinityCpus();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("cpus: 1 (cgroup cpu.max 100000 100000; ", affinity,
                                          " in the affinity mask); engine workers 1 (cpus), "
                                          "BLAS threads 1 (cpus), intra-op threads 1 "
                                          "(cpus)")));
  EXPECT_THAT(log, HasSubstr("memory: 307 MiB for requests (--max_server_memory_bytes: 60% of "
                             "512 MiB), 77 MiB for gRPC's buffers (--grpc_memory_bytes: 15% of "
                             "512 MiB), of 512 MiB (cgroup memory.max)"));
  // Note [OpenBLAS's threads]: re-executed with the variable set, the same process (whose
  // /proc/PID/environ is the environment its last execv was given).
  EXPECT_EQ(EnvironmentOf(server.pid(), "OPENBLAS_NUM_THREADS"), "1");
  // Note [OpenBLAS's idle threads]: and with the short spin, since the operator set none.
  EXPECT_EQ(EnvironmentOf(server.pid(), "OPENBLAS_THREAD_TIMEOUT"), "18");
  EXPECT_THAT(log, HasSubstr("OpenBLAS's idle threads: OPENBLAS_THREAD_TIMEOUT=18 (gradserve's "
                             "default"));
  const int one_blas_thread = UnnamedThreadsOf(server.pid());

  // The same server with one BLAS thread per CPU of the affinity mask, as OpenBLAS starts by
  // itself: OpenBLAS's pool has affinity - 1 threads more (the caller is the first).
  ServerProcess per_cpu({CgroupFlag(), absl::StrCat("--blas_threads=", affinity)});
  ASSERT_GT(per_cpu.WaitForPort(absl::Seconds(20)), 0) << per_cpu.Log();
  EXPECT_THAT(per_cpu.Log(),
              HasSubstr(absl::StrCat("BLAS threads ", affinity, " (--blas_threads)")));
  const int blas_thread_per_cpu = UnnamedThreadsOf(per_cpu.pid());
  std::printf("unnamed threads: %d with 1 BLAS thread, %d with %d (one per CPU)\n", one_blas_thread,
              blas_thread_per_cpu, affinity);
  EXPECT_EQ(blas_thread_per_cpu - one_blas_thread, affinity - 1);
}

TEST_F(CgroupSizingTest, FlagsWinOverTheCgroup) {
  ServerProcess server({CgroupFlag(), "--worker_threads=3", "--blas_threads=2",
                        "--intra_op_threads=4", "--max_server_memory_bytes=104857600"});
  ASSERT_GT(server.WaitForPort(absl::Seconds(20)), 0) << server.Log();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr("engine workers 3 (--worker_threads), BLAS threads 2 "
                             "(--blas_threads), intra-op threads 4 (--intra_op_threads)"));
  EXPECT_THAT(log, HasSubstr("memory: 100 MiB for requests (--max_server_memory_bytes: flag), "
                             "77 MiB for gRPC's buffers (--grpc_memory_bytes: 15% of 512 MiB)"));
  EXPECT_EQ(EnvironmentOf(server.pid(), "OPENBLAS_NUM_THREADS"), "2");
}

TEST_F(CgroupSizingTest, TheOperatorsOpenBlasVariableIsKept) {
  // The thread count alone: the server keeps it, and re-executes to add the short spin.
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  ServerProcess count_only({CgroupFlag()});
  ASSERT_GT(count_only.WaitForPort(absl::Seconds(20)), 0) << count_only.Log();
  EXPECT_THAT(count_only.Log(), HasSubstr("BLAS threads 1 (OPENBLAS_NUM_THREADS)"));
  EXPECT_THAT(count_only.Log(), HasSubstr("OPENBLAS_THREAD_TIMEOUT=18 (gradserve's default"));
  EXPECT_EQ(EnvironmentOf(count_only.pid(), "OPENBLAS_THREAD_TIMEOUT"), "18");

  // Both: nothing to change, so no re-execution (the environment is as the test gave it).
  setenv("OPENBLAS_THREAD_TIMEOUT", "22", 1);
  ServerProcess both({CgroupFlag()});
  ASSERT_GT(both.WaitForPort(absl::Seconds(20)), 0) << both.Log();
  EXPECT_THAT(both.Log(), HasSubstr("BLAS threads 1 (OPENBLAS_NUM_THREADS)"));
  EXPECT_THAT(both.Log(), HasSubstr("OpenBLAS's idle threads: OPENBLAS_THREAD_TIMEOUT=22 (from "
                                    "the environment)"));
  EXPECT_EQ(EnvironmentOf(both.pid(), "GRADSERVE_BLAS_THREADS_SOURCE"), "");

  // The timeout alone, with a count to set: re-executed for the count, the timeout kept.
  unsetenv("OPENBLAS_NUM_THREADS");
  ServerProcess timeout_only({CgroupFlag()});
  ASSERT_GT(timeout_only.WaitForPort(absl::Seconds(20)), 0) << timeout_only.Log();
  EXPECT_THAT(timeout_only.Log(), HasSubstr("BLAS threads 1 (cpus)"));
  EXPECT_THAT(timeout_only.Log(), HasSubstr("OPENBLAS_THREAD_TIMEOUT=22 (from the environment)"));
  EXPECT_EQ(EnvironmentOf(timeout_only.pid(), "OPENBLAS_NUM_THREADS"), "1");
  EXPECT_EQ(EnvironmentOf(timeout_only.pid(), "OPENBLAS_THREAD_TIMEOUT"), "22");
}

// The CPU time (user + system, in clock ticks) process pid has used; -1 if /proc cannot be read.
int64_t CpuTicksOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the name may hold spaces
  if (name_end == std::string::npos) return -1;
  std::istringstream fields(stat.substr(name_end + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // fields 14 and 15 of proc(5)
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return utime + stime;
}

// Note [OpenBLAS's idle threads]: after a product, OpenBLAS's two threads go to sleep instead of
// spinning on for about 0.1 s. Measured as the server's CPU ticks in the 0.5 s after each of
// three answers: about 7 ticks per answer with OpenBLAS's own timeout (printed for contrast,
// not checked: how much of its spin a thread gets depends on the host's load), none expected
// with the server's.
TEST_F(CgroupSizingTest, OpenBlasThreadsSleepSoonAfterAProduct) {
  auto idle_ticks = [](ServerProcess& server) -> int64_t {
    const int port = server.WaitForPort(absl::Seconds(20));
    if (port <= 0) return -1;
    std::unique_ptr<client::Client> client =
        client::Client::Connect(absl::StrCat("127.0.0.1:", port));
    const int n = 384;  // big enough for OpenBLAS to split the product over its threads
    RequestBuilder b;
    b.Leaf("x", HostTensor::Float32(std::vector<float>(n * n, 0.5f), {n, n}), true)
        .Leaf("w", HostTensor::Float32(std::vector<float>(n * n, 0.25f), {n, n}))
        .Op("matmul", {"x", "w"}, {"y"})
        .Op("matmul", {"y", "w"}, {"z"})
        .Op("sum", {"z"}, {"loss"})
        .Grad({"loss"}, {"x"});
    int64_t ticks = 0;
    for (int i = 0; i < 3; ++i) {
      if (!client->ComputeGradients(b.request()).ok()) return -1;
      const int64_t before = CpuTicksOf(server.pid());
      absl::SleepFor(absl::Milliseconds(500));
      ticks += CpuTicksOf(server.pid()) - before;
    }
    return ticks;
  };
  ServerProcess server({CgroupFlag(), "--blas_threads=2"});
  const int64_t ours = idle_ticks(server);
  setenv("OPENBLAS_THREAD_TIMEOUT", "28", 1);
  ServerProcess openblas_default({CgroupFlag(), "--blas_threads=2"});
  const int64_t theirs = idle_ticks(openblas_default);
  std::printf(
      "CPU ticks in the 0.5 s after each of 3 answers: %lld with OPENBLAS_THREAD_TIMEOUT=18"
      ", %lld with 28 (OpenBLAS's default)\n",
      static_cast<long long>(ours), static_cast<long long>(theirs));
  ASSERT_GE(ours, 0) << server.Log();
  ASSERT_GE(theirs, 0) << openblas_default.Log();
  EXPECT_LE(ours, 6) << "OpenBLAS's threads kept spinning after the answers";
}

TEST_F(CgroupSizingTest, GarbageInTheCgroupIsAWarning) {
  cgroup_.Write("/fs/cpu.max", "lots\n");
  ServerProcess server({CgroupFlag()});
  ASSERT_GT(server.WaitForPort(absl::Seconds(20)), 0) << server.Log();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr("cpu.max', which holds 'lots': not a limit"));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("cpus: ", server::AffinityCpus(), " (affinity: ")));
}

}  // namespace
}  // namespace gradserve::testing
