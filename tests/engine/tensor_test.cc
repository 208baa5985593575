#include "engine/tensor/tensor.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/working_buffer.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

TEST(ShapeTest, CheckedNumelRejectsNegativeAndOverflow) {
  EXPECT_EQ(*CheckedNumel({2, 3, 4}), 24);
  EXPECT_EQ(*CheckedNumel({}), 1);
  EXPECT_EQ(*CheckedNumel({int64_t{1} << 62, 8, 0}), 0);
  EXPECT_FALSE(CheckedNumel({2, -1}).ok());
  EXPECT_FALSE(CheckedNumel({int64_t{1} << 62, 8}).ok());
}

TEST(ShapeTest, Broadcast) {
  EXPECT_EQ(*BroadcastShapes({3, 1}, {4}), (Shape{3, 4}));
  EXPECT_FALSE(BroadcastShapes({3}, {4}).ok());
}

TEST(TensorTest, CopyConvertsAndWalksStrides) {
  Tensor t = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor transposed = t.AsStrided({3, 2}, {1, 3}, 0);
  EXPECT_FALSE(transposed.is_contiguous());
  Tensor packed = transposed.contiguous().To(DType::kFloat64);
  const double* d = packed.data<double>();
  EXPECT_EQ(d[0], 1);
  EXPECT_EQ(d[1], 4);
  EXPECT_EQ(d[2], 2);
  EXPECT_EQ(d[5], 6);
}

// The flag each TensorImpl keeps from its shape and strides at construction.
TEST(TensorTest, ContiguityIsKeptFromShapeAndStrides) {
  Tensor t = Tensor::Empty({2, 3, 4}, DType::kFloat32);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(Tensor::Empty({}, DType::kFloat32).is_contiguous());
  EXPECT_TRUE(Tensor::Empty({0, 3}, DType::kFloat32).is_contiguous());
  EXPECT_FALSE(t.AsStrided({3, 2}, {1, 3}, 0).is_contiguous());  // a transpose
  EXPECT_FALSE(t.AsStrided({2, 3}, {0, 1}, 0).is_contiguous());  // an expand
  EXPECT_FALSE(t.AsStrided({2, 2}, {4, 1}, 0).is_contiguous());  // rows with a gap
  // A dimension of size 1 is never stepped over, whatever its stride.
  EXPECT_TRUE(t.AsStrided({1, 4}, {99, 1}, 4).is_contiguous());
  EXPECT_TRUE(t.AsStrided({2, 1, 4}, {4, 7, 1}, 0).is_contiguous());
  EXPECT_TRUE(IsContiguous({4, 1}, {1, 0}));
  EXPECT_FALSE(IsContiguous({4, 2}, {1, 4}));
}

// Note [A fresh tensor in one pass]: the one-pass shapes and the general path's (a zero, a
// rank over eight) give the strides, count and contiguity that ContiguousStrides, CheckedNumel
// and IsContiguous give.
TEST(TensorTest, EmptyGivesThePackedStridesOnEitherPath) {
  const std::vector<Shape> shapes = {{},
                                     {8},
                                     {1},
                                     {2, 3, 4},
                                     {1, 1},
                                     {5, 1, 7},
                                     {0},
                                     {2, 0, 4},
                                     {3, 0},
                                     {0, 0},
                                     {1, 2, 1, 2, 1, 2, 1, 2},
                                     {1, 2, 1, 2, 1, 2, 1, 2, 3},
                                     {1, 2, 1, 2, 1, 2, 0, 2, 3}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor t = Tensor::Empty(shape, DType::kFloat64);
    EXPECT_EQ(t.shape(), shape);
    EXPECT_EQ(t.strides(), ContiguousStrides(shape));
    EXPECT_EQ(t.numel(), *CheckedNumel(shape));
    EXPECT_EQ(t.is_contiguous(), IsContiguous(shape, ContiguousStrides(shape)));
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(t.numel()) * sizeof(double));
  }
  EXPECT_THROW(Tensor::Empty({2, -1}, DType::kFloat32), StatusError);
  EXPECT_THROW(Tensor::Empty({int64_t{1} << 62, 8}, DType::kFloat32), StatusError);
}

