// Quoting the strings a client sends, for error messages and log lines.
//
// Note [Quoting client strings]
// Names, ids and string attributes come from the client and come back in error messages (a
// gRPC status's message travels in the call's trailing metadata, whose default limit is 8 KiB)
// and in the server's log. Echoed raw, a 4 KiB name turned an INVALID_ARGUMENT into the
// client's RESOURCE_EXHAUSTED "received initial metadata size exceeds limit", and a name with a
// newline wrote a line of its own into the log (issue 24, item 8). Three things hold now:
//   1. Every client string is bounded at validation (Limits::max_name_bytes, checked by
//      graph::Validate and, for every string of a request, by the server's census in
//      server/wire/wire.cc), over it INVALID_ARGUMENT.
//   2. Every message or log line that echoes a client string writes Quote(s): at most
//      kQuotedBytes of it, between single quotes, each byte that is not printable ASCII (and
//      the quote and the backslash) escaped, and when cut "..." and the full length. Quote is
//      cheap enough for error paths only: messages are built when something failed.
//   3. At the edges, whatever a site forgot: the server caps and escapes a status's whole
//      message where it becomes a gRPC status (ClientMessage, kMaxMessageBytes), and its log
//      escapes every line it writes (server/base/log.h), so no client byte forges a line.
//
// Thread safety: pure functions. Errors: none.

#ifndef GRADSERVE_ENGINE_UTIL_QUOTE_H_
#define GRADSERVE_ENGINE_UTIL_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradserve {

// Bytes of a client string that Quote shows.
inline constexpr size_t kQuotedBytes = 64;
// The longest message ClientMessage lets through: well under gRPC's 8 KiB of metadata, with
// room for the status code and the transport's own headers.
inline constexpr size_t kMaxMessageBytes = 2048;

// Appends s to *out, each byte outside printable ASCII written as \n, \r, \t or \xNN, and
// each byte of `also` (say, a quote and the backslash) as \ and the byte (\xNN if it is a
// space). So the text is one line of ASCII; with "\\'" as also it reads back unambiguously
// between single quotes.
inline void AppendEscaped(absl::string_view s, absl::string_view also, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    const bool escape_also = also.find(c) != absl::string_view::npos;
    if (byte >= 0x20 && byte < 0x7f && !escape_also) {
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (escape_also && c != ' ') {
      out->push_back('\\');
      out->push_back(c);
    } else {
      const char hex[4] = {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
      out->append(hex, 4);
    }
  }
}

// s for a message (Note [Quoting client strings]): "'x'", "'a\nb'", or for a string longer
// than max_bytes its first max_bytes bytes, "..." and its length: "'aaaa...' (4096 bytes)".
inline std::string Quote(absl::string_view s, size_t max_bytes = kQuotedBytes) {
  std::string out = "'";
  AppendEscaped(s.substr(0, max_bytes), "\\'", &out);
  if (s.size() <= max_bytes) {
    out.push_back('\'');
  } else {
    absl::StrAppend(&out, "...' (", s.size(), " bytes)");
  }
  return out;
}

// s as one space-free field of a log line ("id=<field>"): Quote's escapes and cut, without the
// quotes, a space and '=' escaped too; "-" for an empty s.
inline std::string LogField(absl::string_view s, size_t max_bytes = kQuotedBytes) {
  if (s.empty()) return "-";
  std::string out;
  AppendEscaped(s.substr(0, max_bytes), "\\' =", &out);
  if (s.size() > max_bytes) absl::StrAppend(&out, "...(", s.size(), "_bytes)");
  return out;
}

// A status message as it may leave the server: bytes outside printable ASCII escaped (so it is
// one line), and cut to at most max_bytes with "... (message cut, N bytes)" (N its length
// before). A message whose client strings were quoted is unchanged unless it is too long.
inline std::string ClientMessage(absl::string_view message, size_t max_bytes = kMaxMessageBytes) {
  std::string out;
  AppendEscaped(message, "", &out);
  if (out.size() <= max_bytes) return out;
  const std::string tail = absl::StrCat("... (message cut, ", message.size(), " bytes)");
  out.resize(max_bytes > tail.size() ? max_bytes - tail.size() : 0);
  out.append(tail);
  return out;
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_QUOTE_H_
