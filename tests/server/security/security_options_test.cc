// The token file's format, the permissions of methods, the checks of the security flags and the
// admin address (server/security/, Note [The admin address] in server/service/grad_server.h).

#include "server/security/security_options.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/security/token_table.h"
#include "server/service/grad_server.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using server::TokenTable;

TEST(TokenTableTest, ParsesTheFixedFormat) {
  const std::string text = absl::StrCat(
      "# a comment\n\n  alice acme ", TokenDigest("t1"), "\n", "bob\tbeta\t", TokenDigest("t2"),
      "\tgrad,info # trailing comment\n", "ops acme ", TokenDigest("t3"), " all\n");
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "f");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->entries().size(), 3u);
  EXPECT_EQ(table->tenant_count(), 2);
  const server::TokenEntry* alice = table->Find("t1");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->tenant, "acme");
  EXPECT_EQ(alice->permissions, server::kPermitGrad);
  EXPECT_EQ(table->Find("t2")->permissions, server::kPermitGrad | server::kPermitInfo);
  EXPECT_EQ(table->Find("t3")->permissions, server::kPermitAll);
  EXPECT_EQ(table->Find("t4"), nullptr);
  EXPECT_EQ(table->Find(""), nullptr);
}

TEST(TokenTableTest, TheDigestIsWhatSha256sumPrints) {
  // printf %s abc | sha256sum
  EXPECT_EQ(TokenDigest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Note [SHA-256 per call]: each thread keeps its own digest context, reused call after call.
TEST(TokenTableTest, TheDigestIsTheSameOnEveryThreadAndEveryTime) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  // printf '' | sha256sum
  const std::string empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (TokenDigest(i % 2 == 0 ? "abc" : "") != (i % 2 == 0 ? abc : empty)) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(TokenDigest(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(TokenTableTest, ErrorsNameTheLineAndFieldButNeverQuoteIt) {
  const std::string token = "pasted-token-Rr7";
  for (const std::string& text :
       {absl::StrCat("ok acme ", TokenDigest("a"), "\nalice acme ", token, "\n"),
        absl::StrCat("ok acme ", TokenDigest("a"), "\nalice acme ", TokenDigest("b"), " grad,",
                     token, "\n"),
        absl::StrCat("ok acme ", TokenDigest("a"), "\n", token, "\n")}) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens.txt");
    ASSERT_FALSE(table.ok()) << text;
    EXPECT_NE(table.status().message().find("tokens.txt line 2"), absl::string_view::npos)
        << table.status();
    EXPECT_EQ(table.status().message().find(token), absl::string_view::npos) << table.status();
  }
  EXPECT_FALSE(
      TokenTable::Parse(absl::StrCat("a t ", TokenDigest("x"), "\na u ", TokenDigest("y"), "\n"),
                        "f")
          .ok());  // a name twice
  EXPECT_FALSE(
      TokenTable::Parse(absl::StrCat("a t ", TokenDigest("x"), "\nb u ", TokenDigest("x"), "\n"),
                        "f")
          .ok());  // a digest twice
}

TEST(TokenTableTest, PermissionsOfMethods) {
  EXPECT_EQ(server::PermissionFor("/grpc.health.v1.Health/Check"), server::kPermitNone);
  EXPECT_EQ(server::PermissionFor("/grpc.health.v1.Health/Watch"), server::kPermitNone);
  EXPECT_EQ(server::PermissionFor("/gradserve.v1.GradService/ComputeGradients"),
            server::kPermitGrad);
  EXPECT_EQ(server::PermissionFor("/gradserve.v1.GradService/ComputeGradientsStream"),
            server::kPermitGrad);
  EXPECT_EQ(server::PermissionFor("/gradserve.v1.GradService/Ping"), server::kPermitGrad);
  EXPECT_EQ(server::PermissionFor("/gradserve.v1.GradService/GetServerInfo"), server::kPermitInfo);
  EXPECT_EQ(server::PermissionFor("/grpc.reflection.v1alpha.ServerReflection/"
                                  "ServerReflectionInfo"),
            server::kPermitReflection);
  EXPECT_EQ(server::PermissionFor("/other.Service/X"), server::kPermitAll);
  EXPECT_EQ(server::BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(server::BearerToken("bearer abc"), "abc");
  EXPECT_EQ(server::BearerToken("Basic abc"), "");
  EXPECT_EQ(server::BearerToken("Bearer "), "");
}

TEST(SecurityOptionsTest, ChecksNameTheFlag) {
  auto message = [](server::SecurityOptions o) {
    return std::string(server::CheckSecurityOptions(o).message());
  };
  server::SecurityOptions o;
  EXPECT_TRUE(server::CheckSecurityOptions(o).ok());
  o.tls_cert = "c";
  EXPECT_NE(message(o).find("--tls_cert needs --tls_key"), std::string::npos);
  o = {};
  o.auth_tokens_file = "t";
  EXPECT_NE(message(o).find("--auth_tokens_file needs --tls_cert"), std::string::npos);
  o = {};
  o.tls_client_ca = "ca";
  EXPECT_NE(message(o).find("--tls_client_ca"), std::string::npos);
  o = {};
  o.tenant_memory_share = 1.5;
  EXPECT_NE(message(o).find("--tenant_memory_share"), std::string::npos);
  o = {};
  o.tenant_max_in_flight = -1;
  EXPECT_NE(message(o).find("--tenant_max_in_flight"), std::string::npos);
  o = {};
  o.reload_interval = absl::ZeroDuration();
  EXPECT_NE(message(o).find("--reload_interval"), std::string::npos);
}

TEST(SecurityOptionsTest, WarnsOnlyAboutAnExposedAddress) {
  server::SecurityOptions o;
  EXPECT_EQ(server::ExposureWarning("127.0.0.1:50051", o), "");
  EXPECT_EQ(server::ExposureWarning("localhost:50051", o), "");
  EXPECT_EQ(server::ExposureWarning("[::1]:50051", o), "");
  EXPECT_NE(server::ExposureWarning("0.0.0.0:50051", o).find("without TLS"), std::string::npos);
  o.tls_cert = "c";
  o.tls_key = "k";
  EXPECT_NE(server::ExposureWarning("0.0.0.0:50051", o).find("without client authentication"),
            std::string::npos);
  o.auth_tokens_file = "t";
  EXPECT_EQ(server::ExposureWarning("0.0.0.0:50051", o), "");
}

TEST(SecurityFlagsTest, BadValuesExit2NamingTheFlag) {
  for (const auto& [flag, name] :
       {std::pair<std::string, std::string>{"--tenant_memory_share=2", "--tenant_memory_share"},
        {"--tenant_max_in_flight=-1", "--tenant_max_in_flight"},
        {"--auth_tokens_file=/nonexistent", "--auth_tokens_file"},
        {"--tls_cert=/nonexistent", "--tls_cert"},
        {"--reload_interval=0s", "--reload_interval"}}) {
    ServerProcess process({flag});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2) << flag;
    EXPECT_NE(process.Log().find(name), std::string::npos) << process.Log();
  }
  TestPki pki;
  ServerProcess missing({"--tls_cert=" + pki.Path("server.pem"),
                         "--tls_key=" + pki.Path("server-key.pem"),
                         "--auth_tokens_file=" + pki.Path("missing")});
  EXPECT_EQ(missing.WaitForExit(absl::Seconds(20)), 2);
  EXPECT_NE(missing.Log().find("--auth_tokens_file"), std::string::npos) << missing.Log();
}

TEST(AdminAddressTest, ServesHealthAndInfoAndTakesInfoOffTheServingPort) {
  server::ServerOptions options = TestOptions();
  options.security.admin_listen = "127.0.0.1:0";
  TestServer server(options);
  ASSERT_GT(server.server().admin_port(), 0);
  auto admin = client::Client::Connect(absl::StrCat("127.0.0.1:", server.server().admin_port()));
  absl::StatusOr<v1::ServerInfo> info = admin->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->limits().max_message_bytes(), 0);
  absl::StatusOr<std::string> health = admin->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  EXPECT_EQ(server.client().GetServerInfo().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(server.client().ComputeGradients(SquareRequest()).ok());
}

}  // namespace
}  // namespace gradserve::testing
