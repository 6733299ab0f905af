#include "position/pj_bias_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "position/math.hpp"

namespace pope {

namespace {

// softmax of logits[0..count) into out, restricted to the entries `keep` allows (the others
// are exactly 0). Max-subtracted so large logits do not overflow.
template <class Real, class Keep>
void masked_softmax(const Real* logits, int count, Keep keep, double* out) {
  double top = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < count; ++i)
    if (keep(i)) top = std::max(top, static_cast<double>(logits[i]));
  double total = 0.0;
  for (int i = 0; i < count; ++i) {
    out[i] = keep(i) ? std::exp(static_cast<double>(logits[i]) - top) : 0.0;
    total += out[i];
  }
  for (int i = 0; i < count; ++i) out[i] /= total;
}

template <class Real>
const Real* head_row(ParamValues<Real> params, PjParam which, int head, int width) {
  return params[which] + static_cast<std::int64_t>(head) * width;
}

template <class Real>
void add_row(const PjOrderArray& values, int count, Real* row) {
  for (int r = 0; r < count; ++r) row[r] += static_cast<Real>(values[static_cast<std::size_t>(r)]);
}

}  // namespace

template <class Real>
PjHead resolve_pj_head(ParamValues<Real> params, int head, int order, const PjSectorMask& enabled) {
  const int orders = order + 1;
  PjHead h;
  h.order = order;
  h.omega = params[kPjOmega][head];
  const double damping_raw = params[kPjFjDamping][head];
  h.damping = softplus(damping_raw);
  h.damping_slope = softplus_derivative(damping_raw);
  const double slope_raw = params[kPjAffineSlope][head];
  h.slope = softplus(slope_raw);
  h.slope_slope = softplus_derivative(slope_raw);
  masked_softmax(head_row(params, kPjGateLogits, head, kPjSectorCount), kPjSectorCount,
                 [&](int k) { return enabled[static_cast<std::size_t>(k)]; }, h.gate.data());
  const auto all = [](int) { return true; };
  masked_softmax(head_row(params, kPjFjOrderLogits, head, orders), orders, all, h.fj_alpha.data());
  masked_softmax(head_row(params, kPjLcOrderLogits, head, orders), orders, all, h.lc_alpha.data());
  const Real* fj_re = head_row(params, kPjFjRe, head, orders);
  const Real* fj_im = head_row(params, kPjFjIm, head, orders);
  const Real* lc_re = head_row(params, kPjLcRe, head, orders);
  const Real* lc_im = head_row(params, kPjLcIm, head, orders);
  for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
    h.fj_re[r] = fj_re[r];
    h.fj_im[r] = fj_im[r];
    h.lc_re[r] = lc_re[r];
    h.lc_im[r] = lc_im[r];
  }
  return h;
}

PjLag evaluate_pj_lag(const PjHead& head, int lag, double train_length, PjRho rho, const PjSectorMask& enabled) {
  PjLag t;
  const double L = train_length;
  t.lag = lag;
  t.x = lag / L;
  t.rho = rho == PjRho::linear ? t.x : std::asinh(t.x);
  t.phi = L * std::asinh(t.x);
  t.beta = lag / std::sqrt(static_cast<double>(lag) * lag + L * L);
  const int orders = head.order + 1;

  if (enabled[kPjFourierJet]) {
    t.fj_cos = std::cos(head.omega * lag);
    t.fj_sin = std::sin(head.omega * lag);
    double basis = std::exp(-head.damping * t.x);  // F_0; F_r = F_{r−1}·x/r
    for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
      if (r > 0) basis *= t.x / static_cast<double>(r);
      t.fj_basis[r] = basis;
      t.fj_real[r] = head.fj_re[r] * t.fj_cos - head.fj_im[r] * t.fj_sin;
      t.sector[kPjFourierJet] += head.fj_alpha[r] * basis * t.fj_real[r];
    }
  }
  if (enabled[kPjAffine]) t.sector[kPjAffine] = -head.slope * t.rho;
  if (enabled[kPjLightCone]) {
    t.lc_cos = std::cos(head.omega * t.phi);
    t.lc_sin = std::sin(head.omega * t.phi);
    double basis = 1.0;  // B_r = β^r
    for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
      if (r > 0) basis *= t.beta;
      t.lc_basis[r] = basis;
      t.lc_real[r] = head.lc_re[r] * t.lc_cos - head.lc_im[r] * t.lc_sin;
      t.sector[kPjLightCone] += head.lc_alpha[r] * basis * t.lc_real[r];
    }
  }
  for (int k = 0; k < kPjSectorCount; ++k) t.bias += head.gate[static_cast<std::size_t>(k)] * t.sector[static_cast<std::size_t>(k)];
  return t;
}

