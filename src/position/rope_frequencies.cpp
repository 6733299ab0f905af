#include "position/rope_frequencies.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "position/math.hpp"

namespace pope {

namespace {

bool uses_fixed_factor(RopeScalingKind kind) {
  return kind == RopeScalingKind::pi || kind == RopeScalingKind::ntk || kind == RopeScalingKind::yarn;
}

void require_train_length(int train_length, RopeScalingKind kind) {
  if (train_length <= 0)
    throw ConfigError("model.context_length", "RoPE scaling '" + std::string(name_of(kind)) +
                                                  "' needs the training length L_train > 0, got " +
                                                  std::to_string(train_length));
}

}  // namespace

void validate_rope_config(const RopeConfig& config) {
  if (!(config.base > 1.0))
    throw ConfigError("model.position.rope.base", "expected a base > 1, got " + std::to_string(config.base));
  if (!(config.fraction > 0.0 && config.fraction <= 1.0))
    throw ConfigError("model.position.rope.fraction",
                      "expected a share of channels in (0, 1], got " + std::to_string(config.fraction));
  const RopeScalingConfig& scaling = config.scaling;
  if (uses_fixed_factor(scaling.kind) && !(scaling.factor >= 1.0))
    throw ConfigError("model.position.rope.scaling.factor",
                      "expected a context-extension factor >= 1, got " + std::to_string(scaling.factor));
  if (scaling.kind == RopeScalingKind::yarn) {
    if (!(scaling.yarn_beta > scaling.yarn_alpha))
      throw ConfigError("model.position.rope.scaling.yarn_beta", "expected yarn_beta > yarn_alpha, got alpha " +
                                                                     std::to_string(scaling.yarn_alpha) + " and beta " +
                                                                     std::to_string(scaling.yarn_beta));
    if (scaling.yarn_temperature < 0.0)
      throw ConfigError("model.position.rope.scaling.yarn_temperature",
                        "expected 0 (default 0.1·ln s + 1) or a positive q/k multiplier, got " +
                            std::to_string(scaling.yarn_temperature));
  }
}

int rope_rotary_dim(double fraction, int head_dim) {
  const double exact = fraction * head_dim;
  const int rotary_dim = static_cast<int>(std::lround(exact));
  if (std::abs(exact - rotary_dim) > 1e-9 || rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    throw ConfigError("model.position.rope.fraction", "fraction " + std::to_string(fraction) + " of head_dim " +
                                                          std::to_string(head_dim) +
                                                          " must give a positive even number of rotating channels");
  return rotary_dim;
}

double rope_scale_factor(const RopeScalingConfig& scaling, int train_length, int total_length) {
  if (scaling.kind == RopeScalingKind::none) return 1.0;
  if (scaling.kind == RopeScalingKind::dynamic_ntk) {
    require_train_length(train_length, scaling.kind);
    return std::max(1.0, static_cast<double>(total_length) / train_length);
  }
  return scaling.factor;
}

std::vector<double> rope_frequencies(const RopeConfig& config, int rotary_dim, int train_length, int total_length) {
  const RopeScalingKind kind = config.scaling.kind;
  const double s = rope_scale_factor(config.scaling, train_length, total_length);
  const int pairs = rotary_dim / 2;
  const double exponent_step = 2.0 / rotary_dim;

  if (kind == RopeScalingKind::ntk || kind == RopeScalingKind::dynamic_ntk) {
    if (rotary_dim <= 2)
      throw ConfigError("model.position.rope.fraction",
                        "NTK scaling needs more than 2 rotating channels (its exponent is r/(r-2)), got " +
                            std::to_string(rotary_dim));
    const double scaled_base = config.base * std::pow(s, rotary_dim / (rotary_dim - 2.0));
    return geometric_frequencies(scaled_base, pairs, exponent_step);
  }
  std::vector<double> theta = geometric_frequencies(config.base, pairs, exponent_step);
  if (kind == RopeScalingKind::pi) {
    for (double& t : theta) t /= s;
  } else if (kind == RopeScalingKind::yarn) {
    require_train_length(train_length, kind);
    const double alpha = config.scaling.yarn_alpha;
    const double beta = config.scaling.yarn_beta;
    for (double& t : theta) {
      // r_m: how many full rotations pair m makes over the training length. Fast pairs
      // (r ≥ β) keep their frequency, slow pairs (r ≤ α) are interpolated like PI.
      const double rotations = train_length * t / (2.0 * std::numbers::pi);
      const double gamma = std::clamp((rotations - alpha) / (beta - alpha), 0.0, 1.0);
      t = (1.0 - gamma) * t / s + gamma * t;
    }
  }
  return theta;
}

double rope_qk_multiplier(const RopeScalingConfig& scaling) {
  if (scaling.kind != RopeScalingKind::yarn) return 1.0;
  if (scaling.yarn_temperature > 0.0) return scaling.yarn_temperature;
  return 0.1 * std::log(scaling.factor) + 1.0;
}

}  // namespace pope
