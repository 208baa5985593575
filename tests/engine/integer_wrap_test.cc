// Note [Integer tensors wrap around] across the whole op set: every op that takes int64 inputs,
// given the int64 extremes and extreme scalars, either computes (wrapping as PyTorch does) or
// refuses with INVALID_ARGUMENT. Run under UBSan (the asan preset), any signed overflow or
// out-of-range float-to-int conversion in a kernel aborts the test.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/indexing.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/memory_budget.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using testing::op_test::I64;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::vector<int64_t> ValuesOf(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

// Runs op on fresh copies of `inputs` (an in-place op writes its first) with `attrs`; a refusal
// must be INVALID_ARGUMENT, or RESOURCE_EXHAUSTED from the sweep's budget. Returns whether it
// ran.
bool RunOrRefuse(const OpSchema& op, const TensorList& inputs, const Attrs& attrs,
                 const std::string& what) {
  TensorList copies;
  for (const Tensor& t : inputs) copies.push_back(t.Clone());
  try {
    op.run(copies, attrs);
    return true;
  } catch (const StatusError& e) {
    EXPECT_TRUE(e.status().code() == absl::StatusCode::kInvalidArgument ||
                e.status().code() == absl::StatusCode::kResourceExhausted)
        << op.name << " (" << what << "): " << e.status();
    return false;
  } catch (const std::exception& e) {  // the server would answer INTERNAL
    ADD_FAILURE() << op.name << " (" << what << "): " << e.what();
    return false;
  }
}

// A value of each attribute type that every op accepts as "ordinary" (dim 0, size 1, ...).
AttrValue Ordinary(const AttrSpec& spec) {
  switch (spec.type) {
    case AttrType::kInt:
      return int64_t{0};
    case AttrType::kFloat:
      return 1.0;
    case AttrType::kBool:
      return false;
    case AttrType::kString:
      return spec.keywords.empty() ? std::string("none") : spec.keywords.front();
    case AttrType::kInts:
      return std::vector<int64_t>{1};
    case AttrType::kFloats:
      return std::vector<double>{1.0};
    case AttrType::kStrings:
      return std::vector<std::string>{};
  }
  return int64_t{0};
}

// Runs every op that accepts first's dtype with first as its first input and rest as every other
// (each optional input given and left out), with its required attributes ordinary, then each int,
// float and int list attribute in turn at each extreme, within a budget of 64 MiB and 2**20
// elements. Returns how many runs computed a result.
int SweepAtTheExtremes(const Tensor& first, const Tensor& rest) {
  autograd::NoGradGuard no_grad;
  MemoryBudgetScope budget(MemoryBudget::Make(int64_t{64} << 20, int64_t{1} << 20));
  const std::vector<AttrValue> scalars = {kMin,
                                          kMax,
                                          int64_t{-1},
                                          int64_t{1} << 40,
                                          9.3e18,
                                          -9.3e18,
                                          1.8e19,
                                          -1e300,
                                          1e300,
                                          0.5,
                                          -2.5,
                                          std::numeric_limits<double>::quiet_NaN(),
                                          std::vector<int64_t>{kMax},
                                          std::vector<int64_t>{kMin},
                                          std::vector<int64_t>{-1, -1},
                                          std::vector<int64_t>{kMax, kMax, kMax},
                                          std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40}};
  int computed = 0;
  for (const OpSchema& op : OpRegistry::Get().ops()) {
    if (std::find(op.dtypes.begin(), op.dtypes.end(), first.dtype()) == op.dtypes.end()) continue;
    const size_t n = op.variadic ? 2 : op.input_names.size();
    for (size_t given = n - op.optional_inputs; given <= n; ++given) {
      TensorList inputs(given, rest);
      if (given > 0) inputs[0] = first;
      Attrs base;
      for (const AttrSpec& a : op.attrs) {
        if (a.required) base.set(a.name, Ordinary(a));
      }
      computed += RunOrRefuse(op, inputs, base, "ordinary attributes");
      auto fits = [](const AttrSpec& a, const AttrValue& s) {
        const AttrType type = TypeOf(s);
        return type == a.type || (a.type == AttrType::kFloat && type == AttrType::kInt);
      };
      // Each attribute alone at each extreme; then, since a window's size times its dilation
      // overflows only when both are large, every attribute that takes it at once, and every
      // int list at 2 but one at the extreme.
      for (const AttrValue& s : scalars) {
        Attrs all = base;
        for (const AttrSpec& a : op.attrs) {
          if (!fits(a, s)) continue;
          Attrs one = base;
          one.set(a.name, s);
          computed += RunOrRefuse(op, inputs, one, a.name);
          all.set(a.name, s);
          Attrs pairs = base;
          for (const AttrSpec& b : op.attrs) {
            if (b.type == AttrType::kInts) pairs.set(b.name, std::vector<int64_t>{2, 2});
          }
          pairs.set(a.name, s);
          computed += RunOrRefuse(op, inputs, pairs, a.name + " with the lists at 2");
        }
        computed += RunOrRefuse(op, inputs, all, "every attribute at once");
      }
    }
  }
  return computed;
}

