// Token ids drawn uniformly from [0, vocab) by a test's Rng: inputs and targets of the test models.
#pragma once

#include <cstdint>
#include <vector>

#include "pope/rng.hpp"

namespace pope::testing {

inline std::vector<std::int32_t> random_tokens(Rng& rng, int n, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

}  // namespace pope::testing
