#include "pope/rng.hpp"

#include <cmath>
#include <numbers>

namespace pope {

std::uint64_t mix64(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Rng::Rng(std::uint64_t seed) {
  for (int i = 0; i < 4; ++i) state_[static_cast<std::size_t>(i)] = mix64(seed, static_cast<std::uint64_t>(i));
}

static inline std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// The top 53 bits of a word as a double in [0, 1).
static inline double unit_interval(std::uint64_t word) { return static_cast<double>(word >> 11) * 0x1.0p-53; }

std::uint64_t Rng::next_u64() {
  auto& s = state_;
  const std::uint64_t result = rotl(s[1] * 5, 7) * 9;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Rng::uniform() { return unit_interval(next_u64()); }

double Rng::uniform(double low, double high) { return low + (high - low) * uniform(); }

double Rng::normal_from(std::uint64_t first, std::uint64_t second) {
  // 1 − u keeps the logarithm's argument in (0, 1].
  const double u1 = 1.0 - unit_interval(first);
  const double u2 = unit_interval(second);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Rng::normal() {
  const std::uint64_t first = next_u64();
  return normal_from(first, next_u64());
}

std::uint64_t Rng::below(std::uint64_t bound) {
  if (bound == 0) return 0;
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
  std::uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % bound;
}

}  // namespace pope
