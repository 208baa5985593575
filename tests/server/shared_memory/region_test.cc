// Shared memory's lower parts (server/shared_memory): the guarded copy, a region's keys, ranges
// and shrinking, and the registry's tenants, bounds, TTL and memory charge; no server.

#include "server/shared_memory/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/tensor/memory_budget.h"
#include "gtest/gtest.h"
#include "server/shared_memory/guarded_copy.h"
#include "server/shared_memory/registry.h"

namespace gradserve::testing {
namespace {

using server::GuardedCopy;
using server::SharedMemoryOptions;
using server::SharedMemoryRegion;
using server::SharedMemoryRegistry;

constexpr char kPrefix[] = "/gradserve_rtest";

// A shared-memory object for one test, unlinked when destroyed.
class Object {
 public:
  explicit Object(int64_t size) {
    static std::atomic<int> counter{0};
    key_ = absl::StrCat(kPrefix, "_", getpid(), "_", counter.fetch_add(1));
    fd_ = shm_open(key_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0) << key_;
    Resize(size);
  }
  ~Object() {
    close(fd_);
    shm_unlink(key_.c_str());
  }
  void Resize(int64_t size) { EXPECT_EQ(ftruncate(fd_, size), 0); }
  const std::string& key() const { return key_; }
  int fd() const { return fd_; }

 private:
  std::string key_;
  int fd_ = -1;
};

TEST(GuardedCopyTest, APageGoneUnderTheCopyIsAnErrorNotACrash) {
  const long page = sysconf(_SC_PAGESIZE);
  Object object(4 * page);
  char* base = static_cast<char*>(
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, object.fd(), 0));
  ASSERT_NE(base, MAP_FAILED);
  std::memset(base, 7, 4 * page);
  std::vector<char> buffer(4 * page);
  ASSERT_TRUE(GuardedCopy(buffer.data(), base, buffer.size()).ok());
  EXPECT_EQ(buffer[4 * page - 1], 7);

