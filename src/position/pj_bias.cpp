// PJ-bias (docs/encodings.md, section 5.1): parameters, their init modes, the
// bias table and its backward from the diagonal sums. The math itself is pj_bias_math.
#include <cmath>
#include <numbers>
#include <string>

#include "position/checks.hpp"
#include "position/encodings.hpp"
#include "position/math.hpp"

namespace pope {

namespace {

constexpr double kTwoPi = 2.0 * std::numbers::pi;
// The paper's LM init: γ favouring the affine sector, s = 2, λ̃ = −2, ζ ~ 0.02·N(0, 1).
constexpr std::array<double, kPjSectorCount> kAffineGateLogits{-2.0, 2.0, -2.0};
constexpr double kAffineInitSlope = 2.0;
constexpr double kInitDampingRaw = -2.0;
constexpr double kAmplitudeInitStd = 0.02;
// ω_h = 2π·c_h/L with c_h = linspace(1, 17, H): between 1 and 17 periods over L_train.
constexpr double kFirstPeriods = 1.0;
constexpr double kLastPeriods = 17.0;
// gate_init = zero: s̃ = −10 gives s ≈ 4.5e−5, an affine slope of practically nothing.
constexpr double kZeroInitSlopeRaw = -10.0;

}  // namespace

PjBiasEncoding::PjBiasEncoding(const PjConfig& config, PjSectorMask sectors, int train_length)
    : config_(config), sectors_(sectors), rho_(config.rho), train_length_(train_length) {
  if (config_.order < 0 || config_.order > kMaxPjOrder)
    throw ConfigError("model.position.pj.order", "expected a jet order in [0, " + std::to_string(kMaxPjOrder) +
                                                     "], got " + std::to_string(config_.order));
  if (train_length_ <= 0)
    throw ConfigError("model.context_length",
                      "the PJ-bias needs the training length L_train > 0, got " + std::to_string(train_length_));
  if (!sectors_[kPjFourierJet] && !sectors_[kPjAffine] && !sectors_[kPjLightCone])
    throw std::invalid_argument("PjBiasEncoding: at least one sector must be enabled");
}

std::array<double, kPjSectorCount> PjBiasEncoding::initial_gate_logits() const {
  // Only `uniform` changes the gates; `alibi` and `zero` change the slope / amplitudes of
  // the default (affine) init and keep its gates.
  if (config_.gate_init == PjGateInit::uniform) return {0.0, 0.0, 0.0};
  return kAffineGateLogits;
}

BiasPlan PjBiasEncoding::bias_plan(const PositionContext&) const {
  BiasPlan plan;
  plan.kind = BiasKind::pj;
  plan.pj.order = config_.order;
  plan.pj.train_length = train_length_;
  plan.pj.lightcone_rho = rho_ == PjRho::lightcone;
  for (int k = 0; k < kPjSectorCount; ++k) plan.pj.sectors[std::size_t(k)] = sectors_[std::size_t(k)];
  return plan;
}

std::vector<ParamSpec> PjBiasEncoding::layer_parameters(int n_head, int) const {
  const int orders = config_.order + 1;
  const bool zero_amplitudes = config_.gate_init == PjGateInit::zero;
  const auto amplitude = [&](const char* name) {
    ParamSpec spec{name, {n_head, orders}, /*weight_decay=*/false, InitKind::normal, kAmplitudeInitStd};
    if (zero_amplitudes) spec.init = InitKind::zeros;
    return spec;
  };
  const auto custom = [&](const char* name, Shape shape) {
    return ParamSpec{name, std::move(shape), /*weight_decay=*/false, InitKind::custom};
  };
  const auto zeros = [&](const char* name) {
    return ParamSpec{name, {n_head, orders}, /*weight_decay=*/false, InitKind::zeros};
  };
  // Order must match PjParam.
  return {custom("omega", {n_head}),
          custom("gate_logits", {n_head, kPjSectorCount}),
          zeros("fj_order_logits"),
          amplitude("fj_re"),
          amplitude("fj_im"),
          custom("fj_damping", {n_head}),
          custom("affine_slope", {n_head}),
          zeros("lc_order_logits"),
          amplitude("lc_re"),
          amplitude("lc_im")};
}

void PjBiasEncoding::initialize_custom(std::size_t param_index, std::span<double> values, int n_head, int) const {
  const double L = train_length_;
  switch (param_index) {
    case kPjOmega:
      for (int h = 0; h < n_head; ++h) {
        const double periods =
            n_head == 1 ? kFirstPeriods : kFirstPeriods + (kLastPeriods - kFirstPeriods) * h / (n_head - 1.0);
        values[static_cast<std::size_t>(h)] = kTwoPi * periods / L;
      }
      return;
    case kPjGateLogits: {
      const auto gates = initial_gate_logits();
      for (int h = 0; h < n_head; ++h)
        for (int k = 0; k < kPjSectorCount; ++k) values[static_cast<std::size_t>(h * kPjSectorCount + k)] = gates[k];
      return;
    }
    case kPjFjDamping:
      for (double& v : values) v = kInitDampingRaw;
      return;
    case kPjAffineSlope: {
      if (config_.gate_init == PjGateInit::alibi) {
        // g_A·s_h/L = m_h, g_A the affine gate the initial logits give over the enabled sectors.
        const auto logits = initial_gate_logits();
        double total = 0.0;
        for (int k = 0; k < kPjSectorCount; ++k)
          if (sectors_[k]) total += std::exp(logits[k]);
        const double affine_gate = std::exp(logits[kPjAffine]) / total;
        const std::vector<double> slopes = alibi_slopes(n_head);
        for (int h = 0; h < n_head; ++h)
          values[static_cast<std::size_t>(h)] = softplus_inverse(slopes[static_cast<std::size_t>(h)] * L / affine_gate);
        return;
      }
      const double raw = config_.gate_init == PjGateInit::affine ? softplus_inverse(kAffineInitSlope)
                         : config_.gate_init == PjGateInit::zero ? kZeroInitSlopeRaw
                                                       : 0.0;  // uniform
      for (double& v : values) v = raw;
      return;
    }
    default:
      PositionEncoding::initialize_custom(param_index, values, n_head, 0);
  }
}

template <class Real>
void PjBiasEncoding::bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const {
  const std::string where = "pj_bias score bias";
  check_context(where, ctx);
  check_head(where, ctx, head);
  check_params(where, params, kPjParamCount);
  if (ctx.seq_len == 0) return;
  check_pointer(where, table, "table");
  const PjHead h = resolve_pj_head(params, head, config_.order, sectors_);
  for (int lag = 0; lag < ctx.seq_len; ++lag)
    table[lag] = static_cast<Real>(evaluate_pj_lag(h, lag, train_length_, rho_, sectors_).bias);
}

template <class Real>
void PjBiasEncoding::bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params,
                                   const Real* diag_grad, ParamGrads<Real> dparams) const {
  const std::string where = "pj_bias score bias backward";
  check_context(where, ctx);
  check_head(where, ctx, head);
  check_params(where, params, kPjParamCount);
  check_params(where + " (gradients)", dparams, kPjParamCount);
  if (ctx.seq_len == 0) return;
  check_pointer(where, diag_grad, "diag_grad");
  const PjHead h = resolve_pj_head(params, head, config_.order, sectors_);
  PjHeadGradient gradient;
  for (int lag = 0; lag < ctx.seq_len; ++lag) {
    const PjLag terms = evaluate_pj_lag(h, lag, train_length_, rho_, sectors_);
    accumulate_pj_lag_gradient(h, terms, diag_grad[lag], sectors_, gradient);
  }
  add_pj_head_gradient(gradient, head, config_.order, dparams);
}

template void PjBiasEncoding::bias<float>(const PositionContext&, int, ParamValues<float>, float*) const;
template void PjBiasEncoding::bias<double>(const PositionContext&, int, ParamValues<double>, double*) const;
template void PjBiasEncoding::bias_backward<float>(const PositionContext&, int, ParamValues<float>, const float*,
                                                   ParamGrads<float>) const;
template void PjBiasEncoding::bias_backward<double>(const PositionContext&, int, ParamValues<double>, const double*,
                                                    ParamGrads<double>) const;

}  // namespace pope
