// The clients allowed to call the server, read from --auth_tokens_file, and the permission
// each gRPC method needs.
//
// Note [The token file]
// Text, one client per line; '#' starts a comment, blank lines are ignored. A line has
// whitespace-separated fields:
//     NAME TENANT SHA256_HEX [METHODS]
// NAME names the client (in the log), TENANT the tenant whose shares its calls draw from
// (Note [Tenants' shares] in server/security/tenants.h), SHA256_HEX the SHA-256 of its bearer
// token in hex, as `printf %s TOKEN | sha256sum` prints it, and METHODS a comma-separated list
// of what it may call: `grad` (ComputeGradients, ComputeGradientsStream, Ping, the session calls
// Forward, Backward, Extend and Release), `info` (GetServerInfo), `reflection` (server reflection)
// or `all`; `grad` if absent. The token itself is never stored, so a leaked file (a backup, a
// ConfigMap by mistake) gives no one access. The Python and Node.js clients' tests write files of
// this format: it is fixed. A client sends its token as `authorization: Bearer TOKEN`, over TLS
// only (Note [Who may call] in server/security/token_auth.h).
//
// Note [Tokens compared in constant time]
// The presented token is hashed with SHA-256 and its digest compared with every entry's with
// CRYPTO_memcmp, the whole table every time: how long a lookup takes depends on the number of
// entries, never on how many bytes of a digest matched or on which entry matched. Hashing alone
// already defeats a byte-by-byte timing attack (a prefix of the digest reveals nothing of the
// token); the constant-time scan is the belt to those braces. A table is one line per client,
// so the scan is short.
//
// Thread safety: a TokenTable is immutable once parsed; share it freely.

#ifndef GRADSERVE_SERVER_SECURITY_TOKEN_TABLE_H_
#define GRADSERVE_SERVER_SECURITY_TOKEN_TABLE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {

using Sha256Digest = std::array<uint8_t, 32>;

// The SHA-256 of bytes.
Sha256Digest Sha256(absl::string_view bytes);
// Lowercase hex, as sha256sum prints it.
std::string HexDigest(const Sha256Digest& digest);

// What a method needs (Note [The token file]): bits of a client's METHODS.
enum Permission : uint32_t {
  kPermitNone = 0,  // health: open to all, for probes
  kPermitGrad = 1,
  kPermitInfo = 2,
  kPermitReflection = 4,
  kPermitAll = kPermitGrad | kPermitInfo | kPermitReflection,
};

// The permission a call to path (":path", "/package.Service/Method") needs. Health's methods
// need none; methods the server does not serve need kPermitAll's any bit: a known client
// (which then gets UNIMPLEMENTED from gRPC), so that a stranger learns nothing of them.
uint32_t PermissionFor(absl::string_view path);
// "grad", "info", "reflection" or "grad,info" for a set of bits; for error messages.
std::string PermissionNames(uint32_t permissions);

struct TokenEntry {
  std::string name;
  std::string tenant;
  Sha256Digest digest;
  uint32_t permissions = kPermitGrad;
};

class TokenTable {
 public:
  // Parses a token file's text. INVALID_ARGUMENT naming `file`, the line and the field that
  // is wrong, never quoting the line (a token pasted by mistake must not reach the log).
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view file);

  // The entry whose digest is the SHA-256 of token, or null (Note [Tokens compared in
  // constant time]). The pointer lives as long as the table.
  const TokenEntry* Find(absl::string_view token) const;

  const std::vector<TokenEntry>& entries() const { return entries_; }
  // Distinct tenants named.
  int64_t tenant_count() const;

 private:
  std::vector<TokenEntry> entries_;
};

// The token of an `authorization` header value "Bearer TOKEN" (the scheme's case ignored), or
// empty if it is no bearer token.
absl::string_view BearerToken(absl::string_view authorization);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SECURITY_TOKEN_TABLE_H_
