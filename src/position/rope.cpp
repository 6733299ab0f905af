// RoPE (docs/encodings.md, section 2): NeoX half-split rotation of the first
// r channels of each head's q and k rows. Backward rotates the gradient back by −angle.
#include <cmath>
#include <utility>

#include "position/checks.hpp"
#include "position/encodings.hpp"
#include "position/math.hpp"
#include "position/rope_frequencies.hpp"

namespace pope {

RopeEncoding::RopeEncoding(RopeConfig config) : config_(std::move(config)) { validate_rope_config(config_); }

double RopeEncoding::softmax_scale(const PositionContext& ctx) const {
  const double t = rope_qk_multiplier(config_.scaling);
  return t * t / std::sqrt(static_cast<double>(ctx.head_dim));
}

std::vector<double> RopeEncoding::frequencies(const PositionContext& ctx) const {
  const int rotary_dim = rope_rotary_dim(config_.fraction, ctx.head_dim);
  return rope_frequencies(config_, rotary_dim, ctx.train_length, ctx.position_offset + ctx.seq_len);
}

TransformPlan RopeEncoding::transform_plan(const PositionContext& ctx) const {
  TransformPlan plan;
  plan.kind = TransformKind::rotary;
  plan.frequencies = frequencies(ctx);
  return plan;
}

template <class Real>
void RopeEncoding::transform(const QkTransformArgs<Real>& a) const {
  check_transform_args("rope transform", a, 0);
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const int half = rope_rotary_dim(config_.fraction, d) / 2;
  const std::vector<double> theta = frequencies(ctx);
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* x = a.x + row * a.x_stride;
    Real* y = a.y + static_cast<std::int64_t>(row) * d;
    const double p = absolute_position(ctx, row);
    for (int m = 0; m < half; ++m) rotate_pair(x[m], x[m + half], rotation_by(p * theta[m]), y[m], y[m + half]);
    for (int c = 2 * half; c < d; ++c) y[c] = x[c];
  }
}

template <class Real>
void RopeEncoding::transform_backward(const QkTransformBackwardArgs<Real>& a) const {
  check_transform_backward_args("rope transform backward", a, 0);
  const PositionContext& ctx = *a.ctx;
  const int d = ctx.head_dim;
  const int half = rope_rotary_dim(config_.fraction, d) / 2;
  const std::vector<double> theta = frequencies(ctx);
  for (int row = 0; row < ctx.seq_len; ++row) {
    const Real* dy = a.dy + static_cast<std::int64_t>(row) * d;
    Real* dx = a.dx + row * a.dx_stride;
    const double p = absolute_position(ctx, row);
    for (int m = 0; m < half; ++m)
      accumulate_unrotated(dy[m], dy[m + half], rotation_by(p * theta[m]), dx[m], dx[m + half]);
    for (int c = 2 * half; c < d; ++c) dx[c] += dy[c];
  }
}

template void RopeEncoding::transform<float>(const QkTransformArgs<float>&) const;
template void RopeEncoding::transform<double>(const QkTransformArgs<double>&) const;
template void RopeEncoding::transform_backward<float>(const QkTransformBackwardArgs<float>&) const;
template void RopeEncoding::transform_backward<double>(const QkTransformBackwardArgs<double>&) const;

}  // namespace pope
