// The `gradserve` tool's connection flags (--tls_ca, --tls_cert, --tls_key, --token_file,
// GRADSERVE_TOKEN) against a real server with TLS, mutual TLS and tokens, certificates made at
// test time by openssl (tests/server/security/test_pki.h).

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"

namespace gradserve::testing {
namespace {

constexpr char kToken[] = "cli-token-Wb6yN2";

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun RunCli(const std::string& args, const std::string& env = "") {
  // One file per test process: ctest runs these tests as processes in parallel, and a shared
  // file let one test read another's output.
  const std::string out = absl::StrCat(::testing::TempDir(), "/security_cli-", getpid(), ".out");
  // A generous deadline: the machine may be loaded (CI runs two tests at once beside builds).
  const std::string command = absl::StrCat(env, " timeout 120 ", GRADSERVE_CLI_PATH, " ", args,
                                           " --timeout=30s > ", out, " 2>&1");
  const int status = std::system(command.c_str());
  CliRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(out, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  run.output = text.str();
  return run;
}

class SecurityCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_.Write("tokens", absl::StrCat("cli acme ", TokenDigest(kToken), " grad\n"));
    pki_.Write("token", absl::StrCat(kToken, "\n"));
    server::ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.worker_threads = 2;
    options.security.tls_cert = pki_.Path("server.pem");
    options.security.tls_key = pki_.Path("server-key.pem");
    options.security.tls_client_ca = pki_.Path("ca.pem");
    options.security.auth_tokens_file = pki_.Path("tokens");
    absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = absl::StrCat("--target=127.0.0.1:", server_->port());
    tls_ = absl::StrCat(" --tls_ca=", pki_.Path("ca.pem"), " --tls_cert=", pki_.Path("client.pem"),
                        " --tls_key=", pki_.Path("client-key.pem"));
  }

  TestPki pki_;
  std::unique_ptr<server::GradServer> server_;
  std::string target_;
  std::string tls_;
};

TEST_F(SecurityCliTest, PingWithMutualTlsAndATokenFile) {
  const CliRun run =
      RunCli(absl::StrCat("ping --count=1 ", target_, tls_, " --token_file=", pki_.Path("token")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST_F(SecurityCliTest, TheTokenMayComeFromTheEnvironment) {
  const CliRun run = RunCli(absl::StrCat("ping --count=1 ", target_, tls_),
                            absl::StrCat("GRADSERVE_TOKEN=", kToken));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST_F(SecurityCliTest, WithoutATokenTheCallIsUnauthenticated) {
  const CliRun run = RunCli(absl::StrCat("ping --count=1 ", target_, tls_), "GRADSERVE_TOKEN=");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("UNAUTHENTICATED"), std::string::npos) << run.output;
}

TEST_F(SecurityCliTest, ATokenNotAllowedInfoIsPermissionDenied) {
  const CliRun run =
      RunCli(absl::StrCat("info ", target_, tls_, " --token_file=", pki_.Path("token")));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("PERMISSION_DENIED"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(kToken), std::string::npos);
}

TEST_F(SecurityCliTest, LoadOverTlsWithAToken) {
  const CliRun run = RunCli(absl::StrCat("load --scenario=grad_tiny --requests=20 --quiet ",
                                         target_, tls_, " --token_file=", pki_.Path("token")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST_F(SecurityCliTest, BadConnectionFlagsExit2NamingTheFlag) {
  CliRun run = RunCli(absl::StrCat("ping ", target_, " --token_file=", pki_.Path("token")));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("TLS"), std::string::npos) << run.output;
  run = RunCli(absl::StrCat("ping ", target_, " --tls_ca=", pki_.Path("missing.pem")));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--tls_ca"), std::string::npos) << run.output;
  run = RunCli(absl::StrCat("ping ", target_, " --tls_cert=", pki_.Path("client.pem")));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--tls_key"), std::string::npos) << run.output;
  run = RunCli(absl::StrCat("load --scenario=ping --requests=1 ", target_,
                            " --token_file=", pki_.Path("missing")));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--token_file"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace gradserve::testing
