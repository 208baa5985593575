// The one exception type of the engine.
//
// Note [Errors inside the engine]
// Kernels, ops and backward functions report errors by throwing StatusError, which carries an
// absl::Status. It never leaves the engine module: the Engine's worker loop and the graph
// interpreter catch it and hand the status on (GraphTask's future, or a StatusOr). Any other
// exception caught there becomes INTERNAL, since it can only be a bug.

#ifndef GRADSERVE_ENGINE_UTIL_STATUS_ERROR_H_
#define GRADSERVE_ENGINE_UTIL_STATUS_ERROR_H_

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace gradserve {

class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().data(); }

 private:
  absl::Status status_;
};

[[noreturn]] inline void ThrowStatus(absl::Status status) { throw StatusError(std::move(status)); }

// Throws INVALID_ARGUMENT with the message pieces concatenated unless cond holds.
#define GS_CHECK_ARG(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ::gradserve::ThrowStatus(absl::InvalidArgumentError(absl::StrCat(__VA_ARGS__))); \
    }                                                                                  \
  } while (false)

// Throws INTERNAL unless cond holds: for invariants that only a bug can break.
#define GS_CHECK_INTERNAL(cond, ...)                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::gradserve::ThrowStatus(absl::InternalError(absl::StrCat(                         \
          "internal invariant failed at ", __FILE__, ":", __LINE__, ": " __VA_ARGS__))); \
    }                                                                                    \
  } while (false)

// Returns the value of a StatusOr, or throws its status.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowStatus(std::move(value).status());
  return *std::move(value);
}
inline void ThrowIfError(absl::Status status) {
  if (!status.ok()) ThrowStatus(std::move(status));
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_STATUS_ERROR_H_
