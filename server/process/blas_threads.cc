#include "server/process/blas_threads.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace gradserve::server {

std::optional<std::string> TakeReexecMarker() {
  const char* value = std::getenv(kReexecMarker);
  if (value == nullptr) return std::nullopt;
  std::string source = value;
  unsetenv(kReexecMarker);
  return source;
}

std::string OpenBlasEnv() {
  const char* value = std::getenv("OPENBLAS_NUM_THREADS");
  return value == nullptr ? "" : value;
}

std::optional<std::string> ReexecWithBlasThreads(int threads, const std::string& source,
                                                 char** argv) {
  const std::string wanted = absl::StrCat(threads);
  if (OpenBlasEnv() == wanted) return std::nullopt;
  if (setenv("OPENBLAS_NUM_THREADS", wanted.c_str(), 1) != 0 ||
      setenv(kReexecMarker, source.c_str(), 1) != 0) {
    return absl::StrCat("cannot set OPENBLAS_NUM_THREADS: ", std::strerror(errno));
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
                      "; it keeps the threads it started with");
}

}  // namespace gradserve::server
