// ParallelBlocks and the kernels that share long loops with it (Note [Intra-op parallelism] in
// engine/util/parallel.h): every chunk runs once, errors and the caller's deadline reach the
// caller, and a split sum gives the same bits whatever the thread count.

#include "engine/util/parallel.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/tensor.h"
#include "engine/util/cancellation.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

// Sets the intra-op thread count for one test, then puts the old one back.
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int threads) : previous_(gradserve::IntraOpThreads()) {
    SetIntraOpThreads(threads);
  }
  ~IntraOpThreads() { SetIntraOpThreads(previous_); }

 private:
  const int previous_;
};

TEST(ParallelBlocksTest, ChunksDependOnTheLengthAlone) {
  EXPECT_EQ(ParallelChunks(0), 1);
  EXPECT_EQ(ParallelChunks(kParallelMinUnits - 1), 1);
  EXPECT_EQ(ParallelChunks(kParallelMinUnits), kParallelMinUnits / kParallelChunk);
  EXPECT_EQ(ParallelChunks(kParallelMinUnits + 1), kParallelMinUnits / kParallelChunk + 1);
}

TEST(ParallelBlocksTest, EveryChunkRunsOnceOverTheWholeRange) {
  for (int threads : {1, 2, 4}) {
    IntraOpThreads scope(threads);
    for (int64_t n : {int64_t{0}, int64_t{1000}, kParallelMinUnits, 5 * kParallelChunk + 17}) {
      std::vector<std::atomic<int>> covered(static_cast<size_t>(n));
      std::mutex mutex;
      std::set<int64_t> chunks;
      std::set<std::thread::id> ran_on;
      ParallelBlocks(n, [&](int64_t chunk, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) covered[static_cast<size_t>(i)].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        EXPECT_TRUE(chunks.insert(chunk).second) << "chunk " << chunk << " ran twice";
        EXPECT_EQ(begin, chunk * (ParallelChunks(n) == 1 ? 0 : kParallelChunk));
        ran_on.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(covered[static_cast<size_t>(i)].load(), 1) << i;
      EXPECT_EQ(static_cast<int64_t>(chunks.size()), n == 0 ? 0 : ParallelChunks(n));
      EXPECT_LE(static_cast<int>(ran_on.size()), threads);
    }
  }
}

TEST(ParallelBlocksTest, TheFirstErrorReachesTheCallerAndLaterChunksAreSkipped) {
  IntraOpThreads scope(4);
  const int64_t n = 64 * kParallelChunk;
  std::atomic<int> ran{0};
  try {
    ParallelBlocks(n, [&](int64_t chunk, int64_t, int64_t) {
      ran.fetch_add(1);
      // Chunk 0 is the first claimed; the others take long enough for the failure to be seen.
      if (chunk == 0) ThrowStatus(absl::InvalidArgumentError("chunk zero failed"));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
    FAIL() << "no error";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), absl::InvalidArgumentError("chunk zero failed"));
  }
  // The threads busy with a chunk when chunk 0 failed finish it; the rest are skipped.
  EXPECT_LT(ran.load(), 32);
  // The helpers are free again: the next loop runs every chunk.
  std::atomic<int> next{0};
  ParallelBlocks(n, [&](int64_t, int64_t, int64_t) { next.fetch_add(1); });
  EXPECT_EQ(next.load(), 64);
}

TEST(ParallelBlocksTest, HelpersWorkUnderTheCallersToken) {
  IntraOpThreads scope(4);
  CancellationToken token;
  CancellationScope current(&token);
  std::atomic<int> wrong{0};
  ParallelBlocks(16 * kParallelChunk, [&](int64_t, int64_t, int64_t) {
    if (CurrentCancellationToken() != &token) wrong.fetch_add(1);
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ParallelBlocksTest, AnExpiredDeadlineStopsASplitKernel) {
  IntraOpThreads scope(4);
  const Tensor x = Tensor::Full({8 * kParallelChunk}, 1.0, DType::kFloat32);
  CancellationToken token(absl::Now() - absl::Seconds(1));
  CancellationScope current(&token);
  try {
    ops::exp(x);
    FAIL() << "the kernel ran to its end";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
}

TEST(ParallelBlocksTest, ManyCallersAtOnceEachGetTheirOwnResult) {
  IntraOpThreads scope(3);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      const Tensor x = Tensor::Full({3 * kParallelChunk + 5}, t, DType::kFloat64);
      for (int round = 0; round < 5; ++round) {
        const Tensor y = ops::mul(x, 2.0);
        const double total = ops::sum(y).item();
        if (total != 2.0 * t * static_cast<double>(x.numel())) bad.fetch_add(1);
      }
    });
  }
  for (std::thread& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

// Values whose float32 sum depends on the order of the additions.
Tensor Uneven(int64_t n) {
  Tensor t = Tensor::Empty({n}, DType::kFloat32);
  float* data = t.data<float>();
  uint64_t state = 12345;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(state >> 11) * 0x1.0p-53;
    data[i] = static_cast<float>((u - 0.5) * (i % 7 == 0 ? 1e6 : 1.0));
  }
  return t;
}

TEST(ParallelKernelsTest, TheSameBitsWhateverTheThreads) {
  const Tensor x = Uneven(9 * kParallelChunk + 123);
  const Tensor broadcast = Tensor::Full({}, 0.75, DType::kFloat32);
  std::vector<float> sums;
  std::vector<Tensor> products;
  for (int threads : {1, 2, 3, 8}) {
    IntraOpThreads scope(threads);
    sums.push_back(static_cast<float>(ops::sum(x).item()));
    products.push_back(ops::mul(ops::sin(x), ops::expand(broadcast, x.shape())));
  }
  for (size_t i = 1; i < sums.size(); ++i) {
    EXPECT_EQ(std::memcmp(&sums[i], &sums[0], sizeof(float)), 0) << sums[i] << " " << sums[0];
    EXPECT_EQ(
        std::memcmp(products[i].data<float>(), products[0].data<float>(), products[0].nbytes()), 0);
  }
  // And the sum is the float32 rounding of the exact one, within the double accumulator's error.
  double exact = 0;
  for (int64_t i = 0; i < x.numel(); ++i) exact += x.data<float>()[i];
  EXPECT_NEAR(sums[0], exact, std::abs(exact) * 1e-6 + 1e-3);
}

}  // namespace
}  // namespace gradserve