  object.Resize(page);  // the client shrinks its object: pages 1 to 3 are gone
  const absl::Status read = GuardedCopy(buffer.data(), base, buffer.size());
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  const absl::Status write = GuardedCopy(base, buffer.data(), buffer.size());
  EXPECT_EQ(write.code(), absl::StatusCode::kDataLoss) << write;
  // The handler is left in place and the thread keeps working: again, and within the page left.
  EXPECT_EQ(GuardedCopy(buffer.data(), base + page, page).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(GuardedCopy(buffer.data(), base, page).ok());
  munmap(base, 4 * page);
}

TEST(GuardedCopyTest, ASplitCopyIsWholeAndEachThreadsFaultIsCaught) {
  const int64_t size = int64_t{40} << 20;  // split over threads (Note [Copies split over threads])
  Object object(size);
  char* base =
      static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, object.fd(), 0));
  ASSERT_NE(base, MAP_FAILED);
  std::vector<char> buffer(size);
  for (int64_t i = 0; i < size; ++i) buffer[i] = static_cast<char>(i * 7 + i / 4096);
  ASSERT_TRUE(server::SplitGuardedCopy(base, buffer.data(), size).ok());
  std::vector<char> back(size);
  ASSERT_TRUE(server::SplitGuardedCopy(back.data(), base, size).ok());
  EXPECT_TRUE(back == buffer);
  // Every piece past the first page faults, on its own thread.
  object.Resize(4096);
  EXPECT_EQ(server::SplitGuardedCopy(back.data(), base, size).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(server::SplitGuardedCopy(base, buffer.data(), size).code(),
            absl::StatusCode::kDataLoss);
  munmap(base, size);
}

TEST(GuardedCopyTest, AFillRepeatsItsElementWholeAndItsFaultsAreCaught) {
  const int64_t size = int64_t{40} << 20;  // split over threads, as the copy
  Object object(size);
  char* base =
      static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, object.fd(), 0));
  ASSERT_NE(base, MAP_FAILED);
  // Elements start at element and at element + 1: 9 bytes are read at most.
  const unsigned char element[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (size_t width : {1, 2, 4, 8}) {
    // The whole object, then a short range within it that leaves its neighbours as they are.
    ASSERT_TRUE(server::SplitGuardedFill(base, element, width, size).ok()) << width;
    bool whole = true;
    for (int64_t i = 0; i < size && whole; ++i) {
      whole = static_cast<unsigned char>(base[i]) == element[i % width];
    }
    EXPECT_TRUE(whole) << width;
    std::memset(base, 0, 64);
    ASSERT_TRUE(server::SplitGuardedFill(base + 8, element + 1, width, 5 * 8).ok());
    EXPECT_EQ(base[7], 0);
    EXPECT_EQ(base[8], element[1]);
    EXPECT_EQ(base[8 + 5 * 8 - 1], element[1 + (width - 1)]);
    EXPECT_EQ(base[8 + 5 * 8], 0);
  }
  // Elements that do not tile the bytes or a page are refused, nothing written.
  EXPECT_EQ(server::SplitGuardedFill(base, element, 3, 12).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(server::SplitGuardedFill(base, element, 4, 10).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(server::SplitGuardedFill(base, element, 0, 0).code(), absl::StatusCode::kInternal);
  object.Resize(4096);
  EXPECT_EQ(server::SplitGuardedFill(base, element, 4, size).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(server::SplitGuardedFill(base, element, 4, 4096).ok());
  munmap(base, size);
}

TEST(RegionTest, KeysMustBeSharedMemoryNamesWithinThePrefix) {
  EXPECT_TRUE(server::CheckSharedMemoryKey("/gradserve_a", "/gradserve").ok());
  for (const char* bad :
       {"", "/", "gradserve_a", "/gradserve/../etc/passwd", "/gradserve/a", "/other_a"}) {
    const absl::Status s = server::CheckSharedMemoryKey(bad, "/gradserve");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(
      server::CheckSharedMemoryKey(std::string(300, 'g').insert(0, "/gradserve"), "/gradserve")
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server::CheckSharedMemoryKey("/gradserve_a", "").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RegionTest, OpenRefusesMissingSmallAndMalformedObjects) {
  Object object(100);
  auto open = [&](const std::string& key, int64_t size) {
    return SharedMemoryRegion::Open("r", key, kPrefix, size, /*writable=*/false).status();
  };
  absl::Status missing = open(absl::StrCat(kPrefix, "_missing_", getpid()), 10);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("No such file"), std::string::npos) << missing;
  absl::Status small = open(object.key(), 101);
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("has 100 bytes, fewer than the 101"), std::string::npos) << small;
  EXPECT_EQ(open(object.key(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(open("/elsewhere", 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(open(object.key(), 100).ok());
}

TEST(RegionTest, RangesOutsideTheRegionAndShrunkObjectsAreInvalidArgument) {
  Object object(64);
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Open("buf", object.key(), kPrefix, 64, /*writable=*/true);
  ASSERT_TRUE(region.ok()) << region.status();
  const SharedMemoryRegion& r = **region;
  EXPECT_TRUE(r.CheckRange(0, 64, "leaf 'x'").ok());
  EXPECT_TRUE(r.CheckRange(64, 0, "leaf 'x'").ok());
  for (auto [offset, size] : std::vector<std::pair<int64_t, int64_t>>{
           {-1, 4}, {0, 65}, {61, 4}, {65, 0}, {8, -1}, {INT64_MAX, 2}, {2, INT64_MAX}}) {
    const absl::Status s = r.CheckRange(offset, size, "leaf 'x'");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << offset << " " << size;
    EXPECT_NE(s.message().find("leaf 'x': range"), std::string::npos) << s;
  }
  char buffer[64] = {};
  EXPECT_TRUE(r.Write(0, "abcd", 4, "gradient").ok());
  EXPECT_TRUE(r.Read(0, 4, buffer, "leaf").ok());
  EXPECT_EQ(std::string(buffer, 4), "abcd");

  object.Resize(16);
  const absl::Status shrunk = r.Read(0, 64, buffer, "leaf 'x'");
  EXPECT_EQ(shrunk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shrunk.message().find("now has 16"), std::string::npos) << shrunk;
  EXPECT_EQ(r.Write(8, buffer, 32, "gradient").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Fill(8, "abcd", 4, 32, "gradient").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.Read(0, 16, buffer, "leaf").ok());  // what is left is still there
  EXPECT_TRUE(r.Fill(4, "xy", 2, 8, "gradient").ok());
  EXPECT_TRUE(r.Read(0, 16, buffer, "leaf").ok());
  EXPECT_EQ(std::string(buffer, 16), std::string("abcdxyxyxyxy", 12) + std::string(4, '\0'));
}

TEST(RegionTest, AReadOnlyRegionIsNeverWritten) {
  Object object(16);
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Open("in", object.key(), kPrefix, 16, /*writable=*/false);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->Write(0, "abcd", 4, "gradient").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*region)->Fill(0, "abcd", 4, 16, "gradient").code(),
            absl::StatusCode::kFailedPrecondition);
}

class RegistryTest : public ::testing::Test {
 protected:
  static SharedMemoryOptions Options() {
    SharedMemoryOptions o;
    o.prefix = kPrefix;
    o.max_per_tenant = 2;
    o.idle_ttl = absl::Seconds(30);
    return o;
  }
  absl::StatusOr<absl::Duration> Register(SharedMemoryRegistry& registry, const std::string& tenant,
                                          const std::string& name, const Object& object,
                                          absl::Duration ttl = absl::ZeroDuration()) {
    return registry.Register(tenant, name, object.key(), 64, true, ttl, budget_);
  }
  std::shared_ptr<MemoryBudget> budget_ = MemoryBudget::Make(1000);
};

TEST_F(RegistryTest, NamesAndObjectsAreTheirTenantsAlone) {
  SharedMemoryRegistry registry(Options());
  Object a(64), b(64);
  ASSERT_TRUE(Register(registry, "acme", "buf", a).ok());
  EXPECT_EQ(registry.size(), 1);
  EXPECT_EQ(registry.bytes(), 64);
  EXPECT_EQ(budget_->used(), 64);

  EXPECT_EQ(Register(registry, "acme", "buf", b).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Register(registry, "beta", "buf", b).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Register(registry, "beta", "mine", a).status().code(),
            absl::StatusCode::kPermissionDenied);  // acme's object
  EXPECT_EQ(registry.Use("beta", "buf", "leaf 'x'").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.Unregister("beta", "buf").code(), absl::StatusCode::kPermissionDenied);
  const absl::Status unknown = registry.Use("acme", "nope", "leaf 'x'").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("leaf 'x': shared-memory region 'nope' is not registered"),
            std::string::npos)
      << unknown;

  EXPECT_TRUE(registry.Unregister("acme", "buf").ok());
  EXPECT_EQ(registry.Unregister("acme", "buf").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.size(), 0);
  EXPECT_EQ(budget_->used(), 0);
  EXPECT_TRUE(Register(registry, "beta", "buf", a).ok());  // free for anyone again
}

TEST_F(RegistryTest, BoundsPerTenantAndOnTheBudget) {
  SharedMemoryRegistry registry(Options());
  Object a(64), b(64), c(64);
  ASSERT_TRUE(Register(registry, "acme", "1", a).ok());
  ASSERT_TRUE(Register(registry, "acme", "2", b).ok());
  const absl::Status third = Register(registry, "acme", "3", c).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max_shared_memory_regions"), std::string::npos) << third;
  EXPECT_TRUE(Register(registry, "beta", "3", c).ok());  // another tenant's count

  SharedMemoryRegistry small(Options());
  auto tiny = MemoryBudget::Make(32);
  const absl::Status over = small.Register("acme", "big", a.key(), 64, true, {}, tiny).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(tiny->used(), 0);
}

TEST_F(RegistryTest, AnIdleRegionEndsButOneInUseDoesNot) {
  SharedMemoryOptions options = Options();
  options.idle_ttl = absl::Milliseconds(100);  // the reaper looks every 25 ms
  SharedMemoryRegistry registry(options);
  Object a(64), b(64);
  absl::StatusOr<absl::Duration> ttl =
      Register(registry, "acme", "idle", a, absl::Milliseconds(50));
  ASSERT_TRUE(ttl.ok());
  EXPECT_EQ(*ttl, absl::Milliseconds(50));
  ASSERT_TRUE(Register(registry, "acme", "busy", b, absl::Milliseconds(50)).ok());
  {
    server::RequestRegions request(&registry, "acme");
    ASSERT_TRUE(request.Find("busy", "leaf").ok());
    absl::SleepFor(absl::Milliseconds(400));
    EXPECT_EQ(registry.size(), 1);  // "idle" ended; "busy" is held by the request
    EXPECT_EQ(registry.Use("acme", "idle", "leaf").status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(registry.size(), 0);
  EXPECT_EQ(budget_->used(), 0);
  // The server's TTL is the most a client gets, and what it gets without asking.
  absl::StatusOr<absl::Duration> capped = Register(registry, "acme", "long", a, absl::Hours(5));
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(*capped, absl::Milliseconds(100));
  absl::StatusOr<absl::Duration> given = Register(registry, "acme", "default", b);
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(*given, absl::Milliseconds(100));
}

TEST_F(RegistryTest, EndAllEndsEveryRegionAndRefusesNewOnes) {
  SharedMemoryRegistry registry(Options());
  Object a(64);
  ASSERT_TRUE(Register(registry, "acme", "buf", a).ok());
  registry.EndAll();
  EXPECT_EQ(registry.size(), 0);
  EXPECT_EQ(budget_->used(), 0);
  EXPECT_EQ(Register(registry, "acme", "buf", a).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RegistryTest, OffWithoutAPrefix) {
  SharedMemoryRegistry registry(SharedMemoryOptions{});
  Object a(64);
  const absl::Status off = Register(registry, "", "buf", a).status();
  EXPECT_EQ(off.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(off.message().find("--shared_memory_prefix"), std::string::npos) << off;
}

}  // namespace
}  // namespace gradserve::testing
