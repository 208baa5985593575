#include "tests/server/security/test_pki.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/library/channel_credentials.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "server/security/token_table.h"

namespace gradserve::testing {
namespace {

void Run(const std::string& dir, const std::string& command) {
  const std::string line = absl::StrCat("cd '", dir, "' && (", command, ") >/dev/null 2>&1");
  ASSERT_EQ(std::system(line.c_str()), 0) << command;
}

constexpr char kNewKey[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

}  // namespace

TestPki::TestPki() {
  std::string templ = ::testing::TempDir() + "/gradserve-pki-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp";
    return;
  }
  dir_ = templ;
  Write("server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  Write("client.ext", "extendedKeyUsage=clientAuth\n");
  for (const char* ca : {"ca", "other-ca"}) {
    Run(dir_, absl::StrCat("openssl req -x509 ", kNewKey, " -keyout ", ca, "-key.pem -out ", ca,
                           ".pem -days 2 -subj /CN=", ca));
  }
  // First, so that it has expired by the time a test uses it (valid to the second it was made).
  MakeServerCertificate("ca", "expired", 0);
  MakeServerCertificate("ca", "server");
  MakeServerCertificate("other-ca", "other-server");
  for (auto [ca, name, cn] :
       {std::tuple{"ca", "client", "alice"}, std::tuple{"other-ca", "other-client", "mallory"}}) {
    Run(dir_, absl::StrCat("openssl req ", kNewKey, " -keyout ", name, "-key.pem -out ", name,
                           ".csr -subj /CN=", cn));
    Run(dir_,
        absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                     "-key.pem -CAcreateserial -out ", name, ".pem -days 2 -extfile client.ext"));
  }
}

TestPki::~TestPki() {
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

void TestPki::MakeServerCertificate(const std::string& ca, const std::string& name, int days) {
  Run(dir_, absl::StrCat("openssl req ", kNewKey, " -keyout ", name, "-key.pem -out ", name,
                         ".csr -subj /CN=localhost"));
  Run(dir_, absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                         "-key.pem -CAcreateserial -out ", name, ".pem -days ", days,
                         " -extfile server.ext"));
}

void TestPki::Write(const std::string& name, const std::string& text) const {
  const std::string temp = Path(name + ".tmp");
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::filesystem::rename(temp, Path(name));
}

void TestPki::Replace(const std::string& to, const std::string& from) const {
  std::filesystem::copy_file(Path(from), Path(to + ".tmp"),
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(Path(to + ".tmp"), Path(to));
}

std::shared_ptr<grpc::ChannelCredentials> TlsCredentials(const std::string& ca_file,
                                                         const std::string& cert_file,
                                                         const std::string& key_file,
                                                         const std::string& token) {
  client::ChannelSecurity security;
  security.tls = true;
  security.tls_ca_file = ca_file;
  security.tls_cert_file = cert_file;
  security.tls_key_file = key_file;
  security.token = token;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client::MakeChannelCredentials(security);
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  return credentials.ok() ? *credentials : nullptr;
}

std::unique_ptr<client::Client> ClientWith(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  client::ClientOptions options;
  options.max_message_bytes = 4 << 20;  // no GetServerInfo, which a token may not allow
  return std::make_unique<client::Client>(grpc::CreateCustomChannel(target, credentials, args),
                                          options);
}

void TestPki::ServeTlsWithTokens(server::ServerOptions& options) const {
  options.security.tls_cert = Path("server.pem");
  options.security.tls_key = Path("server-key.pem");
  options.security.auth_tokens_file = Path("tokens");
}

std::unique_ptr<client::Client> TestPki::TokenClient(int port, const std::string& token) const {
  return ClientWith(absl::StrCat("127.0.0.1:", port),
                    TlsCredentials(Path("ca.pem"), "", "", token));
}

std::string TokenDigest(const std::string& token) {
  return server::HexDigest(server::Sha256(token));
}

}  // namespace gradserve::testing
