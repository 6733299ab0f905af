// Helpers for the positional-encoding tests: run an encoding's q/k transform on explicit
// rows, form scores between transformed rows, and finite-difference check the transform's
// backward (dx and parameter gradients) with the random linear loss L = Σ w ⊙ y.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "gradient_check.hpp"
#include "pope/position.hpp"

namespace pope::testing {

inline PositionContext make_context(int seq_len, int head_dim, int n_head = 2, int position_offset = 0,
                                    int train_length = 1024) {
  PositionContext ctx;
  ctx.seq_len = seq_len;
  ctx.train_length = train_length;
  ctx.n_head = n_head;
  ctx.head_dim = head_dim;
  ctx.position_offset = position_offset;
  return ctx;
}

inline std::vector<double> random_values(std::size_t count, double low, double high, unsigned seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> uniform(low, high);
  std::vector<double> values(count);
  for (double& v : values) v = uniform(engine);
  return values;
}

// Pointers to each parameter buffer, in layer_parameters() order.
template <class Real>
std::vector<const Real*> value_pointers(const std::vector<std::vector<Real>>& params) {
  std::vector<const Real*> pointers;
  for (const auto& p : params) pointers.push_back(p.data());
  return pointers;
}
template <class Real>
std::vector<Real*> gradient_pointers(std::vector<std::vector<Real>>& grads) {
  std::vector<Real*> pointers;
  for (auto& g : grads) pointers.push_back(g.data());
  return pointers;
}

// y [T, qk_width] of the transform of x (rows of `x_stride`).
template <class Real>
std::vector<Real> transform_rows(const PositionEncoding& encoding, const PositionContext& ctx, int head, bool is_key,
                                 const std::vector<Real>& x, std::int64_t x_stride,
                                 const std::vector<std::vector<Real>>& params = {}) {
  std::vector<Real> y(static_cast<std::size_t>(ctx.seq_len) * encoding.qk_width(ctx.head_dim));
  const std::vector<const Real*> param_pointers = value_pointers(params);
  QkTransformArgs<Real> args;
  args.ctx = &ctx;
  args.head = head;
  args.is_key = is_key;
  args.x = x.data();
  args.x_stride = x_stride;
  args.y = y.data();
  args.params = param_pointers;
  encoding.transform_qk(args);
  return y;
}

// The transformed feature of one row placed at absolute position `position`.
template <class Real>
std::vector<Real> transform_at(const PositionEncoding& encoding, PositionContext ctx, int position, int head,
                               bool is_key, const std::vector<Real>& row,
                               const std::vector<std::vector<Real>>& params = {}) {
  ctx.seq_len = 1;
  ctx.position_offset = position;
  return transform_rows(encoding, ctx, head, is_key, row, ctx.head_dim, params);
}

inline double dot(std::span<const double> a, std::span<const double> b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// <q̃_t, k̃_s> (unscaled) for query content q at t and key content k at s.
inline double transformed_score(const PositionEncoding& encoding, const PositionContext& ctx, int head,
                                const std::vector<double>& q, int t, const std::vector<double>& k, int s,
                                const std::vector<std::vector<double>>& params = {}) {
  return dot(transform_at(encoding, ctx, t, head, false, q, params),
             transform_at(encoding, ctx, s, head, true, k, params));
}

// Backward of the transform for dy, accumulated into the given dx (rows of x_stride) and
// parameter gradients.
inline void transform_backward_rows(const PositionEncoding& encoding, const PositionContext& ctx, int head, bool is_key,
                                    const std::vector<double>& x, std::int64_t x_stride,
                                    const std::vector<std::vector<double>>& params, const std::vector<double>& dy,
                                    std::vector<double>& dx, std::vector<std::vector<double>>& dparams) {
  const std::vector<const double*> param_pointers = value_pointers(params);
  const std::vector<double*> grad_pointers = gradient_pointers(dparams);
  QkTransformBackwardArgs<double> args;
  args.ctx = &ctx;
  args.head = head;
  args.is_key = is_key;
  args.x = x.data();
  args.x_stride = x_stride;
  args.dy = dy.data();
  args.dx = dx.data();
  args.dx_stride = x_stride;
  args.params = param_pointers;
  args.dparams = grad_pointers;
  encoding.transform_qk_backward(args);
}

// Largest relative error between the transform's backward and central differences, over
// dx and every parameter, for L = Σ w ⊙ y with random w. `x` and `params` are the point
// of evaluation (they are perturbed and restored).
inline double transform_gradient_error(const PositionEncoding& encoding, const PositionContext& ctx, int head,
                                       bool is_key, std::vector<double>& x, std::int64_t x_stride,
                                       std::vector<std::vector<double>>& params) {
  const std::size_t out_size = static_cast<std::size_t>(ctx.seq_len) * encoding.qk_width(ctx.head_dim);
  const std::vector<double> w = random_values(out_size, -1.0, 1.0, 7);
  const auto loss = [&] { return dot(w, transform_rows(encoding, ctx, head, is_key, x, x_stride, params)); };

  std::vector<double> dx(x.size(), 0.0);
  std::vector<std::vector<double>> dparams;
  for (const auto& p : params) dparams.emplace_back(p.size(), 0.0);
  transform_backward_rows(encoding, ctx, head, is_key, x, x_stride, params, w, dx, dparams);

  double worst = max_relative_gradient_error(loss, x, dx);
  for (std::size_t i = 0; i < params.size(); ++i)
    worst = std::max(worst, max_relative_gradient_error(loss, params[i], dparams[i]));
  return worst;
}

}  // namespace pope::testing
