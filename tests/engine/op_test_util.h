// Helpers the op tests (tests/engine/ops_*_test.cc) share: building float64 and int64 tensors,
// reading values back, and the two expectations every op test makes.

#ifndef GRADSERVE_TESTS_ENGINE_OP_TEST_UTIL_H_
#define GRADSERVE_TESTS_ENGINE_OP_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"

namespace gradserve::testing::op_test {

inline Tensor F64(const std::vector<double>& values, absl::Span<const int64_t> shape) {
  return Tensor::FromVector<double>(values, shape);
}
inline Tensor I64(const std::vector<int64_t>& values, absl::Span<const int64_t> shape) {
  return Tensor::FromVector<int64_t>(values, shape);
}

// The values in row-major order as doubles, whatever the strides.
inline std::vector<double> Values(const Tensor& t) { return gradcheck_internal::Values(t); }

inline std::vector<int64_t> ShapeOf(const Tensor& t) {
  return std::vector<int64_t>(t.shape().begin(), t.shape().end());
}

// Expects t's values to be `expected`, each within tol relative to max(1, |expected|); a NaN
// expects a NaN.
inline void ExpectNear(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  const std::vector<double> got = Values(t);
  ASSERT_EQ(got.size(), expected.size()) << t.DebugString();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], expected[i], tol * std::max(1.0, std::abs(expected[i])))
          << "element " << i;
    }
  }
}

// What an error message must contain: one piece ("...") or several ({"...", "..."}).
struct Pieces {
  Pieces(const char* one) : all{one} {}         // NOLINT: implicit on purpose
  Pieces(const std::string& one) : all{one} {}  // NOLINT
  Pieces(std::initializer_list<std::string> many) : all(many) {}
  std::vector<std::string> all;
};

// Runs fn, expecting INVALID_ARGUMENT whose message holds every one of `pieces`.
inline void ExpectInvalid(const std::function<void()>& fn, const Pieces& pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected INVALID_ARGUMENT";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
    for (const std::string& piece : pieces.all) {
      EXPECT_NE(std::string(e.status().message()).find(piece), std::string::npos)
          << "missing \"" << piece << "\" in: " << e.status().message();
    }
  }
}

}  // namespace gradserve::testing::op_test

#endif  // GRADSERVE_TESTS_ENGINE_OP_TEST_UTIL_H_
