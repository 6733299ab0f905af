#include "runtime/delta_bounds.hpp"

#include <fmt/format.h>

#include <numbers>
#include <vector>

namespace pope {

DeltaBoundShares delta_bound_shares(std::span<const float> delta) {
  constexpr float kLowest = float(-2.0 * std::numbers::pi);
  std::int64_t at_bound = 0, outside = 0;
  for (float value : delta) {
    at_bound += value == 0.0f || value == kLowest;
    outside += value > 0.0f || value < kLowest;
  }
  DeltaBoundShares shares;
  shares.entries = std::int64_t(delta.size());
  if (shares.entries == 0) return shares;
  shares.at_bound = double(at_bound) / double(shares.entries);
  shares.outside = double(outside) / double(shares.entries);
  return shares;
}

std::optional<DeltaBoundShares> delta_bound_shares(Model& model) {
  const ModelConfig& config = model.config();
  if (config.position.kind != "pope" || !config.position.pope.learn_delta) return std::nullopt;
  std::vector<float> delta;
  for (int l = 0; l < config.n_layer; ++l) {
    const Tensor layer = model.layout().view(model.parameters(), fmt::format("layers.{}.position.delta", l));
    const std::vector<float> values = tensor_to_host_f32(model.backend(), layer);
    delta.insert(delta.end(), values.begin(), values.end());
  }
  return delta_bound_shares(delta);
}

}  // namespace pope
