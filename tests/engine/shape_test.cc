// Shape arithmetic at its edges (engine/tensor/shape.h): what CheckedNumel lets through,
// ContiguousStrides can compute without overflowing.

#include "engine/tensor/shape.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

constexpr int64_t kMax = INT64_MAX;

// Found by the fuzzer (tests/fuzz): a leaf of shape [0, 2, 4, INT64_MAX] has no element, and
// ContiguousStrides overflowed computing its strides (undefined behaviour). PyTorch refuses
// such a shape ("Stride calculation overflowed"); so does CheckedNumel.
TEST(ShapeTest, EmptyShapesWhoseStridesOverflowAreRefused) {
  for (const Shape& shape :
       {Shape{0, 2, 4, kMax}, Shape{0, int64_t{1} << 62, 4}, Shape{3, 0, kMax, kMax}}) {
    absl::StatusOr<int64_t> numel = CheckedNumel(shape);
    ASSERT_FALSE(numel.ok()) << ShapeToString(shape);
    EXPECT_EQ(numel.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(numel.status().message(), "strides")) << numel.status();
    EXPECT_THROW(Tensor::Empty(shape, DType::kFloat32, kCPU), StatusError);
  }
  // A huge first size costs no stride; zeros elsewhere count as ones.
  for (const Shape& shape : {Shape{kMax, 0}, Shape{kMax, 2, 0}, Shape{0, kMax}, Shape{2, 0, 0}}) {
    EXPECT_EQ(CheckedNumel(shape).value_or(-1), 0) << ShapeToString(shape);
    const Tensor t = Tensor::Empty(shape, DType::kFloat32, kCPU);
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.strides().back(), 1);
  }
  // The long fuzz run's find: such a shape with a 1 put in front (conv2d's unsqueeze of an
  // unbatched input) has a product of its non-zero sizes past int64; Numel must not make it.
  EXPECT_EQ(Numel(Shape{1, kMax, 4, 0}), 0);
  EXPECT_EQ(Numel(Shape{kMax, 4, 0}), 0);
  // Without a zero, the element count overflows first and says so.
  absl::StatusOr<int64_t> numel = CheckedNumel({2, kMax, kMax});
  ASSERT_FALSE(numel.ok());
  EXPECT_TRUE(absl::StrContains(numel.status().message(), "more elements than int64"))
      << numel.status();
}

}  // namespace
}  // namespace gradserve
