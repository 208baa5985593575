#include "server/security/token_table.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace gradserve::server {
namespace {

constexpr size_t kMaxNameBytes = 128;

// Names and tenants: letters, digits and ._-@: safe in a log line and a metric label.
bool IsName(absl::string_view s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '@';
  });
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ParseDigest(absl::string_view hex, Sha256Digest* digest) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*digest)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

bool ParsePermissions(absl::string_view text, uint32_t* permissions) {
  *permissions = 0;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (item == "grad") {
      *permissions |= kPermitGrad;
    } else if (item == "info") {
      *permissions |= kPermitInfo;
    } else if (item == "reflection") {
      *permissions |= kPermitReflection;
    } else if (item == "all") {
      *permissions |= kPermitAll;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

// Note [SHA-256 per call]: every call with a token hashes it twice (TokenAuth::Process, then
// TenantOf in the handler). OpenSSL 3's one-shot SHA256() looks the algorithm up in the
// provider store (a lock and a hash table) and makes and frees a digest context each time:
// 5,600 instructions per hash under callgrind, 11,200 per grad_tiny call, a fifth of the
// 51,000 that TLS with a token added to the server's share of the call. The algorithm fetched
// once and a context kept per thread: 2,900 per hash (mostly the compression itself), and
// 0.33-0.49 us down to 0.09 us per hash on the 2-CPU VM (docs/benchmarks.md, TLS section).
// Falls back to SHA256() if OpenSSL cannot give either.
namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

const EVP_MD* Sha256Algorithm() {
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // never freed
  return md;
}

}  // namespace

Sha256Digest Sha256(absl::string_view bytes) {
  Sha256Digest digest;
  const EVP_MD* md = Sha256Algorithm();
  thread_local const std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  unsigned int size = 0;
  if (md != nullptr && ctx != nullptr && EVP_DigestInit_ex(ctx.get(), md, nullptr) == 1 &&
      EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) == 1 &&
      EVP_DigestFinal_ex(ctx.get(), digest.data(), &size) == 1 && size == digest.size()) {
    return digest;
  }
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

std::string HexDigest(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(64);
  for (uint8_t b : digest) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

uint32_t PermissionFor(absl::string_view path) {
  if (absl::StartsWith(path, "/grpc.health.v1.Health/")) return kPermitNone;
  if (absl::StartsWith(path, "/grpc.reflection.")) return kPermitReflection;
  if (path == "/gradserve.v1.GradService/GetServerInfo") return kPermitInfo;
  if (path == "/gradserve.v1.GradService/ComputeGradients" ||
      path == "/gradserve.v1.GradService/ComputeGradientsStream" ||
      path == "/gradserve.v1.GradService/Ping" || path == "/gradserve.v1.GradService/Forward" ||
      path == "/gradserve.v1.GradService/Backward" || path == "/gradserve.v1.GradService/Extend" ||
      path == "/gradserve.v1.GradService/Release" ||
      path == "/gradserve.v1.GradService/RegisterSharedMemory" ||
      path == "/gradserve.v1.GradService/UnregisterSharedMemory") {
    return kPermitGrad;
  }
  return kPermitAll;
}

std::string PermissionNames(uint32_t permissions) {
  std::vector<absl::string_view> names;
  if (permissions & kPermitGrad) names.push_back("grad");
  if (permissions & kPermitInfo) names.push_back("info");
  if (permissions & kPermitReflection) names.push_back("reflection");
  return names.empty() ? "none" : absl::StrJoin(names, ",");
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view file) {
  TokenTable table;
  absl::flat_hash_set<std::string> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_tokens_file ", file, " line ", line_number, ": ", what));
    };
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\f\v"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 3 || fields.size() > 4) {
      return error(absl::StrCat("has ", fields.size(),
                                " fields; expected NAME TENANT SHA256_HEX [METHODS]"));
    }
    TokenEntry entry;
    if (!IsName(fields[0]) || !IsName(fields[1])) {
      return error(absl::StrCat(IsName(fields[0]) ? "TENANT" : "NAME", " must be 1 to ",
                                kMaxNameBytes, " letters, digits or ._-@"));
    }
    entry.name = std::string(fields[0]);
    entry.tenant = std::string(fields[1]);
    if (!ParseDigest(fields[2], &entry.digest)) {
      // The field is not quoted: it may be a token written where its digest belongs.
      return error(
          "SHA256_HEX must be 64 hex digits: the SHA-256 of the token, as "
          "`printf %s TOKEN | sha256sum` prints it (the token itself never goes in the file)");
    }
    if (fields.size() == 4 && !ParsePermissions(fields[3], &entry.permissions)) {
      return error("METHODS must be a comma-separated list of grad, info, reflection or all");
    }
    if (!names.insert(entry.name).second) {
      return error(absl::StrCat("the client name ", entry.name, " appears twice"));
    }
    for (const TokenEntry& other : table.entries_) {
      if (other.digest == entry.digest) {
        return error(absl::StrCat("the same token digest as client ", other.name));
      }
    }
    table.entries_.push_back(std::move(entry));
  }
  return table;
}

const TokenEntry* TokenTable::Find(absl::string_view token) const {
  const Sha256Digest digest = Sha256(token);
  const TokenEntry* found = nullptr;
  // Note [Tokens compared in constant time]: no early exit.
  for (const TokenEntry& entry : entries_) {
    const bool same = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    if (same) found = &entry;
  }
  return found;
}

int64_t TokenTable::tenant_count() const {
  absl::flat_hash_set<absl::string_view> tenants;
  for (const TokenEntry& entry : entries_) tenants.insert(entry.tenant);
  return static_cast<int64_t>(tenants.size());
}

absl::string_view BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return {};
  }
  return authorization.substr(kScheme.size());
}

}  // namespace gradserve::server
