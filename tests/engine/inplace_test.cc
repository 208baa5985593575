// In-place writes and version counters (Note [Version counter], Note [Saved versions]): the
// engine-level half of PyTorch's test_autograd.py in-place tests.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/autograd/autograd.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::op_test::F64;
using ::testing::HasSubstr;

Tensor Leaf(const std::vector<double>& values) {
  Tensor t = F64(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  t.set_name("x");
  return t;
}

absl::StatusOr<TensorList> GradOf(const Tensor& root, const Tensor& input) {
  return autograd::Grad({root}, {Tensor()}, {input}, {});
}

TEST(VersionCounterTest, SharedByBaseViewsAndAliases) {
  Tensor base = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor view = transpose(base, 0, 1);
  Tensor row = select(base, 0, 1);
  Tensor alias = base.detach();
  EXPECT_EQ(base.version(), 0u);
  row.BumpVersion();
  EXPECT_EQ(base.version(), 1u);
  EXPECT_EQ(view.version(), 1u);
  EXPECT_EQ(alias.version(), 1u);
  EXPECT_TRUE(view.is_view());
  EXPECT_TRUE(row.is_view());
  EXPECT_FALSE(base.is_view());
  // A copy has its own counter.
  EXPECT_EQ(base.Clone().version(), 0u);
}

TEST(SavedVersionTest, ModifiedSavedInputFailsNamingValueAndVersions) {
  Tensor x = Leaf({1, 2, 3});
  Tensor y = sum(mul(x, x));  // MulBackward0 saves x twice
  x.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition) << grads.status();
  const std::string message(grads.status().message());
  EXPECT_THAT(message, HasSubstr("one of the variables needed for gradient computation has "
                                 "been modified by an inplace operation"));
  EXPECT_THAT(message, HasSubstr("'x'"));
  EXPECT_THAT(message, HasSubstr("MulBackward0"));
  EXPECT_THAT(message, HasSubstr("is at version 1; expected version 0"));
}

TEST(SavedVersionTest, ModifiedSavedOutputFailsNamingItsNode) {
  Tensor x = Leaf({0.5, -1});
  Tensor h = tanh(x);  // TanhBackward0 saves its output
  Tensor y = sum(h);
  h.BumpVersion();
  h.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition) << grads.status();
  const std::string message(grads.status().message());
  EXPECT_THAT(message, HasSubstr("output 0 of TanhBackward0"));
  EXPECT_THAT(message, HasSubstr("is at version 2; expected version 0"));
}

TEST(SavedVersionTest, UnsavedTensorsMayChange) {
  // add saves nothing: writing into its input after it ran breaks nothing, as in PyTorch.
  Tensor x = Leaf({1, 2});
  Tensor y = sum(add(x, 1.0));
  x.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_TRUE(grads.ok()) << grads.status();
}

}  // namespace
}  // namespace gradserve::ops
