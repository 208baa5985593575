// Note [Sizing the server's threads]: workers and BLAS threads from the flags, else from the
// cgroup's quota rounded up and the affinity mask, each with its source.

#include "server/process/cpu_sizing.h"

#include "engine/util/parallel.h"
#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

CgroupLimits Quota(double cpus) {
  CgroupLimits limits;
  limits.cpus = cpus;
  limits.cpu_source = "cgroup cpu.max";
  return limits;
}

TEST(CpuSizingTest, QuotaRoundedUpBelowTheAffinityMask) {
  const CpuSizing sizing = SizeCpus(Quota(1.5), 16, {});
  EXPECT_EQ(sizing.cpus.value, 2);
  EXPECT_EQ(sizing.cpus.source, "cgroup cpu.max");
  EXPECT_EQ(sizing.worker_threads.value, 2);
  EXPECT_EQ(sizing.blas_threads.value, 2);
  EXPECT_EQ(CpuLine(sizing, 16),
            "cpus: 2 (cgroup cpu.max; 16 in the affinity mask); engine workers 2 (cpus), BLAS "
            "threads 2 (cpus), intra-op threads 2 (cpus)");
  EXPECT_EQ(SizeCpus(Quota(4.0), 16, {}).cpus.value, 4);  // exact quotas stay exact
  EXPECT_EQ(SizeCpus(Quota(0.1), 16, {}).cpus.value, 1);  // at least one
}

TEST(CpuSizingTest, TheAffinityMaskBoundsTheQuota) {
  const CpuSizing sizing = SizeCpus(Quota(8), 2, {});
  EXPECT_EQ(sizing.cpus.value, 2);
  EXPECT_EQ(sizing.cpus.source, "affinity: 2 CPUs");
  EXPECT_EQ(CpuLine(sizing, 2),
            "cpus: 2 (affinity: 2 CPUs); engine workers 2 (cpus), BLAS threads 2 (cpus), "
            "intra-op threads 2 (cpus)");
  EXPECT_EQ(SizeCpus(CgroupLimits{}, 3, {}).cpus.value, 3);  // no quota
  EXPECT_EQ(SizeCpus(Quota(1e300), 3, {}).cpus.value, 3);    // no overflow
}

TEST(CpuSizingTest, FlagsWinThenTheOperatorsOpenBlasVariable) {
  CpuSizing sizing = SizeCpus(Quota(1), 16, {/*worker_threads=*/6, /*blas_threads=*/3, "5"});
  EXPECT_EQ(sizing.worker_threads.value, 6);
  EXPECT_EQ(sizing.worker_threads.source, "--worker_threads");
  EXPECT_EQ(sizing.blas_threads.value, 3);
  EXPECT_EQ(sizing.blas_threads.source, "--blas_threads");
  EXPECT_EQ(sizing.intra_op_threads.value, 1);  // the quota's one CPU
  EXPECT_EQ(sizing.intra_op_threads.source, "cpus");
  sizing = SizeCpus(Quota(1), 16, {0, 0, "5"});
  EXPECT_EQ(sizing.blas_threads.value, 5);
  EXPECT_EQ(sizing.blas_threads.source, "OPENBLAS_NUM_THREADS");
  sizing = SizeCpus(Quota(1), 16, {0, 0, "", /*intra_op_threads=*/4});
  EXPECT_EQ(sizing.intra_op_threads.value, 4);
  EXPECT_EQ(sizing.intra_op_threads.source, "--intra_op_threads");
  EXPECT_EQ(SizeCpus(Quota(1), 16, {0, 0, "", 1000}).intra_op_threads.value, kMaxIntraOpThreads);
  for (const char* ignored : {"", "0", "-2", "many"}) {
    sizing = SizeCpus(Quota(1), 16, {0, 0, ignored});
    EXPECT_EQ(sizing.blas_threads.value, 1) << ignored;
    EXPECT_EQ(sizing.blas_threads.source, "cpus") << ignored;
  }
}

}  // namespace
}  // namespace gradserve::server
