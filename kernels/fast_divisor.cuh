// Division by a divisor fixed for a whole kernel, with a multiply and a shift: the GPU has no
// integer divide instruction, and n / d by a run-time d costs about twenty instructions per
// quotient. The host builds a FastDivisor once per launch and passes it by value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pope::kernels {

// ⌊n / d⌋ for one d ≥ 1 and every 0 ≤ n < 2^31 (Granlund and Montgomery): with s = ⌈log2 d⌉
// and m = ⌈2^(31+s) / d⌉ ≤ 2^32, ⌊n·m / 2^(31+s)⌋ = ⌊n / d⌋, and n·m < 2^63 fits 64 bits.
struct FastDivisor {
  int divisor = 1;
  std::uint64_t multiplier = std::uint64_t(1) << 31;
  int shift = 31;

  FastDivisor() = default;
  __host__ explicit FastDivisor(int d) : divisor(d) {
    int s = 0;
    while ((std::int64_t(1) << s) < d) ++s;
    shift = 31 + s;
    multiplier = ((std::uint64_t(1) << shift) + std::uint64_t(d) - 1) / std::uint64_t(d);
  }
  __host__ __device__ int quotient(int n) const { return int((std::uint64_t(n) * multiplier) >> shift); }
};

}  // namespace pope::kernels
