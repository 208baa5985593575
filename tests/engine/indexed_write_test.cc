// index_copy and index_put, out of place and in place (Note [Indexed writes]): values and
// gradients versus python3-torch 1.13, gradcheck and gradgradcheck, and the refusals.

#include <vector>

#include "absl/status/status.h"
#include "engine/autograd/autograd.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/indexing.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::GradCheck;
using ::gradserve::testing::GradGradCheck;
using ::gradserve::testing::RandomInput;
using ::gradserve::testing::op_test::ExpectNear;
using ::gradserve::testing::op_test::F64;
using ::testing::HasSubstr;

Tensor I64(const std::vector<int64_t>& values, absl::Span<const int64_t> shape) {
  return Tensor::FromVector<int64_t>(values, shape);
}

Tensor Leaf(const std::vector<double>& values, absl::Span<const int64_t> shape) {
  Tensor t = F64(values, shape);
  t.set_requires_grad(true);
  return t;
}

// x = arange(6.).reshape(2, 3); s = [[10, 20], [30, 40]];
// x.index_copy(1, [2, 0], s) = [[20, 1, 10], [40, 4, 30]];
// torch.index_put(x, ([1, 0], [1, 2]), [7, 8]) = [[0, 1, 8], [3, 7, 5]];
// accumulate with a repeated position: ([1, 1],) adds [1, 1, 1] twice to row 1.
TEST(IndexedWriteTest, ValuesArePyTorchs) {
  const Tensor x = F64({0, 1, 2, 3, 4, 5}, {2, 3});
  ExpectNear(index_copy(x, 1, I64({2, 0}, {2}), F64({10, 20, 30, 40}, {2, 2})),
             {20, 1, 10, 40, 4, 30});
  ExpectNear(index_put(x, {I64({1, 0}, {2}), I64({1, 2}, {2})}, F64({7, 8}, {2})),
             {0, 1, 8, 3, 7, 5});
  ExpectNear(index_put(x, {I64({1, 1}, {2})}, F64({1, 1, 1}, {3}), /*accumulate=*/true),
             {0, 1, 2, 5, 6, 7});
  ExpectNear(x, {0, 1, 2, 3, 4, 5});  // the out-of-place forms leave input alone
  Tensor y = x.Clone();
  index_put_(y, {I64({-1}, {1}), I64({0}, {1})}, F64({9}, {1}));
  ExpectNear(y, {0, 1, 2, 9, 4, 5});
  EXPECT_EQ(y.version(), 1u);
}

TEST(IndexedWriteTest, GradCheck) {
  const Tensor index = I64({3, 0}, {2});
  auto copy = [&](const TensorList& in) { return TensorList{index_copy(in[0], 1, index, in[1])}; };
  const TensorList copy_in = {RandomInput({2, 4, 3}, 1), RandomInput({2, 2, 3}, 2)};
  EXPECT_TRUE(GradCheck(copy, copy_in));
  EXPECT_TRUE(GradGradCheck(copy, copy_in));
  const Tensor rows = I64({2, 0, 2}, {3, 1});
  const Tensor cols = I64({1, -1}, {2});
  for (bool accumulate : {false, true}) {
    const TensorList put_in = {RandomInput({3, 4, 2}, 3), RandomInput({2, 1}, 4)};
    auto put = [&](const TensorList& in) {
      return TensorList{
          index_put(in[0], {accumulate ? rows : I64({2, 0, 1}, {3, 1}), cols}, in[1], accumulate)};
    };
    EXPECT_TRUE(GradCheck(put, put_in)) << accumulate;
    EXPECT_TRUE(GradGradCheck(put, put_in)) << accumulate;
  }
  // In place on an intermediate and on a view of one (its base takes the write).
  auto in_place = [&](const TensorList& in) {
    Tensor h = mul(in[0], 2.0);
    index_copy_(h, 1, index, in[1]);
    Tensor v = select(h, 0, 1);
    index_put_(v, {I64({0, 2}, {2})}, reshape(narrow(mul(in[1], 0.5), 0, 0, 1), {2, 3}));
    return TensorList{mul(h, h)};
  };
  EXPECT_TRUE(GradCheck(in_place, copy_in));
  EXPECT_TRUE(GradGradCheck(in_place, copy_in));
}

// h = x * 1; h.index_put_(([0, 2],), v) with v requiring grad; loss = (h * h).sum().
TEST(IndexedWriteTest, InPlaceGradientsArePyTorchs) {
  Tensor x = Leaf({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor v = Leaf({0.5, -1}, {2});
  Tensor h = mul(x, 1.0);
  index_put_(h, {I64({0, 2}, {2})}, v);
  absl::StatusOr<TensorList> g =
      autograd::Grad({sum(mul(h, h))}, {Tensor()}, {x, v}, autograd::BackwardOptions{});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0, 0, 6, 8, 0, 0});
  ExpectNear((*g)[1], {2, -4});
}

TEST(IndexedWriteTest, BadIndicesAreRefusedClearly) {
  const Tensor x = F64({0, 1, 2, 3, 4, 5}, {2, 3});
  try {
    index_copy(x, 1, I64({2, 2}, {2}), F64({1, 2, 3, 4}, {2, 2}));
    ADD_FAILURE() << "a repeated index_copy position was accepted";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.status().message(), HasSubstr("written more than once"));
  }
  try {
    index_put(x, {I64({0}, {1}), I64({3}, {1})}, F64({1}, {1}));
    ADD_FAILURE() << "an out-of-range index_put position was accepted";
  } catch (const StatusError& e) {
    EXPECT_THAT(e.status().message(),
                HasSubstr("indices[1] holds 3, out of range for dimension 1"));
  }
  EXPECT_THROW(index_put(x, {I64({0}, {1}), I64({0}, {1}), I64({0}, {1})}, F64({1}, {1})),
               StatusError);
  EXPECT_THROW(index_copy(x, 0, I64({1}, {1}), F64({1, 2}, {1, 2})), StatusError);
  EXPECT_THROW(index_put(x, {F64({0}, {1})}, F64({1}, {1})), StatusError);
  Tensor leaf = Leaf({1, 2}, {2});
  EXPECT_THROW(index_put_(leaf, {I64({0}, {1})}, F64({3}, {1})), StatusError);
}

}  // namespace
}  // namespace gradserve::ops
