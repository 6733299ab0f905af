// Small pieces of math shared by the rotating encodings (RoPE, PoPE, and later PJ-rotary):
// geometric frequency tables, absolute positions, and 2-D rotations whose angles are formed
// in double.
//
// Why double angles: position × frequency reaches ~16000 rad at long context; a float angle
// there is only accurate to ~1e-3 rad, which visibly perturbs cos/sin. Forming p·ω (+ δ) in
// double and evaluating cos/sin in double keeps the float path as accurate as its storage.
#pragma once

#include <cmath>
#include <vector>

#include "pope/position.hpp"

namespace pope {

// ω_m = base^(−m·exponent_step), m = 0..count−1. RoPE: count d/2, step 2/d; PoPE: count d,
// step 1/d; PJ-rotary: count M, step 1/M.
inline std::vector<double> geometric_frequencies(double base, int count, double exponent_step) {
  std::vector<double> frequencies(static_cast<std::size_t>(count));
  for (int m = 0; m < count; ++m) frequencies[static_cast<std::size_t>(m)] = std::pow(base, -m * exponent_step);
  return frequencies;
}

// softplus(x) = ln(1 + eˣ), taken as x above 20 (the dropped ln(1 + e^−x) < 2.1e−9 is
// negligible next to x, and eˣ would overflow for large x). Shared by PoPE's magnitudes and the
// PJ-bias's damping and slope, so both see the same function and derivative.
inline constexpr double kSoftplusLinearFrom = 20.0;
inline double softplus(double x) { return x > kSoftplusLinearFrom ? x : std::log1p(std::exp(x)); }
// d softplus / dx of exactly the function above: the logistic sigmoid, 1 on the linear part.
inline double softplus_derivative(double x) { return x > kSoftplusLinearFrom ? 1.0 : 1.0 / (1.0 + std::exp(-x)); }
// y = softplus(x) solved for x (y > 0), with the same linear tail.
inline double softplus_inverse(double y) { return y > kSoftplusLinearFrom ? y : std::log(std::expm1(y)); }

// Absolute position of row `row` of this call (rows start at ctx.position_offset).
inline double absolute_position(const PositionContext& ctx, int row) {
  return static_cast<double>(ctx.position_offset) + static_cast<double>(row);
}

struct Rotation {
  double cos = 1.0;
  double sin = 0.0;
};

inline Rotation rotation_by(double angle) { return {std::cos(angle), std::sin(angle)}; }

// (a, b) rotated by +angle: (a cos − b sin, a sin + b cos). Inputs are taken in double so
// callers may rotate values they computed in double (e.g. PJ-rotary's sheared pairs).
template <class Real>
void rotate_pair(double a, double b, Rotation r, Real& out_a, Real& out_b) {
  out_a = static_cast<Real>(a * r.cos - b * r.sin);
  out_b = static_cast<Real>(a * r.sin + b * r.cos);
}

// Backward of rotate_pair: the gradient (ga, gb) of the rotated pair, rotated back by −angle,
// ACCUMULATED into (da, db).
template <class Real>
void accumulate_unrotated(double ga, double gb, Rotation r, Real& da, Real& db) {
  da += static_cast<Real>(ga * r.cos + gb * r.sin);
  db += static_cast<Real>(-ga * r.sin + gb * r.cos);
}

}  // namespace pope
