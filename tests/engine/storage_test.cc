// Storage over adopted memory (Note [Adopted storage]) and the big-block cache of the host
// allocator (Note [Big host blocks]).

#include "engine/tensor/storage.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

std::shared_ptr<std::string> Bytes(const std::vector<float>& values, size_t offset = 0) {
  auto s = std::make_shared<std::string>(offset + values.size() * sizeof(float), '\0');
  std::memcpy(s->data() + offset, values.data(), values.size() * sizeof(float));
  return s;
}

TEST(AdoptedStorageTest, TensorUsesTheBytesInPlaceAndKeepsTheirOwnerAlive) {
  std::shared_ptr<std::string> owner = Bytes({1, 2, 3, 4});
  std::weak_ptr<std::string> watch = owner;
  char* data = owner->data();
  Tensor t = Tensor::FromExternal({2, 2}, DType::kFloat32, data, std::move(owner));
  EXPECT_TRUE(t.storage()->adopted());
  EXPECT_EQ(t.raw_data(), data);
  EXPECT_EQ(t.data<float>()[3], 4);
  EXPECT_FALSE(watch.expired());
  Tensor view = t.detach();
  t = Tensor();
  EXPECT_FALSE(watch.expired());  // the view still holds the storage
  view = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(AdoptedStorageTest, MisalignedBytesAreCopied) {
  std::shared_ptr<std::string> owner = Bytes({5, 6, 7}, /*offset=*/1);
  std::weak_ptr<std::string> watch = owner;
  char* data = owner->data() + 1;  // odd address: not aligned for float
  Tensor t = Tensor::FromExternal({3}, DType::kFloat32, data, std::move(owner));
  EXPECT_FALSE(t.storage()->adopted());
  EXPECT_NE(t.raw_data(), data);
  EXPECT_EQ(t.data<float>()[0], 5);
  EXPECT_EQ(t.data<float>()[2], 7);
  EXPECT_TRUE(watch.expired());  // the copy does not keep the owner
}

TEST(AdoptedStorageTest, AdoptedBytesAreChargedToTheBudget) {
  auto budget = MemoryBudget::Make(/*limit_bytes=*/20);
  MemoryBudgetScope scope(budget);
  std::shared_ptr<std::string> owner = Bytes({1, 2, 3, 4});
  {
    Tensor t = Tensor::FromExternal({4}, DType::kFloat32, owner->data(), owner);
    EXPECT_EQ(budget->used(), 16);
  }
  EXPECT_EQ(budget->used(), 0);
  std::shared_ptr<std::string> big = Bytes(std::vector<float>(8));
  std::weak_ptr<std::string> watch = big;
  char* data = big->data();
  try {
    Tensor::FromExternal({8}, DType::kFloat32, data, std::move(big));
    ADD_FAILURE() << "32 bytes over a 20-byte budget were adopted";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(budget->used(), 0);
  EXPECT_TRUE(watch.expired());  // a refused adoption lets go of the owner
}

// Note [A budget outlives its charges]: tensors and Nodes keep a plain pointer to their
// budget, which lives until the last of its owners and charges is gone, whichever order they
// go in. Under ASan a budget freed too early is a use after free, and one never freed a leak.
TEST(BudgetLifetimeTest, ATensorOutlivesEveryOwnerOfItsBudget) {
  auto parent = MemoryBudget::Make(/*limit_bytes=*/1000, nullptr, "parent limit");
  std::optional<Tensor> t;
  {
    MemoryBudgetScope scope(MemoryBudget::Make(/*limit_bytes=*/100, parent, "child limit"));
    t = Tensor::Zeros({8}, DType::kFloat32);
    Tensor empty = Tensor::Empty({0}, DType::kFloat32);  // charges nothing, holds nothing
    EXPECT_EQ(CurrentMemoryBudget()->used(), 32);
  }
  // The child's only owner, the scope, is gone; the tensor's charge keeps it alive.
  EXPECT_EQ(parent->used(), 32);
  EXPECT_EQ(t->data<float>()[7], 0);
  t.reset();
  EXPECT_EQ(parent->used(), 0);
}

TEST(BudgetLifetimeTest, OwnersAndChargesMayGoInAnyOrder) {
  std::vector<Tensor> tensors;
  std::shared_ptr<MemoryBudget> budget = MemoryBudget::Make();
  {
    MemoryBudgetScope scope(budget);
    for (int i = 0; i < 4; ++i) tensors.push_back(Tensor::Zeros({4}, DType::kFloat64));
  }
  tensors.erase(tensors.begin());
  EXPECT_EQ(budget->used(), 3 * 32);
  budget.reset();
  tensors.clear();  // the last charge deletes the budget
}

TEST(BudgetLifetimeTest, AChargeNoBudgetCanCountIsRefused) {
  auto budget = MemoryBudget::Make();
  absl::Status s = budget->TryCharge(MemoryBudget::kMaxChargeBytes + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("more than any budget counts"), std::string::npos) << s;
  EXPECT_EQ(budget->used(), 0);
  EXPECT_THROW(budget->Charge(INT64_MAX), StatusError);
  EXPECT_EQ(budget->used(), 0);
}

TEST(BigBlockTest, FreedBigBlocksAreReusedAndAligned) {
  constexpr int64_t kElements = int64_t{3} << 20;  // 12 MiB of float32
  void* first = nullptr;
  {
    Tensor t = Tensor::Empty({kElements}, DType::kFloat32);
    first = t.raw_data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    t.data<float>()[kElements - 1] = 1;  // the whole block is usable
  }
  Tensor again = Tensor::Empty({kElements}, DType::kFloat32);
  EXPECT_EQ(again.raw_data(), first);
  Tensor other = Tensor::Zeros({kElements}, DType::kFloat32);  // a new block, zeroed by Zeros
  EXPECT_NE(other.raw_data(), first);
  EXPECT_EQ(other.data<float>()[kElements - 1], 0);
}

// The host allocator's count (Allocator::memory_stats): what it handed out, and reserved
// with the big blocks cached for reuse (Note [Big host blocks]).
TEST(CpuAllocatorTest, CountsTheBytesItHoldsAndCaches) {
  Allocator* cpu = CpuAllocator();
  const MemoryStats before = *cpu->memory_stats();
  EXPECT_EQ(before.peak_allocated_bytes, -1);  // not kept: the count is sharded by thread
  constexpr size_t kSmall = 1000, kBig = size_t{3} << 20;  // malloc's, and a big block
  void* small = cpu->Allocate(kSmall);
  void* big = cpu->Allocate(kBig);
  const MemoryStats held = *cpu->memory_stats();
  EXPECT_EQ(held.allocated_bytes - before.allocated_bytes, int64_t{kSmall + kBig});
  EXPECT_GE(held.reserved_bytes, held.allocated_bytes);
  cpu->Deallocate(big, kBig);
  cpu->Deallocate(small, kSmall);
  const MemoryStats after = *cpu->memory_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  // The big block, rounded to 2 MiB pages, is kept for reuse: reserved, not allocated.
  EXPECT_GE(after.reserved_bytes - after.allocated_bytes, int64_t{4} << 20);
}

}  // namespace
}  // namespace gradserve