const Tensor& Int64Extremes() {
  static const Tensor* t = new Tensor(I64({kMin, kMax, -1, 3}, {2, 2}));
  return *t;
}

// Floating inputs: the ops that convert them to integers (to, casts) meet NaN, infinities and
// values past int64's range.
const Tensor& Float64Extremes() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  static const Tensor* t =
      new Tensor(testing::op_test::F64({1e300, -kInf, std::nan(""), 3.5}, {2, 2}));
  return *t;
}

TEST(IntegerWrapTest, EveryOpTakingInt64ComputesOrRefusesAtTheExtremes) {
  const int computed = SweepAtTheExtremes(Int64Extremes(), Int64Extremes());
  std::cout << computed << " runs computed\n";
  EXPECT_GT(computed, 100);
  const Tensor flags = Tensor::FromVector<bool>({true, false, true, true}, {2, 2});
  EXPECT_GT(SweepAtTheExtremes(flags, flags), 50);
}

TEST(IntegerWrapTest, EveryOpTakingFloat64ComputesOrRefusesAtTheExtremes) {
  const int computed = SweepAtTheExtremes(Float64Extremes(), Float64Extremes());
  std::cout << computed << " runs computed\n";
  EXPECT_GT(computed, 100);
  const Tensor f32 = Float64Extremes().To(DType::kFloat32);
  EXPECT_GT(SweepAtTheExtremes(f32, f32), 100);
}

// The same in the ranks that images and sequences take (pooling, conv2d, ...), and with an empty
// tensor whose other dims are huge (it holds no element, so it is accepted): sizes from the
// client that the ops' shape arithmetic multiplies and adds.
TEST(IntegerWrapTest, EveryOpComputesOrRefusesInOtherRanksAndEmpty) {
  for (const Tensor* values : {&Float64Extremes(), &Int64Extremes()}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{1, 1, 2, 2}, std::vector<int64_t>{1, 2, 2},
          std::vector<int64_t>{4}}) {
      const Tensor t = reshape(*values, shape).contiguous();
      EXPECT_GT(SweepAtTheExtremes(t, t), 50);
    }
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{0, 1, int64_t{1} << 40, 4},
          std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 2, 0, 4}}) {
      const Tensor empty = Tensor::Empty(shape, values->dtype());
      SweepAtTheExtremes(empty, empty);
      SweepAtTheExtremes(empty, *values);
    }
  }
}

// Float data with int64 indices, targets and exponents (embedding, nll_loss, gather, pow, ...),
// and the other way round.
TEST(IntegerWrapTest, MixedInputsComputeOrRefuseAtTheExtremes) {
  EXPECT_GT(SweepAtTheExtremes(Float64Extremes(), Int64Extremes()), 50);
  EXPECT_GT(SweepAtTheExtremes(Int64Extremes(), Float64Extremes()), 50);
}

// The values PyTorch gives (torch.int64, two's complement).
TEST(IntegerWrapTest, ArithmeticWrapsAsPyTorch) {
  const Tensor a = I64({kMax, kMin, 5}, {3});
  const Tensor one = I64({1, 1, 1}, {3});
  EXPECT_EQ(ValuesOf(add(a, one)), (std::vector<int64_t>{kMin, kMin + 1, 6}));
  EXPECT_EQ(ValuesOf(sub(a, one)), (std::vector<int64_t>{kMax - 1, kMax, 4}));
  EXPECT_EQ(ValuesOf(add(a, a, 2)), (std::vector<int64_t>{kMax - 2, kMin, 15}));
  EXPECT_EQ(ValuesOf(mul(a, I64({2, 2, 2}, {3}))), (std::vector<int64_t>{-2, 0, 10}));
  EXPECT_EQ(ValuesOf(sum(a)), (std::vector<int64_t>{4}));
  EXPECT_EQ(ValuesOf(cumsum(a, 0)), (std::vector<int64_t>{kMax, -1, 4}));
  // An int scalar takes part exactly, past the 2**53 a double holds.
  const OpSchema& add_op = *OpRegistry::Get().Find("add");
  EXPECT_EQ(ValuesOf(add_op.run({a}, Attrs({{"other", kMax}}))[0]),
            (std::vector<int64_t>{-2, -1, kMin + 4}));
  // Floats past int64's range, and NaN, convert to its minimum as on PyTorch's CPU.
  const Tensor f = testing::op_test::F64({1e300, std::nan(""), -1e300, 3.7, -3.7}, {5});
  EXPECT_EQ(ValuesOf(f.To(DType::kInt64)), (std::vector<int64_t>{kMin, kMin, kMin, 3, -3}));
}

TEST(IntegerWrapTest, AnAlphaOutsideInt64IsRefused) {
  const Tensor a = I64({1, 2}, {2});
  testing::op_test::ExpectInvalid([&] { add(a, a, 1e19); }, "alpha");
  testing::op_test::ExpectInvalid([&] { sub(a, a, -1e300); }, "alpha");
}

}  // namespace
}  // namespace gradserve::ops
