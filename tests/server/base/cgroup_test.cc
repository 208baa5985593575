// Note [Reading the cgroup]: CPU quota and memory limit from fake cgroup files, v2 and v1;
// missing files are no limit, garbage is no limit and a warning, never a crash.

#include "server/base/cgroup.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CgroupTest, V2QuotaIsCpuTimePerPeriod) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/\n");
  cgroup.Write("/fs/cpu.max", "150000 100000\n");
  cgroup.Write("/fs/memory.max", "536870912\n");
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  ASSERT_TRUE(limits.cpus.has_value());
  EXPECT_DOUBLE_EQ(*limits.cpus, 1.5);
  EXPECT_EQ(limits.cpu_source, "cgroup cpu.max 150000 100000");
  EXPECT_EQ(limits.memory_bytes, 536870912);
  EXPECT_EQ(limits.memory_source, "cgroup memory.max");
  EXPECT_THAT(limits.warnings, IsEmpty());
}

TEST(CgroupTest, V2MaxIsNoLimit) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/\n");
  cgroup.Write("/fs/cpu.max", "max 100000\n");
  cgroup.Write("/fs/memory.max", "max\n");
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_FALSE(limits.cpus.has_value());
  EXPECT_FALSE(limits.memory_bytes.has_value());
  EXPECT_THAT(limits.warnings, IsEmpty());
}

TEST(CgroupTest, V2SmallestOfTheCgroupAndItsAncestors) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/pods/app\n");
  cgroup.Write("/fs/pods/app/cpu.max", "max 100000\n");
  cgroup.Write("/fs/pods/cpu.max", "400000 100000\n");
  cgroup.Write("/fs/cpu.max", "800000 100000\n");
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_EQ(limits.cpus, 4.0);
  EXPECT_EQ(limits.cpu_source, "cgroup cpu.max 400000 100000");
}

TEST(CgroupTest, V1CpuAndMemoryHierarchies) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "5:cpu,cpuacct:/job\n4:memory:/job\n0::/\n");
  cgroup.Write("/fs/cpu,cpuacct/job/cpu.cfs_quota_us", "50000\n");
  cgroup.Write("/fs/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
  cgroup.Write("/fs/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  cgroup.Write("/fs/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  cgroup.Write("/fs/memory/job/memory.limit_in_bytes", "1073741824\n");
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_EQ(limits.cpus, 0.5);
  EXPECT_EQ(limits.cpu_source, "cgroup cpu.cfs_quota_us 50000 / cpu.cfs_period_us 100000");
  EXPECT_EQ(limits.memory_bytes, 1073741824);
  EXPECT_EQ(limits.memory_source, "cgroup memory.limit_in_bytes");
  EXPECT_THAT(limits.warnings, IsEmpty());
}

TEST(CgroupTest, V1CpuMountedAsCpu) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "1:cpu:/\n");
  cgroup.Write("/fs/cpu/cpu.cfs_quota_us", "200000\n");
  cgroup.Write("/fs/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(server::ReadCgroup(cgroup.paths()).cpus, 2.0);
}

TEST(CgroupTest, MissingFilesAreNoLimit) {
  FakeCgroup cgroup;  // nothing written: no /proc/self/cgroup, no cgroup files
  server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_FALSE(limits.cpus.has_value());
  EXPECT_FALSE(limits.memory_bytes.has_value());
  EXPECT_THAT(limits.warnings, IsEmpty());
  limits = server::ReadCgroup({"/nonexistent", "/nonexistent"});
  EXPECT_FALSE(limits.cpus.has_value());
  EXPECT_FALSE(limits.memory_bytes.has_value());
}

TEST(CgroupTest, GarbageIsIgnoredWithAWarning) {
  const char* const garbage[] = {"banana",      "100000",   "0 100000",
                                 "-5 100000",   "100000 0", "1 2 3",
                                 "max",         "",         "99999999999999999999999 100000",
                                 "\x01\xff\n 1"};
  for (const char* text : garbage) {
    FakeCgroup cgroup;
    cgroup.Write("/self", "0::/\n");
    cgroup.Write("/fs/cpu.max", text);
    cgroup.Write("/fs/memory.max", text);
    const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
    EXPECT_FALSE(limits.cpus.has_value()) << text;
    // "max" is a memory.max of its own, and "100000" a memory limit.
    if (std::string(text) == "max") {
      EXPECT_THAT(limits.warnings, ElementsAre(HasSubstr("cpu.max"))) << text;
      continue;
    }
    if (std::string(text) == "100000") {
      EXPECT_EQ(limits.memory_bytes, 100000);
      EXPECT_THAT(limits.warnings, ElementsAre(HasSubstr("cpu.max"))) << text;
      continue;
    }
    EXPECT_FALSE(limits.memory_bytes.has_value()) << text;
    ASSERT_EQ(limits.warnings.size(), 2u) << text;
    EXPECT_THAT(limits.warnings[0], AllOf(HasSubstr("cgroup: ignored"), HasSubstr("cpu.max"),
                                          HasSubstr("not a limit")));
    EXPECT_THAT(limits.warnings[1], HasSubstr("memory.max"));
  }
  // v1: a quota of 0, or a period that is not there.
  FakeCgroup cgroup;
  cgroup.Write("/self", "3:cpu:/\n");
  cgroup.Write("/fs/cpu/cpu.cfs_quota_us", "50000\n");
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_FALSE(limits.cpus.has_value());
  EXPECT_THAT(limits.warnings, ElementsAre(HasSubstr("cpu.cfs_quota_us")));
}

TEST(CgroupTest, AHugeFileIsReadOnlyInPart) {
  FakeCgroup cgroup;
  cgroup.Write("/self", "0::/\n");
  cgroup.Write("/fs/cpu.max", std::string(1 << 20, '7'));
  const server::CgroupLimits limits = server::ReadCgroup(cgroup.paths());
  EXPECT_FALSE(limits.cpus.has_value());
  ASSERT_EQ(limits.warnings.size(), 1u);
  EXPECT_LT(limits.warnings[0].size(), 400u);  // quoted cut
}

}  // namespace
}  // namespace gradserve::testing
