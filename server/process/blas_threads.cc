#include "server/process/blas_threads.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradserve::server {

namespace {

constexpr char kTimeoutVariable[] = "OPENBLAS_THREAD_TIMEOUT";
constexpr char kTimeoutFromEnvironment[] = ";OPENBLAS_THREAD_TIMEOUT";
constexpr char kTimeoutDefault[] = ";default";

}  // namespace

std::optional<BlasStart> TakeReexecMarker() {
  const char* value = std::getenv(kReexecMarker);
  if (value == nullptr) return std::nullopt;
  absl::string_view marker = value;
  BlasStart start;
  start.timeout_from_environment = absl::ConsumeSuffix(&marker, kTimeoutFromEnvironment);
  absl::ConsumeSuffix(&marker, kTimeoutDefault);
  start.threads_source = std::string(marker);
  unsetenv(kReexecMarker);  // after the last use of value, which points into the environment
  return start;
}

std::string OpenBlasEnv() {
  const char* value = std::getenv("OPENBLAS_NUM_THREADS");
  return value == nullptr ? "" : value;
}

std::string BlasTimeoutLine(bool from_environment) {
  const char* value = std::getenv(kTimeoutVariable);
  if (value == nullptr) {
    return absl::StrCat("OpenBLAS's idle threads: ", kTimeoutVariable,
                        " unset (OpenBLAS's default: they spin for 2^28 cycles after each "
                        "product; Note [OpenBLAS's idle threads])");
  }
  return absl::StrCat(
      "OpenBLAS's idle threads: ", kTimeoutVariable, "=", value,
      from_environment
          ? " (from the environment)"
          : absl::StrCat(" (gradserve's default: they sleep after 2^", kBlasThreadTimeout,
                         " cycles without work, not OpenBLAS's 2^28; Note "
                         "[OpenBLAS's idle threads])"));
}

std::optional<std::string> ReexecWithBlasThreads(int threads, const std::string& source,
                                                 char** argv) {
  const std::string wanted = absl::StrCat(threads);
  const bool timeout_set = std::getenv(kTimeoutVariable) != nullptr;
  if (OpenBlasEnv() == wanted && timeout_set) return std::nullopt;
  const std::string marker =
      absl::StrCat(source, timeout_set ? kTimeoutFromEnvironment : kTimeoutDefault);
  if (setenv("OPENBLAS_NUM_THREADS", wanted.c_str(), 1) != 0 ||
      (!timeout_set &&
       setenv(kTimeoutVariable, absl::StrCat(kBlasThreadTimeout).c_str(), 1) != 0) ||
      setenv(kReexecMarker, marker.c_str(), 1) != 0) {
    return absl::StrCat("cannot set OPENBLAS_NUM_THREADS and ", kTimeoutVariable, ": ",
                        std::strerror(errno));
  }
  // The binary's own path, not /proc/self/exe: the kernel names the process (comm, which ps,
  // top and pkill show) after the file executed.
  std::string path = "/proc/self/exe";
  char buffer[4096];
  if (const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
      n > 0 && access(std::string(buffer, static_cast<size_t>(n)).c_str(), X_OK) == 0) {
    path.assign(buffer, static_cast<size_t>(n));
  }
  execv(path.c_str(), argv);  // returns only on failure
  const std::string error = std::strerror(errno);
  unsetenv(kReexecMarker);
  return absl::StrCat("could not re-execute to start OpenBLAS with ", threads,
                      " threads (Note [OpenBLAS's threads]): ", error,
                      "; it keeps the threads and idle spin it started with");
}

}  // namespace gradserve::server