TEST(TensorTest, EmptyRejectsHugeShapes) {
  EXPECT_THROW(Tensor::Empty({int64_t{1} << 40, int64_t{1} << 30}, DType::kFloat32), StatusError);
}

TEST(TensorTest, MemoryBudgetLimitsAllocation) {
  auto budget = MemoryBudget::Make(1000);
  MemoryBudgetScope scope(budget);
  Tensor a = Tensor::Empty({100}, DType::kFloat64);
  EXPECT_EQ(budget->used(), 800);
  try {
    Tensor::Empty({100}, DType::kFloat32);
    FAIL() << "expected RESOURCE_EXHAUSTED";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  }
  a = Tensor();
  EXPECT_EQ(budget->used(), 0);
}

// Note [Tensors over max_tensor_elements]: refused before anything is allocated or charged,
// naming the op outputs being computed.
TEST(TensorTest, MemoryBudgetRefusesTensorsOverMaxTensorElements) {
  auto budget = MemoryBudget::Make(int64_t{1} << 40, /*max_tensor_elements=*/1000);
  MemoryBudgetScope scope(budget);
  Tensor fits = Tensor::Empty({10, 100}, DType::kFloat32);
  EXPECT_EQ(budget->used(), 4000);
  auto refusal = [](absl::Span<const int64_t> shape) {
    try {
      Tensor::Empty(shape, DType::kFloat64);
    } catch (const StatusError& e) {
      return e.status();
    }
    return absl::OkStatus();
  };
  EXPECT_EQ(refusal({1 << 20, 1 << 20}),
            absl::ResourceExhaustedError("a tensor float64[1048576, 1048576] on cpu has "
                                         "1099511627776 elements, over the limit of 1000 "
                                         "(max_tensor_elements)"));
  const std::vector<std::string> one = {"h"}, two = {"values", "indices"};
  {
    OutputNamesScope names(&one);
    EXPECT_EQ(refusal({1001}).message(),
              "output 'h' float64[1001] on cpu has 1001 elements, over the limit of 1000 "
              "(max_tensor_elements)");
    OutputNamesScope more(&two);
    EXPECT_EQ(refusal({2, 1000}).message(),
              "a tensor of outputs 'values', 'indices': float64[2, 1000] on cpu has 2000 "
              "elements, over the limit of 1000 (max_tensor_elements)");
  }
  EXPECT_EQ(OutputNamesScope::Current(), nullptr);
  EXPECT_EQ(budget->used(), 4000);
  EXPECT_EQ(budget->peak(), 4000);
}

// Note [Working buffers]: charged before they are allocated, released when freed or moved
// from; nothing is charged without a budget.
TEST(WorkingBufferTest, ChargedToTheCurrentBudgetWhileItLives) {
  WorkingBuffer<double> unaccounted(16, 1.5);
  EXPECT_EQ(unaccounted[15], 1.5);
  auto budget = MemoryBudget::Make(1000);
  MemoryBudgetScope scope(budget);
  {
    WorkingBuffer<double> buffer(100, 0.0);
    EXPECT_EQ(buffer.size(), 100);
    EXPECT_EQ(buffer[99], 0.0);
    EXPECT_EQ(budget->used(), 800);
    WorkingBuffer<double> moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(budget->used(), 800);
    try {
      WorkingBuffer<float> over(int64_t{1} << 40);
      FAIL() << "expected RESOURCE_EXHAUSTED";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_TRUE(absl::StrContains(e.status().message(), "request memory limit exceeded"));
    }
    EXPECT_EQ(budget->used(), 800);
    EXPECT_EQ(budget->peak(), 800);
  }
  EXPECT_EQ(budget->used(), 0);
  EXPECT_THROW(WorkingBuffer<double>(int64_t{1} << 62), StatusError);
}

