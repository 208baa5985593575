// RepeatBytes: one element's bytes over a buffer, doubling.

#include "engine/util/repeat_bytes.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradserve {
namespace {

TEST(RepeatBytesTest, EveryElementSizeFillsItsRangeAndNothingPast) {
  const unsigned char element[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t element_size : {1, 2, 3, 4, 8}) {
    for (size_t n : {size_t{0}, element_size, 7 * element_size, size_t{4096}, size_t{4099}}) {
      SCOPED_TRACE(testing::Message() << element_size << "-byte element over " << n << " bytes");
      std::vector<unsigned char> out(n + 16, 0xEE);
      RepeatBytes(out.data(), n, element, element_size);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], element[i % element_size]) << i;
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 0xEE) << i;
    }
  }
}

}  // namespace
}  // namespace gradserve
