// Deterministic random numbers: xoshiro256** seeded through splitmix64. The whole state is
// four words, so it is saved in checkpoints and a resumed run draws the same numbers.
#pragma once

#include <array>
#include <cstdint>

namespace pope {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0);
  std::uint64_t next_u64();
  double uniform();                          // [0, 1)
  double uniform(double low, double high);   // [low, high)
  double normal();                           // N(0, 1), Box–Muller without caching
  // normal()'s transform of its two draws (first, second), so that callers can draw the
  // words in order and transform them elsewhere (in parallel) to the same values.
  static double normal_from(std::uint64_t first, std::uint64_t second);
  std::uint64_t below(std::uint64_t bound);  // uniform integer in [0, bound), unbiased

  using State = std::array<std::uint64_t, 4>;
  State state() const { return state_; }
  void set_state(const State& state) { state_ = state; }

 private:
  State state_{};
};

// Stateless hash of (a, b) → 64 bits (splitmix64 finaliser); used to derive per-sample streams.
std::uint64_t mix64(std::uint64_t a, std::uint64_t b = 0);

}  // namespace pope
