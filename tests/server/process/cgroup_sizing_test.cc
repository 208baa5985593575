// The real gradserve-server under a fake cgroup (--cgroup_root) of 1 CPU and 512 MiB: Note
// [Sizing the server's threads], Note [OpenBLAS's threads] and Note [Sizing the server's
// memory] end to end. The start-up lines say what it sized and from where, OpenBLAS starts
// with one thread (so the process has fewer threads than with one BLAS thread per CPU), flags
// win over the cgroup, and a garbage cgroup file is a warning, not a failed start.

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
    if (const char* v = std::getenv("OPENBLAS_NUM_THREADS"); v != nullptr) saved_ = v;
    unsetenv("OPENBLAS_NUM_THREADS");
    cgroup_.Write("/fs/cpu.max", "100000 100000\n");
    cgroup_.Write("/fs/memory.max", "536870912\n");
  }
  void TearDown() override {
    if (!saved_.empty()) setenv("OPENBLAS_NUM_THREADS", saved_.c_str(), 1);
  }
  std::string CgroupFlag() const { return "--cgroup_root=" + cgroup_.root(); }

  FakeCgroup cgroup_;
  std::string saved_;
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
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  ServerProcess server({CgroupFlag()});
  ASSERT_GT(server.WaitForPort(absl::Seconds(20)), 0) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("BLAS threads 1 (OPENBLAS_NUM_THREADS)"));
  unsetenv("OPENBLAS_NUM_THREADS");
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
