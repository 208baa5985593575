// Bearer tokens (Note [Who may call] in server/security/token_auth.h): a real server on
// loopback with TLS and a token file, real gRPC clients.

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

constexpr char kAlice[] = "alice-token-Zq8vW3";  // grad only
constexpr char kOps[] = "ops-token-Yk2pR7";      // all
constexpr char kBob[] = "bob-token-Hn4sX1";      // revoked by a reload

std::string Tokens(bool with_bob) {
  std::string text = absl::StrCat("# clients of the test\n\nalice acme ", TokenDigest(kAlice),
                                  "\nops acme ", TokenDigest(kOps), " all  # operators\n");
  if (with_bob) absl::StrAppend(&text, "bob beta ", TokenDigest(kBob), " grad,info\n");
  return text;
}

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_.Write("tokens", Tokens(/*with_bob=*/true));
    server::ServerOptions options = TestOptions();
    pki_.ServeTlsWithTokens(options);
    options.security.reload_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<client::Client> Client(const std::string& token) {
    return pki_.TokenClient(server_->port(), token);
  }

  static client::CallOptions Quick() {
    client::CallOptions options;
    options.timeout = absl::Seconds(5);
    return options;
  }

  static absl::StatusCode SquareCode(client::Client& client) {
    return client.ComputeGradients(SquareRequest(), Quick()).status().code();
  }

  // A call to path (any method, even a streaming one) with token; its status.
  grpc::Status CallPath(const std::string& path, const std::string& token) {
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       TlsCredentials(pki_.Path("ca.pem"), "", "", token));
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, path, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }

  TestPki pki_;
  std::unique_ptr<server::GradServer> server_;
};

TEST_F(TokenTest, AKnownTokenIsServed) {
  EXPECT_EQ(SquareCode(*Client(kAlice)), absl::StatusCode::kOk);
  absl::StatusOr<std::string> echo = Client(kAlice)->Ping("x", Quick());
  EXPECT_TRUE(echo.ok()) << echo.status();
}

TEST_F(TokenTest, NoTokenIsUnauthenticated) {
  EXPECT_EQ(SquareCode(*Client("")), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Client("")->Ping("x", Quick()).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TokenTest, AWrongTokenIsUnauthenticatedAndNotEchoed) {
  absl::Status status =
      Client("not-a-token-Qq1")->ComputeGradients(SquareRequest(), Quick()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(status.message().find("not-a-token-Qq1"), absl::string_view::npos);
}

TEST_F(TokenTest, AMethodNotAllowedIsPermissionDenied) {
  absl::Status info = Client(kAlice)->GetServerInfo(Quick()).status();
  EXPECT_EQ(info.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(info.message().find("alice"), absl::string_view::npos);
  EXPECT_TRUE(Client(kOps)->GetServerInfo(Quick()).ok());
  EXPECT_TRUE(Client(kBob)->GetServerInfo(Quick()).ok());
}

TEST_F(TokenTest, HealthAnswersWithoutAToken) {
  absl::StatusOr<std::string> health = Client("")->CheckHealth("", Quick());
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
}

TEST_F(TokenTest, ReflectionNeedsATokenAllowedIt) {
  const std::string path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  EXPECT_EQ(CallPath(path, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallPath(path, kAlice).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Allowed: the call reaches reflection (which then sees an empty message, not a refusal).
  const grpc::StatusCode allowed = CallPath(path, kOps).error_code();
  EXPECT_NE(allowed, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(allowed, grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(TokenTest, UnknownMethodsNeedAToken) {
  EXPECT_EQ(CallPath("/gradserve.v1.GradService/Nothing", "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallPath("/gradserve.v1.GradService/Nothing", kAlice).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// Note [Token file reloads]
TEST_F(TokenTest, ATokenRevokedByAReloadIsUnauthenticated) {
  auto bob = Client(kBob);
  ASSERT_EQ(SquareCode(*bob), absl::StatusCode::kOk);
  pki_.Write("tokens", Tokens(/*with_bob=*/false));
  absl::StatusCode code = absl::StatusCode::kOk;
  for (int i = 0; i < 100 && code == absl::StatusCode::kOk; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    code = SquareCode(*bob);  // the same connection: checked per call
  }
  EXPECT_EQ(code, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(SquareCode(*Client(kAlice)), absl::StatusCode::kOk);
}

TEST_F(TokenTest, ABadReloadKeepsThePreviousTable) {
  pki_.Write("tokens", "alice acme not-a-digest\n");
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(SquareCode(*Client(kAlice)), absl::StatusCode::kOk);
  EXPECT_EQ(SquareCode(*Client(kBob)), absl::StatusCode::kOk);
}

TEST(TokenProcessTest, NoTokenReachesTheServerLog) {
  TestPki pki;
  // A bad reload that pastes a token where its digest belongs must not log it either.
  pki.Write("tokens", Tokens(/*with_bob=*/true));
  ServerProcess process(
      {"--tls_cert=" + pki.Path("server.pem"), "--tls_key=" + pki.Path("server-key.pem"),
       "--auth_tokens_file=" + pki.Path("tokens"), "--reload_interval=50ms", "--log_requests=all"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  auto call = [&](const std::string& token) {
    auto client = ClientWith(target, TlsCredentials(pki.Path("ca.pem"), "", "", token));
    client::CallOptions options;
    options.timeout = absl::Seconds(5);
    v1::GradRequest request = SquareRequest();
    request.set_request_id("r1");
    return client->ComputeGradients(request, options).status().code();
  };
  EXPECT_EQ(call(kAlice), absl::StatusCode::kOk);
  EXPECT_EQ(call("wrong-token-Pp9"), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(call(kAlice + std::string("x")), absl::StatusCode::kUnauthenticated);
  pki.Write("tokens", absl::StrCat("alice acme ", kAlice, "\n"));
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(call(kBob), absl::StatusCode::kOk);  // the previous table is kept

  const std::string log = process.Log();
  EXPECT_NE(log.find("tenant=acme"), std::string::npos) << log;
  EXPECT_NE(log.find("not reloaded"), std::string::npos) << log;
  for (const char* secret : {kAlice, kOps, kBob, "wrong-token-Pp9"}) {
    EXPECT_EQ(log.find(secret), std::string::npos) << secret << " in\n" << log;
  }
  EXPECT_EQ(log.find("PRIVATE KEY"), std::string::npos);
}

}  // namespace
}  // namespace gradserve::testing
