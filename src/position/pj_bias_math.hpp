// The PJ-bias b_h(Δ) of one head (docs/encodings.md, section 5.1), in double:
// resolving the raw parameters (softmax gates and order weights, softplus damping and
// slope), evaluating every term at one lag, and the closed-form parameter gradients.
// PjBiasEncoding builds its bias table and backward from these, and the diagnostics read
// the same per-order terms, so the definition lives in one place.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "pope/position.hpp"
#include "position/registry.hpp"

namespace pope {

// The parameters of one PJ-bias layer, in layer_parameters() order. Shapes: omega,
// fj_damping, affine_slope [H]; gate_logits [H, 3] (FJ, A, LC); the rest [H, K + 1].
enum PjParam : std::size_t {
  kPjOmega,          // ω_h, shared by FJ and LC
  kPjGateLogits,     // γ_h
  kPjFjOrderLogits,  // a_{h,r}: α = softmax_r(a)
  kPjFjRe,           // u_{h,r}
  kPjFjIm,           // v_{h,r}
  kPjFjDamping,      // λ̃_h: λ = softplus(λ̃)
  kPjAffineSlope,    // s̃_h: s = softplus(s̃)
  kPjLcOrderLogits,  // a'_{h,r}
  kPjLcRe,           // u'_{h,r}
  kPjLcIm,           // v'_{h,r}
  kPjParamCount
};

using PjOrderArray = std::array<double, kMaxPjOrder + 1>;

// One head's parameters after the softmaxes and softplus; sectors that are disabled have
// gate exactly 0.
struct PjHead {
  int order = 0;
  double omega = 0.0;
  double damping = 0.0, damping_slope = 0.0;  // λ and dλ/dλ̃
  double slope = 0.0, slope_slope = 0.0;      // s and ds/ds̃
  std::array<double, kPjSectorCount> gate{};
  PjOrderArray fj_alpha{}, fj_re{}, fj_im{};
  PjOrderArray lc_alpha{}, lc_re{}, lc_im{};
};

// Everything of b_h at one lag Δ: the coordinates, the per-order pieces (F_r, Re_r, B_r,
// Re'_r), the un-gated sector sums and the gated total. Disabled sectors stay 0.
struct PjLag {
  double lag = 0.0, x = 0.0, rho = 0.0, phi = 0.0, beta = 0.0;
  double fj_cos = 1.0, fj_sin = 0.0, lc_cos = 1.0, lc_sin = 0.0;
  PjOrderArray fj_basis{}, fj_real{};  // F_r = x^r/r!·e^{−λx}, Re_r = u_r cos ωΔ − v_r sin ωΔ
  PjOrderArray lc_basis{}, lc_real{};  // B_r = β^r, Re'_r at ωφ
  std::array<double, kPjSectorCount> sector{};  // FJ, A, LC (un-gated)
  double bias = 0.0;
};

// dL/d(raw parameter) of one head, accumulated over lags.
struct PjHeadGradient {
  double omega = 0.0, fj_damping = 0.0, affine_slope = 0.0;
  std::array<double, kPjSectorCount> gate_logits{};
  PjOrderArray fj_order{}, fj_re{}, fj_im{};
  PjOrderArray lc_order{}, lc_re{}, lc_im{};
};

// Reads head `head` of a layer's PJ-bias parameters (kPjParamCount pointers).
template <class Real>
PjHead resolve_pj_head(ParamValues<Real> params, int head, int order, const PjSectorMask& enabled);

// The terms of b_h at `lag` with L = train_length.
PjLag evaluate_pj_lag(const PjHead& head, int lag, double train_length, PjRho rho, const PjSectorMask& enabled);

// gradient += diag_grad · ∂b_h(Δ)/∂θ for every raw parameter θ (the closed forms of 5.1).
void accumulate_pj_lag_gradient(const PjHead& head, const PjLag& terms, double diag_grad, const PjSectorMask& enabled,
                                PjHeadGradient& gradient);

// Adds `gradient` into head `head`'s rows of the layer's gradient buffers.
template <class Real>
void add_pj_head_gradient(const PjHeadGradient& gradient, int head, int order, ParamGrads<Real> dparams);

// The gated order-r part of FJ + LC at one lag: g_FJ α_r F_r Re_r + g_LC α'_r B_r Re'_r.
double pj_order_term(const PjHead& head, const PjLag& terms, int r);

}  // namespace pope
