#include "server/process/cpu_sizing.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/util/parallel.h"

namespace gradserve::server {

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

CpuSizing SizeCpus(const CgroupLimits& cgroup, int affinity_cpus, const CpuFlags& flags) {
  CpuSizing sizing;
  sizing.cpus = {std::max(1, affinity_cpus), absl::StrCat("affinity: ", affinity_cpus, " CPUs")};
  if (cgroup.cpus.has_value()) {
    // At most the affinity's count, so the cast cannot overflow.
    const double quota = std::min(*cgroup.cpus, static_cast<double>(affinity_cpus));
    const int rounded_up = std::max(1, static_cast<int>(std::ceil(quota - 1e-9)));
    if (rounded_up < sizing.cpus.value) sizing.cpus = {rounded_up, cgroup.cpu_source};
  }
  sizing.worker_threads = flags.worker_threads > 0 ? Sized{flags.worker_threads, "--worker_threads"}
                                                   : Sized{sizing.cpus.value, "cpus"};
  int from_env = 0;
  if (flags.blas_threads > 0) {
    sizing.blas_threads = {flags.blas_threads, "--blas_threads"};
  } else if (absl::SimpleAtoi(absl::StripAsciiWhitespace(flags.openblas_env), &from_env) &&
             from_env > 0) {
    sizing.blas_threads = {from_env, "OPENBLAS_NUM_THREADS"};
  } else {
    sizing.blas_threads = {sizing.cpus.value, "cpus"};
  }
  sizing.intra_op_threads =
      flags.intra_op_threads > 0
          ? Sized{std::min(flags.intra_op_threads, kMaxIntraOpThreads), "--intra_op_threads"}
          : Sized{std::min(sizing.cpus.value, kMaxIntraOpThreads), "cpus"};
  return sizing;
}

std::string CpuLine(const CpuSizing& sizing, int affinity_cpus) {
  std::string cpus = absl::StrCat("cpus: ", sizing.cpus.value, " (", sizing.cpus.source);
  if (!absl::StartsWith(sizing.cpus.source, "affinity")) {
    absl::StrAppend(&cpus, "; ", affinity_cpus, " in the affinity mask");
  }
  return absl::StrCat(cpus, "); engine workers ", sizing.worker_threads.value, " (",
                      sizing.worker_threads.source, "), BLAS threads ", sizing.blas_threads.value,
                      " (", sizing.blas_threads.source, "), intra-op threads ",
                      sizing.intra_op_threads.value, " (", sizing.intra_op_threads.source, ")");
}

}  // namespace gradserve::server