// Note [Budgets within a budget]: a request's budget inside the server's.
TEST(TensorTest, ABudgetWithinABudgetChargesBothAndNamesTheLimitPassed) {
  auto server = MemoryBudget::Make(1000, nullptr, "server memory limit (--flag)");
  auto first = MemoryBudget::Make(800, server, "request memory limit");
  auto second = MemoryBudget::Make(800, server, "request memory limit");
  Tensor a, b;
  {
    MemoryBudgetScope scope(first);
    a = Tensor::Empty({100}, DType::kFloat64);  // 800 bytes: the request's whole limit
    EXPECT_THROW(Tensor::Empty({1}, DType::kFloat32), StatusError);
  }
  EXPECT_EQ(server->used(), 800);
  {
    MemoryBudgetScope scope(second);
    try {
      b = Tensor::Empty({100}, DType::kFloat32);  // 400 bytes fit the request, not the server
      FAIL() << "expected RESOURCE_EXHAUSTED";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(e.status().message().find("server memory limit (--flag)"), std::string::npos)
          << e.status();
    }
    EXPECT_EQ(second->used(), 0);  // nothing left charged where the parent refused
    b = Tensor::Empty({50}, DType::kFloat32);
  }
  EXPECT_EQ(server->used(), 1000);
  a = Tensor();
  b = Tensor();
  EXPECT_EQ(server->used(), 0);
  EXPECT_EQ(first->used(), 0);
  EXPECT_EQ(server->peak(), 1000);

  MemoryReservation reservation(server);
  EXPECT_TRUE(reservation.Grow(600).ok());
  EXPECT_EQ(reservation.Grow(600).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reservation.bytes(), 600);
  MemoryReservation moved = std::move(reservation);
  EXPECT_EQ(server->used(), 600);
  moved.Reset();
  EXPECT_EQ(server->used(), 0);
}

// A charge walks the whole chain; the first budget that refuses gets nothing, and those below
// it get their bytes back.
TEST(TensorTest, AChargeRefusedHigherUpTheChainIsTakenBackBelow) {
  auto server = MemoryBudget::Make(1000, nullptr, "server memory limit");
  auto tenant = MemoryBudget::Make(600, server, "tenant memory limit");
  auto request = MemoryBudget::Make(10000, tenant, "request memory limit");
  MemoryReservation held(server);
  ASSERT_TRUE(held.Grow(300).ok());
  {
    MemoryBudgetScope scope(request);
    Tensor a = Tensor::Empty({100}, DType::kFloat32);  // 400 bytes: fits everywhere
    EXPECT_EQ(request->used(), 400);
    EXPECT_EQ(tenant->used(), 400);
    EXPECT_EQ(server->used(), 700);
    try {
      Tensor::Empty({100}, DType::kFloat32);  // the tenant's 600 refuses
      FAIL() << "expected RESOURCE_EXHAUSTED";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(e.status().message(),
                "tenant memory limit exceeded: allocating 400 bytes with 400 in use would pass "
                "the limit of 600 bytes");
    }
    EXPECT_EQ(request->used(), 400);
    EXPECT_EQ(tenant->used(), 400);
    EXPECT_EQ(server->used(), 700);
    ASSERT_TRUE(held.Grow(200).ok());
    absl::Status refused = request->TryCharge(150);  // fits the tenant, not the server
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(refused.message(), "server memory limit")) << refused;
    EXPECT_EQ(request->used(), 400);
    EXPECT_EQ(tenant->used(), 400);
    EXPECT_EQ(server->used(), 900);
    EXPECT_EQ(request->TryCharge(MemoryBudget::kMaxChargeBytes + 1).code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(server->used(), 900);
  }
  EXPECT_EQ(request->used(), 0);
  EXPECT_EQ(tenant->used(), 0);
  EXPECT_EQ(server->used(), 500);
  // The refused 150 bytes were counted by the tenant for a moment, before the server refused
  // them (MemoryBudget::ChargeChain), and its peak says so.
  EXPECT_EQ(tenant->peak(), 550);
  EXPECT_EQ(server->peak(), 900);
}

}  // namespace
}  // namespace gradserve
