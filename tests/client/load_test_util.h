// Helpers of the load tester's tests: gradserve servers in-process on 127.0.0.1 (port 0).

#ifndef GRADSERVE_TESTS_CLIENT_LOAD_TEST_UTIL_H_
#define GRADSERVE_TESTS_CLIENT_LOAD_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "server/service/server_options.h"

namespace gradserve::testing {

// A path in the test temporary directory for a file called name, private to the running test
// and process: ctest runs each test as its own process, two at a time, in one directory.
inline std::string TestTempPath(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(::testing::TempDir(), "/", test != nullptr ? test->test_suite_name() : "",
                      ".", test != nullptr ? test->name() : "", "-", getpid(), "-", name);
}

// A file's whole contents; empty if it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `gradserve ARGS` (at most 60 s) with stdout and stderr in files, so stderr is not a
// terminal.
inline CliRun RunGradserve(const std::string& args) {
  const std::string out = TestTempPath("cli.out"), err = TestTempPath("cli.err");
  const std::string command =
      absl::StrCat("timeout 60 ", GRADSERVE_CLI_PATH, " ", args, " > ", out, " 2> ", err);
  const int status = std::system(command.c_str());
  CliRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = ReadAll(out);
  run.err = ReadAll(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return run;
}

// A GradServer on a free loopback port; shut down (no grace) when destroyed.
class LocalServer {
 public:
  // shared_memory_prefix: --shared_memory_prefix (empty: shared memory off).
  explicit LocalServer(const std::string& shared_memory_prefix = "") {
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.worker_threads = 2;
    options.shared_memory.prefix = shared_memory_prefix;
    auto server = server::GradServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  ~LocalServer() {
    if (server_) server_->Shutdown(absl::ZeroDuration());
  }

  std::string target() const { return absl::StrCat("127.0.0.1:", server_->port()); }
  server::GradServer& server() { return *server_; }

 private:
  std::unique_ptr<server::GradServer> server_;
};

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_CLIENT_LOAD_TEST_UTIL_H_
