// Certificates made at test time with Debian's openssl, in a fresh temporary folder: nothing
// secret is committed. EC P-256 keys, so that making them takes milliseconds.

#ifndef GRADSERVE_TESTS_SERVER_SECURITY_TEST_PKI_H_
#define GRADSERVE_TESTS_SERVER_SECURITY_TEST_PKI_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/library/gradserve_client.h"
#include "server/service/server_options.h"

namespace gradserve::testing {

// A folder with two CAs and certificates they signed:
//   ca.pem                           CA "test-ca"
//   other-ca.pem                     CA "other-ca", unrelated
//   server.pem, server-key.pem       "localhost" and 127.0.0.1, signed by test-ca
//   other-server.pem, -key.pem       the same names, signed by other-ca
//   expired.pem, expired-key.pem     the same names, signed by test-ca, valid for 0 days
//   client.pem, client-key.pem       client "alice", signed by test-ca
//   other-client.pem, -key.pem       client "mallory", signed by other-ca
// Thread safety: none needed; made once per test.
class TestPki {
 public:
  // Makes everything; fails the test (ADD_FAILURE) if openssl does.
  TestPki();
  ~TestPki();  // removes the folder

  // The path of a file in the folder.
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

  // Signs a new "localhost" server certificate and key with ca (a base name: "ca" or
  // "other-ca") into name.pem and name-key.pem.
  void MakeServerCertificate(const std::string& ca, const std::string& name, int days = 2);
  // Writes text to the file name in the folder (a rename over it, as Kubernetes does).
  void Write(const std::string& name, const std::string& text) const;
  // Copies the file from over the file to, atomically (a rename).
  void Replace(const std::string& to, const std::string& from) const;

  // Sets options to serve TLS with server.pem and to check the tokens file "tokens" (write it
  // first).
  void ServeTlsWithTokens(server::ServerOptions& options) const;
  // A client of 127.0.0.1:port trusting ca.pem and sending token (none if empty).
  std::unique_ptr<client::Client> TokenClient(int port, const std::string& token) const;

 private:
  std::string dir_;
};

// Credentials trusting ca_file (and with the client's pair when set, and a token).
std::shared_ptr<grpc::ChannelCredentials> TlsCredentials(const std::string& ca_file,
                                                         const std::string& cert_file = "",
                                                         const std::string& key_file = "",
                                                         const std::string& token = "");
// A client of target with credentials.
std::unique_ptr<client::Client> ClientWith(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials);
// "SHA256HEX" of token, as `printf %s TOKEN | sha256sum` prints it.
std::string TokenDigest(const std::string& token);

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_SERVER_SECURITY_TEST_PKI_H_