void accumulate_pj_lag_gradient(const PjHead& head, const PjLag& t, double G, const PjSectorMask& enabled,
                                PjHeadGradient& grad) {
  const int orders = head.order + 1;
  for (std::size_t k = 0; k < kPjSectorCount; ++k)
    if (enabled[k]) grad.gate_logits[k] += G * head.gate[k] * (t.sector[k] - t.bias);

  if (enabled[kPjFourierJet]) {
    const double g = G * head.gate[kPjFourierJet];
    const double fj = t.sector[kPjFourierJet];
    double omega_sum = 0.0;  // Σ_r α_r F_r (u_r sin + v_r cos)
    for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
      const double weight = head.fj_alpha[r] * t.fj_basis[r];
      grad.fj_re[r] += g * weight * t.fj_cos;
      grad.fj_im[r] -= g * weight * t.fj_sin;
      grad.fj_order[r] += g * head.fj_alpha[r] * (t.fj_basis[r] * t.fj_real[r] - fj);
      omega_sum += weight * (head.fj_re[r] * t.fj_sin + head.fj_im[r] * t.fj_cos);
    }
    grad.fj_damping -= g * t.x * fj * head.damping_slope;
    grad.omega -= g * t.lag * omega_sum;
  }
  if (enabled[kPjAffine]) grad.affine_slope -= G * head.gate[kPjAffine] * t.rho * head.slope_slope;
  if (enabled[kPjLightCone]) {
    const double g = G * head.gate[kPjLightCone];
    const double lc = t.sector[kPjLightCone];
    double omega_sum = 0.0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(orders); ++r) {
      const double weight = head.lc_alpha[r] * t.lc_basis[r];
      grad.lc_re[r] += g * weight * t.lc_cos;
      grad.lc_im[r] -= g * weight * t.lc_sin;
      grad.lc_order[r] += g * head.lc_alpha[r] * (t.lc_basis[r] * t.lc_real[r] - lc);
      omega_sum += weight * (head.lc_re[r] * t.lc_sin + head.lc_im[r] * t.lc_cos);
    }
    grad.omega -= g * t.phi * omega_sum;
  }
}

template <class Real>
void add_pj_head_gradient(const PjHeadGradient& grad, int head, int order, ParamGrads<Real> dparams) {
  const int orders = order + 1;
  const auto row = [&](PjParam which, int width) { return dparams[which] + static_cast<std::int64_t>(head) * width; };
  dparams[kPjOmega][head] += static_cast<Real>(grad.omega);
  dparams[kPjFjDamping][head] += static_cast<Real>(grad.fj_damping);
  dparams[kPjAffineSlope][head] += static_cast<Real>(grad.affine_slope);
  Real* gates = row(kPjGateLogits, kPjSectorCount);
  for (std::size_t k = 0; k < kPjSectorCount; ++k) gates[k] += static_cast<Real>(grad.gate_logits[k]);
  add_row(grad.fj_order, orders, row(kPjFjOrderLogits, orders));
  add_row(grad.fj_re, orders, row(kPjFjRe, orders));
  add_row(grad.fj_im, orders, row(kPjFjIm, orders));
  add_row(grad.lc_order, orders, row(kPjLcOrderLogits, orders));
  add_row(grad.lc_re, orders, row(kPjLcRe, orders));
  add_row(grad.lc_im, orders, row(kPjLcIm, orders));
}

double pj_order_term(const PjHead& head, const PjLag& t, int order) {
  const auto r = static_cast<std::size_t>(order);
  return head.gate[kPjFourierJet] * head.fj_alpha[r] * t.fj_basis[r] * t.fj_real[r] +
         head.gate[kPjLightCone] * head.lc_alpha[r] * t.lc_basis[r] * t.lc_real[r];
}

template PjHead resolve_pj_head<float>(ParamValues<float>, int, int, const PjSectorMask&);
template PjHead resolve_pj_head<double>(ParamValues<double>, int, int, const PjSectorMask&);
template void add_pj_head_gradient<float>(const PjHeadGradient&, int, int, ParamGrads<float>);
template void add_pj_head_gradient<double>(const PjHeadGradient&, int, int, ParamGrads<double>);

}  // namespace pope
