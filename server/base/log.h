// The server's one logging helper: whole lines to stderr, prefixed with the time.

#ifndef GRADSERVE_SERVER_BASE_LOG_H_
#define GRADSERVE_SERVER_BASE_LOG_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gradserve::server {

// Writes "<RFC 3339 time> gradserve-server: <line>\n" to stderr in one write, so lines from
// different threads never interleave. Thread safe.
void LogLine(absl::string_view line);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_BASE_LOG_H_
