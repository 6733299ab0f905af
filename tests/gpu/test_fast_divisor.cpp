// kernels/fast_divisor.cuh: its quotient (the same code on host and device) equals integer
// division for every divisor up to 1,000 over n near each multiple of it and near 2^31, and
// for the divisors the kernels meet (batch sizes) over a dense range of n. Host only.
#include <gtest/gtest.h>

#include <cstdint>

#include "fast_divisor.cuh"

namespace {

using pope::kernels::FastDivisor;

TEST(FastDivisor, QuotientsEqualIntegerDivision) {
  constexpr std::int64_t kLargest = (std::int64_t(1) << 31) - 1;
  for (int d = 1; d <= 1000; ++d) {
    const FastDivisor divisor(d);
    auto check = [&](std::int64_t n) {
      if (n < 0 || n > kLargest) return;
      ASSERT_EQ(divisor.quotient(int(n)), int(n / d)) << n << " / " << d;
    };
    for (std::int64_t k = 0; k < 300; ++k)
      for (std::int64_t n = k * d - 1; n <= k * d + 1; ++n) check(n);
    for (std::int64_t n = kLargest - 2 * d; n <= kLargest; ++n) check(n);
  }
  for (const int d : {1, 2, 3, 5, 7, 16, 24, 32, 48, 100, 512})
    for (int n = 0; n < 200000; ++n) ASSERT_EQ(FastDivisor(d).quotient(n), n / d) << n << " / " << d;
}

}  // namespace
