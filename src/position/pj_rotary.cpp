// PJ-rotary (docs/encodings.md, section 5.2): per block a shear by the jet
// matrix exp(±c_p N) and a rotation by ω_m·p of all K+1 complex channels.
//   query  y_r = Σ_{t ≥ r} c^{t−r}/(t−r)! · z_t        (exp(cN))
//   key    y_r = Σ_{t ≤ r} (−c)^{r−t}/(r−t)! · z_t     (exp(−cNᵀ))
// then every y_r is rotated by +ω_m·p. The backward un-rotates the gradient and applies the
// transposed shear.
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "position/checks.hpp"
#include "position/encodings.hpp"
#include "position/math.hpp"

namespace pope {

namespace {

using JetPowers = std::array<double, kMaxPjOrder + 1>;

// c^n/n! for n = 0..K (the entries of exp(cN) along its n-th superdiagonal).
JetPowers shear_powers(double c, int order) {
  JetPowers powers{};
  powers[0] = 1.0;
  for (int n = 1; n <= order; ++n) powers[static_cast<std::size_t>(n)] = powers[static_cast<std::size_t>(n - 1)] * c / n;
  return powers;
}

// The shear at one position: exp(cN) for queries, exp(−cNᵀ) for keys.
struct Shear {
  JetPowers query, key;  // c^n/n! and (−c)^n/n!
  // Entry (out, in); 0 outside the matrix's triangle.
  double at(bool is_key, int out, int in) const {
    if (!is_key) return in >= out ? query[static_cast<std::size_t>(in - out)] : 0.0;
    return in <= out ? key[static_cast<std::size_t>(out - in)] : 0.0;
  }
};

Shear shear_at(double c, int order) { return {shear_powers(c, order), shear_powers(-c, order)}; }

}  // namespace

PjRotaryEncoding::PjRotaryEncoding(const PjConfig& config) : config_(config) {
  if (config_.rotary_order < 0 || config_.rotary_order > kMaxPjOrder)
    throw ConfigError("model.position.pj.rotary_order", "expected a jet order in [0, " + std::to_string(kMaxPjOrder) +
                                                            "], got " + std::to_string(config_.rotary_order));
  if (!(config_.rotary_base > 1.0))
    throw ConfigError("model.position.pj.rotary_base", "expected a base > 1, got " + std::to_string(config_.rotary_base));
  if (!(config_.rotary_eta >= 0.0))
    throw ConfigError("model.position.pj.rotary_eta",
                      "expected a shear rate >= 0, got " + std::to_string(config_.rotary_eta));
}

int PjRotaryEncoding::blocks(int head_dim) const {
  const int block_width = 2 * (config_.rotary_order + 1);
  if (head_dim <= 0 || head_dim % block_width != 0)
    throw ConfigError("model.position.pj.rotary_order",
                      "rotary_order " + std::to_string(config_.rotary_order) + " needs blocks of " +
                          std::to_string(block_width) + " dims, which must divide the head dim " +
                          std::to_string(head_dim));
  return head_dim / block_width;
}

std::vector<double> PjRotaryEncoding::frequencies(int head_dim) const {
  const int M = blocks(head_dim);
  return geometric_frequencies(config_.rotary_base, M, 1.0 / M);
}

double PjRotaryEncoding::shear_rate(const PositionContext& ctx, std::string_view op) const {
  if (ctx.train_length <= 0) throw std::invalid_argument(std::string(op) + ": context has no train_length");
  return config_.rotary_eta / ctx.train_length;
}

TransformPlan PjRotaryEncoding::transform_plan(const PositionContext& ctx) const {
  TransformPlan plan;
  plan.kind = TransformKind::jet_rotary;
  plan.frequencies = frequencies(ctx.head_dim);
  plan.jet_order = order();
  plan.shear_rate = shear_rate(ctx, "pj_rotary plan");
  return plan;
}

template <class Real>
void PjRotaryEncoding::transform(const QkTransformArgs<Real>& a) const {
  check_transform_args("pj_rotary transform", a, 0);
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const int channels = config_.rotary_order + 1;
  const std::vector<double> omega = frequencies(d);
  const double rate = shear_rate(ctx, "pj_rotary transform");
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* x = a.x + row * a.x_stride;
    Real* y = a.y + static_cast<std::int64_t>(row) * d;
    const double p = absolute_position(ctx, row);
    const Shear shear = shear_at(rate * p, config_.rotary_order);
    for (std::size_t m = 0; m < omega.size(); ++m) {
      const Rotation turn = rotation_by(p * omega[m]);
      const Real* z = x + m * 2 * channels;
      Real* out = y + m * 2 * channels;
      for (int r = 0; r < channels; ++r) {
        double re = 0.0, im = 0.0;
        for (int t = 0; t < channels; ++t) {
          const double w = shear.at(a.is_key, r, t);
          re += w * z[2 * t];
          im += w * z[2 * t + 1];
        }
        rotate_pair(re, im, turn, out[2 * r], out[2 * r + 1]);
      }
    }
  }
}

template <class Real>
void PjRotaryEncoding::transform_backward(const QkTransformBackwardArgs<Real>& a) const {
  check_transform_backward_args("pj_rotary transform backward", a, 0);
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const int channels = config_.rotary_order + 1;
  const std::vector<double> omega = frequencies(d);
  const double rate = shear_rate(ctx, "pj_rotary transform backward");
  std::array<double, 2 * (kMaxPjOrder + 1)> unrotated{};
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* dy = a.dy + static_cast<std::int64_t>(row) * d;
    Real* dx = a.dx + row * a.dx_stride;
    const double p = absolute_position(ctx, row);
    const Shear shear = shear_at(rate * p, config_.rotary_order);
    for (std::size_t m = 0; m < omega.size(); ++m) {
      const Rotation turn = rotation_by(p * omega[m]);
      const Real* w = dy + m * 2 * channels;
      Real* dz = dx + m * 2 * channels;
      unrotated.fill(0.0);
      for (int r = 0; r < channels; ++r)
        accumulate_unrotated(w[2 * r], w[2 * r + 1], turn, unrotated[2 * r], unrotated[2 * r + 1]);
      for (int t = 0; t < channels; ++t) {
        double re = 0.0, im = 0.0;
        for (int r = 0; r < channels; ++r) {
          const double s = shear.at(a.is_key, r, t);
          re += s * unrotated[2 * r];
          im += s * unrotated[2 * r + 1];
        }
        dz[2 * t] += static_cast<Real>(re);
        dz[2 * t + 1] += static_cast<Real>(im);
      }
    }
  }
}

template void PjRotaryEncoding::transform<float>(const QkTransformArgs<float>&) const;
template void PjRotaryEncoding::transform<double>(const QkTransformArgs<double>&) const;
template void PjRotaryEncoding::transform_backward<float>(const QkTransformBackwardArgs<float>&) const;
template void PjRotaryEncoding::transform_backward<double>(const QkTransformBackwardArgs<double>&) const;

}  // namespace pope
