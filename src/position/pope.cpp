// PoPE (docs/encodings.md, section 3): magnitudes from content, phases from
// position. Layout and δ handling are documented on PopeEncoding in position/encodings.hpp.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "position/checks.hpp"
#include "position/encodings.hpp"
#include "position/math.hpp"

namespace pope {

namespace {

constexpr double kTwoPi = 2.0 * std::numbers::pi;

double magnitude_of(MagnitudeKind kind, double x) {
  switch (kind) {
    case MagnitudeKind::softplus:
      return softplus(x);
    case MagnitudeKind::identity:
      return x;
    case MagnitudeKind::relu:
      return x > 0.0 ? x : 0.0;
  }
  return x;
}

// d magnitude / dx of exactly the function magnitude_of computes.
double magnitude_derivative(MagnitudeKind kind, double x) {
  switch (kind) {
    case MagnitudeKind::softplus:
      return softplus_derivative(x);
    case MagnitudeKind::identity:
      return 1.0;
    case MagnitudeKind::relu:
      return x > 0.0 ? 1.0 : 0.0;
  }
  return 1.0;
}

bool delta_in_range(double delta) { return delta >= -kTwoPi && delta <= 0.0; }
// δ as the phase takes it: clamped to [−2π, 0] under DeltaBound::clamp, else as stored (project
// keeps it there by clamping after each update instead).
double acting_delta(DeltaBound bound, double delta) {
  return bound == DeltaBound::clamp ? std::clamp(delta, -kTwoPi, 0.0) : delta;
}
// Whether δ passes its gradient: a clamped δ outside [−2π, 0] does not (the clamp is flat there).
bool delta_passes_gradient(DeltaBound bound, double delta) {
  return bound != DeltaBound::clamp || delta_in_range(delta);
}

// This head's δ row when it applies (keys with a learned δ), else null: δ is on keys only.
template <class Real>
const Real* key_delta_row(bool is_key, int head, int head_dim, ParamValues<Real> params) {
  if (!is_key || params.empty()) return nullptr;
  return params[0] + static_cast<std::int64_t>(head) * head_dim;
}

// cos/sin of channel c's phase at position p: p·ω_c, plus the acting δ_c on keys.
template <class Real>
Rotation channel_rotation(double p, double omega, DeltaBound bound, const Real* delta, int c) {
  return rotation_by(p * omega + (delta ? acting_delta(bound, delta[c]) : 0.0));
}

}  // namespace

PopeEncoding::PopeEncoding(PopeConfig config)
    : config_(std::move(config)) {
  if (!(config_.base > 1.0))
    throw ConfigError("model.position.pope.base", "expected a base > 1, got " + std::to_string(config_.base));
}

double PopeEncoding::softmax_scale(const PositionContext& ctx) const {
  const double width = config_.scale == PopeScale::inv_sqrt_2d ? 2.0 * ctx.head_dim : ctx.head_dim;
  return 1.0 / std::sqrt(width);
}

std::vector<ParamSpec> PopeEncoding::layer_parameters(int n_head, int head_dim) const {
  if (!config_.learn_delta) return {};
  ParamSpec delta{"delta", {n_head, head_dim}, /*weight_decay=*/false, InitKind::zeros};
  if (config_.delta_init == DeltaInit::uniform) {
    delta.init = InitKind::uniform;
    delta.init_a = -kTwoPi;
    delta.init_b = 0.0;
  }
  if (config_.delta_bound == DeltaBound::project) delta.bounds = ParamBounds{-kTwoPi, 0.0};
  return {delta};
}

TransformPlan PopeEncoding::transform_plan(const PositionContext& ctx) const {
  TransformPlan plan;
  plan.kind = TransformKind::polar;
  plan.frequencies = frequencies(ctx.head_dim);
  plan.magnitude = config_.magnitude;
  plan.delta_param = config_.learn_delta ? 0 : -1;
  plan.clamp_delta = config_.delta_bound == DeltaBound::clamp;
  return plan;
}

std::vector<double> PopeEncoding::frequencies(int head_dim) const {
  return geometric_frequencies(config_.base, head_dim, 1.0 / head_dim);
}

template <class Real>
void PopeEncoding::transform(const QkTransformArgs<Real>& a) const {
  check_transform_args("pope transform", a, param_count());
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const std::vector<double> omega = frequencies(d);
  const Real* delta = key_delta_row(a.is_key, a.head, d, a.params);
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* x = a.x + row * a.x_stride;
    Real* y = a.y + static_cast<std::int64_t>(row) * 2 * d;
    const double p = absolute_position(ctx, row);
    for (int c = 0; c < d; ++c) {
      const Rotation r = channel_rotation(p, omega[c], config_.delta_bound, delta, c);
      const double mu = magnitude_of(config_.magnitude, x[c]);
      y[c] = static_cast<Real>(mu * r.cos);
      y[d + c] = static_cast<Real>(mu * r.sin);
    }
  }
}

template <class Real>
void PopeEncoding::transform_backward(const QkTransformBackwardArgs<Real>& a) const {
  check_transform_backward_args("pope transform backward", a, param_count());
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const std::vector<double> omega = frequencies(d);
  const Real* delta = key_delta_row(a.is_key, a.head, d, a.params);
  Real* ddelta = delta ? a.dparams[0] + static_cast<std::int64_t>(a.head) * d : nullptr;
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* x = a.x + row * a.x_stride;
    const Real* dy = a.dy + static_cast<std::int64_t>(row) * 2 * d;
    Real* dx = a.dx + row * a.dx_stride;
    const double p = absolute_position(ctx, row);
    for (int c = 0; c < d; ++c) {
      const Rotation r = channel_rotation(p, omega[c], config_.delta_bound, delta, c);
      const double g_re = dy[c];
      const double g_im = dy[d + c];
      const double dmu = g_re * r.cos + g_im * r.sin;
      dx[c] += static_cast<Real>(dmu * magnitude_derivative(config_.magnitude, x[c]));
      if (ddelta && delta_passes_gradient(config_.delta_bound, delta[c])) {
        const double mu = magnitude_of(config_.magnitude, x[c]);
        ddelta[c] += static_cast<Real>(mu * (-g_re * r.sin + g_im * r.cos));
      }
    }
  }
}

template void PopeEncoding::transform<float>(const QkTransformArgs<float>&) const;
template void PopeEncoding::transform<double>(const QkTransformArgs<double>&) const;
template void PopeEncoding::transform_backward<float>(const QkTransformBackwardArgs<float>&) const;
template void PopeEncoding::transform_backward<double>(const QkTransformBackwardArgs<double>&) const;

}  // namespace pope
