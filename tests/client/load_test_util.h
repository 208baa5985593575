// Helpers of the load tester's tests: gradserve servers in-process on 127.0.0.1 (port 0).

#ifndef GRADSERVE_TESTS_CLIENT_LOAD_TEST_UTIL_H_
#define GRADSERVE_TESTS_CLIENT_LOAD_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/grad_server.h"
#include "server/server_options.h"

namespace gradserve::testing {

// A GradServer on a free loopback port; shut down (no grace) when destroyed.
class LocalServer {
 public:
  LocalServer() {
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.worker_threads = 2;
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
