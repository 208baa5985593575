// TLS and mutual TLS on the serving port (Note [Certificates re-read on change] in
// server/security/server_security.h): real servers on loopback, real gRPC clients,
// certificates made by openssl for each test.

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

std::unique_ptr<server::GradServer> StartTls(const TestPki& pki, bool mutual,
                                             server::ServerOptions options = TestOptions()) {
  options.security.tls_cert = pki.Path("server.pem");
  options.security.tls_key = pki.Path("server-key.pem");
  if (mutual) options.security.tls_client_ca = pki.Path("ca.pem");
  options.security.reload_interval = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::string Target(const server::GradServer& server) {
  return absl::StrCat("127.0.0.1:", server.port());
}

// A short deadline: a failed handshake otherwise retries until the call's deadline.
client::CallOptions Quick() {
  client::CallOptions options;
  options.timeout = absl::Seconds(3);
  return options;
}

absl::Status Square(client::Client& client) {
  return client.ComputeGradients(SquareRequest(), Quick()).status();
}

TEST(TlsTest, TlsClientWithTheRightCaIsServed) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/false);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem")));
  EXPECT_TRUE(Square(*client).ok()) << Square(*client);
}

TEST(TlsTest, PlaintextClientToTlsServerFails) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/false);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(Target(*server), grpc::InsecureChannelCredentials());
  EXPECT_EQ(Square(*client).code(), absl::StatusCode::kUnavailable);
}

TEST(TlsTest, ServerCertificateFromAnotherCaFails) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/false);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(Target(*server), TlsCredentials(pki.Path("other-ca.pem")));
  EXPECT_EQ(Square(*client).code(), absl::StatusCode::kUnavailable);
}

TEST(TlsTest, ExpiredServerCertificateFails) {
  TestPki pki;
  absl::SleepFor(absl::Milliseconds(1100));  // expired.pem was valid to the second it was made
  server::ServerOptions options = TestOptions();
  options.security.tls_cert = pki.Path("expired.pem");
  options.security.tls_key = pki.Path("expired-key.pem");
  absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ClientWith(Target(**server), TlsCredentials(pki.Path("ca.pem")));
  EXPECT_EQ(Square(*client).code(), absl::StatusCode::kUnavailable);
}

TEST(TlsTest, MutualTlsServesAClientWithACertificateOfItsCa) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/true);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(
      Target(*server),
      TlsCredentials(pki.Path("ca.pem"), pki.Path("client.pem"), pki.Path("client-key.pem")));
  EXPECT_TRUE(Square(*client).ok()) << Square(*client);
}

TEST(TlsTest, MutualTlsWithoutAClientCertificateFails) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/true);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem")));
  EXPECT_EQ(Square(*client).code(), absl::StatusCode::kUnavailable);
}

TEST(TlsTest, MutualTlsWithAClientCertificateFromAnotherCaFails) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/true);
  ASSERT_NE(server, nullptr);
  auto client =
      ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem"), pki.Path("other-client.pem"),
                                                 pki.Path("other-client-key.pem")));
  EXPECT_EQ(Square(*client).code(), absl::StatusCode::kUnavailable);
}

TEST(TlsTest, HealthAnswersOverTlsWithoutAClientCertificateOnlyWithoutMutualTls) {
  TestPki pki;
  auto server = StartTls(pki, /*mutual=*/false);
  ASSERT_NE(server, nullptr);
  auto client = ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem")));
  absl::StatusOr<std::string> health = client->CheckHealth("", Quick());
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
}

// Note [Certificates re-read on change]: a certificate and key rotated on disk (by a rename,
// as Kubernetes does) are used by the next connection, with no restart, while a call in
// flight on an old connection finishes.
TEST(TlsTest, RotatedCertificateIsUsedByTheNextConnectionAndCallsInFlightFinish) {
  TestPki pki;
  auto hold = std::make_shared<absl::Notification>();
  auto held = std::make_shared<absl::Notification>();
  server::ServerOptions options = TestOptions();
  options.max_inline_cost = 0;  // held on a worker, not on gRPC's thread
  options.before_run_for_testing = [hold, held](const v1::GradRequest& request,
                                                const autograd::CancellationToken&) {
    if (request.request_id() != "held") return;
    held->Notify();
    hold->WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  auto server = StartTls(pki, /*mutual=*/false, options);
  ASSERT_NE(server, nullptr);
  auto old_client = ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem")));
  absl::Status in_flight_status;
  std::thread in_flight([&] {
    v1::GradRequest request = SquareRequest();
    request.set_request_id("held");
    client::CallOptions call;
    call.timeout = absl::Seconds(30);
    in_flight_status = old_client->ComputeGradients(request, call).status();
  });
  ASSERT_TRUE(held->WaitForNotificationWithTimeout(absl::Seconds(10)));

  pki.Replace("server-key.pem", "other-server-key.pem");
  pki.Replace("server.pem", "other-server.pem");
  // The new pair is read within the reload interval (1 s); new connections trust other-ca.
  absl::Status rotated = absl::UnknownError("not tried");
  for (int i = 0; i < 60 && !rotated.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    auto fresh = ClientWith(Target(*server), TlsCredentials(pki.Path("other-ca.pem")));
    rotated = Square(*fresh);
  }
  EXPECT_TRUE(rotated.ok()) << rotated;
  // A new connection that trusts only the old CA is refused now.
  auto stale = ClientWith(Target(*server), TlsCredentials(pki.Path("ca.pem")));
  EXPECT_EQ(Square(*stale).code(), absl::StatusCode::kUnavailable);

  hold->Notify();
  in_flight.join();
  EXPECT_TRUE(in_flight_status.ok()) << in_flight_status;
}

TEST(TlsTest, BadTlsFilesStopTheStartNamingTheFlag) {
  TestPki pki;
  server::ServerOptions options = TestOptions();
  options.security.tls_cert = pki.Path("server.pem");
  options.security.tls_key = pki.Path("other-server-key.pem");
  absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--tls_key"), absl::string_view::npos);
  EXPECT_EQ(server.status().message().find("PRIVATE KEY"), absl::string_view::npos);

  options.security.tls_key = pki.Path("missing.pem");
  server = server::GradServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("--tls_key"), absl::string_view::npos);
}

}  // namespace
}  // namespace gradserve::testing
