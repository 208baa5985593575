#include "server/wire/malformed_request.h"

#include "absl/strings/str_cat.h"

namespace gradserve::server {

absl::Status MalformedRequest(int64_t bytes, bool streamed, absl::string_view detail) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed request: the ", bytes, streamed ? " streamed" : "",
                   " bytes do not parse as a gradserve.v1.GradRequest",
                   detail.empty() ? "" : absl::StrCat(" (", detail, ")")));
}

}  // namespace gradserve::server
