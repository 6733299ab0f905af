// PoPE's δ against its interval [−2π, 0] (docs/encodings.md, section 3), for the log of each
// validation: the share of δ entries on a bound and past one. Under delta_bound clamp an entry
// past a bound acts as that bound and gets no gradient, so the training no longer moves it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "pope/model.hpp"

namespace pope {

struct DeltaBoundShares {
  std::int64_t entries = 0;
  double at_bound = 0.0;  // share with δ = 0 or δ = −2π (its nearest f32)
  double outside = 0.0;   // share with δ > 0 or δ < −2π (its nearest f32)
};

DeltaBoundShares delta_bound_shares(std::span<const float> delta);
// Over every layer's δ, read from the master weights; nullopt when the model has no learned δ
// (not PoPE, or learn_delta false).
std::optional<DeltaBoundShares> delta_bound_shares(Model& model);

}  // namespace pope
