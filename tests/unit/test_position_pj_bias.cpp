// PJ-bias (spec 5.1): the spec's golden table for both ρ, finite-difference gradients of
// every parameter (ω at lags up to several L), gate masking, the init modes' gates and
// slopes, and argument / option checks.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

constexpr PjSectorMask kAll{true, true, true};

PjConfig pj_config(int order, PjRho rho = PjRho::linear, PjGateInit gate_init = PjGateInit::affine) {
  PjConfig config;
  config.order = order;
  config.rho = rho;
  config.gate_init = gate_init;
  return config;
}

// The spec's golden parameters (K = 2, one head), in PjParam order.
std::vector<std::vector<double>> golden_parameters() {
  return {
      {2.0 * std::numbers::pi * 3.0 / 64.0},  // ω
      {0.5, 0.0, -0.5},                       // γ
      {0.0, 0.3, -0.2},                       // a
      {0.4, -0.3, 0.2},                       // u
      {0.1, 0.25, -0.15},                     // v
      {-2.0},                                 // λ̃
      {0.0},                                  // s̃
      {0.1, 0.0, 0.2},                        // a'
      {0.3, 0.2, -0.1},                       // u'
      {-0.2, 0.05, 0.3},                      // v'
  };
}

// Random parameters of n_head heads: logits and amplitudes of order one, λ̃ and s̃ around 0.
std::vector<std::vector<double>> random_parameters(const PjBiasEncoding& bias, int n_head, unsigned seed) {
  std::vector<std::vector<double>> params;
  for (const ParamSpec& spec : bias.layer_parameters(n_head, 8))
    params.push_back(random_values(static_cast<std::size_t>(shape_numel(spec.shape)), -1.0, 1.0, seed++));
  for (std::size_t h = 0; h < params[kPjOmega].size(); ++h) params[kPjOmega][h] = 0.05 + 0.3 * h;
  return params;
}

template <class Real>
std::vector<Real> bias_table(const PositionEncoding& encoding, const PositionContext& ctx, int head,
                             const std::vector<std::vector<Real>>& params) {
  std::vector<Real> table(static_cast<std::size_t>(ctx.seq_len));
  const std::vector<const Real*> pointers = value_pointers(params);
  encoding.score_bias(ctx, head, pointers, table.data());
  return table;
}

// Σ_h Σ_Δ w_h(Δ)·b_h(Δ) and its analytic gradient through score_bias_backward.
struct BiasLoss {
  const PositionEncoding& encoding;
  PositionContext ctx;
  std::vector<std::vector<double>> weights;  // per head, [T]

  double operator()(const std::vector<std::vector<double>>& params) const {
    double total = 0.0;
    for (int h = 0; h < ctx.n_head; ++h) total += dot(weights[h], bias_table(encoding, ctx, h, params));
    return total;
  }
  std::vector<std::vector<double>> gradient(const std::vector<std::vector<double>>& params) const {
    std::vector<std::vector<double>> grads;
    for (const auto& p : params) grads.emplace_back(p.size(), 0.0);
    const std::vector<const double*> values = value_pointers(params);
    const std::vector<double*> pointers = gradient_pointers(grads);
    for (int h = 0; h < ctx.n_head; ++h)
      encoding.score_bias_backward(ctx, h, values, weights[h].data(), pointers);
    return grads;
  }
};

BiasLoss random_loss(const PositionEncoding& encoding, int seq_len, int n_head, int train_length) {
  BiasLoss loss{encoding, make_context(seq_len, 8, n_head, 0, train_length), {}};
  for (int h = 0; h < n_head; ++h)
    loss.weights.push_back(random_values(static_cast<std::size_t>(seq_len), -1.0, 1.0, 100 + h));
  return loss;
}

// Worst relative error over every parameter of every head. Step 1e−6: ω's derivative carries
// the lag (up to a few hundred), so the default 1e−5 would move phases by ~3e−3 rad and its
// truncation error (~h²Δ²/6) would show; rounding stays ~1e−9 at this step.
constexpr GradientCheckOptions kBiasCheck{.step = 1e-6, .magnitude_floor = 1e-3};

double bias_gradient_error(std::vector<std::vector<double>>& params, const BiasLoss& loss,
                           const std::vector<std::string>* names = nullptr) {
  const auto analytic = loss.gradient(params);
  double worst = 0.0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double error = max_relative_gradient_error([&] { return loss(params); }, params[i], analytic[i], kBiasCheck);
    EXPECT_LT(error, 1e-6) << "parameter " << (names ? (*names)[i] : std::to_string(i));
    worst = std::max(worst, error);
  }
  return worst;
}

std::vector<std::string> parameter_names(const PositionEncoding& encoding) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : encoding.layer_parameters(2, 8)) names.push_back(spec.name);
  return names;
}

}  // namespace

TEST(PjBias, GoldenTableLinearAndLightcone) {
  const int lags[] = {0, 1, 5, 63, 64, 500};
  const double linear[] = {0.082508065, 0.073415253, -0.016848748, -0.201342154, -0.216452635, -1.774781422};
  const double lightcone[] = {0.082508065, 0.073415389, -0.016831872, -0.177048060, -0.191193280, -0.697440078};
  const PositionContext ctx = make_context(501, 8, 1, 0, 64);
  for (PjRho rho : {PjRho::linear, PjRho::lightcone}) {
    const PjBiasEncoding bias(pj_config(2, rho), kAll, 64);
    const std::vector<double> table = bias_table(bias, ctx, 0, golden_parameters());
    std::vector<std::vector<float>> params_f;
    for (const auto& p : golden_parameters()) params_f.emplace_back(p.begin(), p.end());
    const std::vector<float> table_f = bias_table(bias, ctx, 0, params_f);
    for (int i = 0; i < 6; ++i) {
      const double expected = rho == PjRho::linear ? linear[i] : lightcone[i];
      EXPECT_NEAR(table[lags[i]], expected, 1e-8) << rho << " Δ = " << lags[i];
      EXPECT_NEAR(table_f[lags[i]], expected, 2e-6) << rho << " Δ = " << lags[i] << " (float)";
    }
  }
}

TEST(PjBias, GradientsOfEveryParameterMatchFiniteDifferences) {
  // T = 300 at L = 64: lags up to ~4.7 L, where ∂b/∂ω carries the factor Δ (or φ).
  for (PjRho rho : {PjRho::linear, PjRho::lightcone}) {
    for (int order : {0, 2, 3}) {
      const PjBiasEncoding bias(pj_config(order, rho), kAll, 64);
      auto params = random_parameters(bias, 2, 1);
      auto names = parameter_names(bias);
      const BiasLoss loss = random_loss(bias, 300, 2, 64);
      EXPECT_LT(bias_gradient_error(params, loss, &names), 1e-6) << rho << " K = " << order;
    }
  }
}

TEST(PjBias, OmegaGradientAtLargeLagsMatchesFiniteDifferences) {
  // Only the far lags carry weight: Δ ∈ [900, 1000) at L = 128, where ω's derivative is
  // ~Δ times the others and cos/sin turn fast.
  const PjBiasEncoding bias(pj_config(3), kAll, 128);
  auto params = random_parameters(bias, 1, 7);
  BiasLoss loss = random_loss(bias, 1000, 1, 128);
  for (int lag = 0; lag < 900; ++lag) loss.weights[0][lag] = 0.0;
  const auto analytic = loss.gradient(params);
  EXPECT_GT(std::abs(analytic[kPjOmega][0]), 1.0);  // large, so the check below is meaningful
  EXPECT_LT(max_relative_gradient_error([&] { return loss(params); }, params[kPjOmega], analytic[kPjOmega],
                                        {.step = 1e-7, .magnitude_floor = 1e-3}),
            1e-6);
}

TEST(PjBias, DisabledSectorsHaveGateZeroAndNoGradient) {
  const auto params = golden_parameters();
  const PositionContext ctx = make_context(200, 8, 1, 0, 64);
  // Affine alone: g_A = 1 whatever γ, so b = −s·Δ/L with s = softplus(0) = ln 2.
  const PjBiasEncoding affine(pj_config(2), {false, true, false}, 64);
  const std::vector<double> table = bias_table(affine, ctx, 0, params);
  for (int lag = 0; lag < 200; ++lag) EXPECT_NEAR(table[lag], -std::log(2.0) * lag / 64.0, 1e-14) << lag;

  // FJ + LC: the affine slope has no influence and gets exactly zero gradient; the gates
  // renormalise over the two (γ = 0.5, −0.5 → g = σ(±1)).
  const PjBiasEncoding fj_lc(pj_config(2), {true, false, true}, 64);
  const PjBiasEncoding fj_only(pj_config(2), {true, false, false}, 64);
  const PjBiasEncoding lc_only(pj_config(2), {false, false, true}, 64);
  const std::vector<double> both = bias_table(fj_lc, ctx, 0, params);
  const std::vector<double> fj = bias_table(fj_only, ctx, 0, params);
  const std::vector<double> lc = bias_table(lc_only, ctx, 0, params);
  const double g_fj = 1.0 / (1.0 + std::exp(-1.0));
  for (int lag = 0; lag < 200; ++lag) EXPECT_NEAR(both[lag], g_fj * fj[lag] + (1.0 - g_fj) * lc[lag], 1e-14) << lag;

  auto perturbed = params;
  perturbed[kPjAffineSlope][0] = 3.0;
  perturbed[kPjGateLogits][1] = 7.0;  // the disabled sector's gate logit
  EXPECT_EQ(bias_table(fj_lc, ctx, 0, perturbed), both);

  BiasLoss loss = random_loss(fj_lc, 200, 1, 64);
  const auto grads = loss.gradient(params);
  EXPECT_EQ(grads[kPjAffineSlope][0], 0.0);
  EXPECT_EQ(grads[kPjGateLogits][1], 0.0);
  EXPECT_NE(grads[kPjGateLogits][0], 0.0);
  // FJ-only: everything of LC gets no gradient.
  const auto fj_grads = random_loss(fj_only, 200, 1, 64).gradient(params);
  for (PjParam p : {kPjLcOrderLogits, kPjLcRe, kPjLcIm, kPjAffineSlope})
    for (double g : fj_grads[p]) EXPECT_EQ(g, 0.0) << "parameter " << p;
  // Masked-sector gradients still match finite differences.
  auto mutable_params = params;
  EXPECT_LT(bias_gradient_error(mutable_params, loss), 1e-6);
}

TEST(PjBias, ParameterShapesNamesAndNoWeightDecay) {
  const PjBiasEncoding bias(pj_config(3), kAll, 1024);
  const auto specs = bias.layer_parameters(12, 64);
  ASSERT_EQ(specs.size(), kPjParamCount);
  const char* names[] = {"omega",        "gate_logits",     "fj_order_logits", "fj_re", "fj_im",
                         "fj_damping",   "affine_slope",    "lc_order_logits", "lc_re", "lc_im"};
  std::int64_t per_head = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].name, names[i]);
    EXPECT_FALSE(specs[i].weight_decay);
    EXPECT_EQ(specs[i].shape.front(), 12);
    per_head += shape_numel(specs[i].shape) / 12;
  }
  EXPECT_EQ(per_head, 6 + 6 * 4);  // 6 + 6(K + 1) scalars per head
  EXPECT_TRUE(bias.has_score_bias());
  EXPECT_FALSE(bias.transforms_qk());
}

namespace {

// Initial values of one layer as Model::initialize makes them (normal entries drawn here).
std::vector<std::vector<double>> initial_parameters(const PjBiasEncoding& bias, int n_head) {
  std::vector<std::vector<double>> params;
  const auto specs = bias.layer_parameters(n_head, 64);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> values(static_cast<std::size_t>(shape_numel(specs[i].shape)), 0.0);
    if (specs[i].init == InitKind::custom) bias.initialize_custom(i, values, n_head, 64);
    if (specs[i].init == InitKind::normal) values = random_values(values.size(), -0.02, 0.02, unsigned(i));
    params.push_back(values);
  }
  return params;
}

}  // namespace

TEST(PjBias, AffineInitGivesTheSpecsGatesSlopeAndFrequencies) {
  const PjBiasEncoding bias(pj_config(3), kAll, 1024);
  const auto params = initial_parameters(bias, 4);
  for (int h = 0; h < 4; ++h) {
    const PjHead head = resolve_pj_head<double>(value_pointers(params), h, 3, kAll);
    EXPECT_NEAR(head.gate[kPjAffine], 0.964663, 1e-6);
    EXPECT_NEAR(head.gate[kPjFourierJet], (1.0 - 0.964663) / 2.0, 1e-6);
    EXPECT_NEAR(head.slope, 2.0, 1e-12);
    EXPECT_NEAR(head.damping, 0.126928, 1e-6);
    EXPECT_NEAR(head.gate[kPjAffine] * head.slope, 1.92933, 1e-5);
    for (int r = 0; r <= 3; ++r) EXPECT_DOUBLE_EQ(head.fj_alpha[r], 0.25);
    // c_h = linspace(1, 17, 4) periods over L.
    EXPECT_NEAR(head.omega, 2.0 * std::numbers::pi * (1.0 + 16.0 * h / 3.0) / 1024.0, 1e-15);
  }
  for (const auto& amplitude : {params[kPjFjRe], params[kPjLcIm]})
    for (double v : amplitude) EXPECT_NE(v, 0.0);
}

TEST(PjBias, OtherInitModes) {
  const PositionContext ctx = make_context(100, 64, 8, 0, 1024);
  {  // uniform: γ = 0, s̃ = 0.
    const PjBiasEncoding bias(pj_config(3, PjRho::linear, PjGateInit::uniform), kAll, 1024);
    const auto params = initial_parameters(bias, 8);
    const PjHead head = resolve_pj_head<double>(value_pointers(params), 5, 3, kAll);
    for (double g : head.gate) EXPECT_NEAR(g, 1.0 / 3.0, 1e-15);
    EXPECT_NEAR(head.slope, std::log(2.0), 1e-15);
  }
  {  // alibi: g_A·s_h/L = the ALiBi slope of head h (for all sectors and for affine alone).
    for (const PjSectorMask sectors : {kAll, PjSectorMask{false, true, false}}) {
      const PjBiasEncoding bias(pj_config(3, PjRho::linear, PjGateInit::alibi), sectors, 1024);
      const auto params = initial_parameters(bias, 8);
      const std::vector<double> slopes = alibi_slopes(8);
      for (int h = 0; h < 8; ++h) {
        const PjHead head = resolve_pj_head<double>(value_pointers(params), h, 3, sectors);
        EXPECT_NEAR(head.gate[kPjAffine] * head.slope / 1024.0, slopes[h], 1e-12) << "head " << h;
      }
    }
  }
  {  // zero: ζ = ζ' = 0 and s̃ = −10: the bias is practically zero everywhere.
    const PjBiasEncoding bias(pj_config(3, PjRho::linear, PjGateInit::zero), kAll, 1024);
    const auto specs = bias.layer_parameters(8, 64);
    EXPECT_EQ(specs[kPjFjRe].init, InitKind::zeros);
    EXPECT_EQ(specs[kPjLcIm].init, InitKind::zeros);
    const auto params = initial_parameters(bias, 8);
    for (double b : bias_table(bias, ctx, 3, params)) EXPECT_LT(std::abs(b), 1e-5);
  }
}

TEST(PjBias, RejectsBadOptionsAndArguments) {
  const auto expect_key = [](const PjConfig& config, const std::string& key) {
    try {
      PjBiasEncoding(config, kAll, 64);
      ADD_FAILURE() << "expected ConfigError for " << key;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.path(), key);
    }
  };
  expect_key(pj_config(16), "model.position.pj.order");
  expect_key(pj_config(-1), "model.position.pj.order");
  EXPECT_THROW(PjBiasEncoding(pj_config(2), kAll, 0), ConfigError);

  const PjBiasEncoding bias(pj_config(2), kAll, 64);
  const auto params = golden_parameters();
  EXPECT_THROW(bias_table(bias, make_context(4, 8, 1, 0, 64), 1, params), std::invalid_argument);  // head
  auto missing = params;
  missing.pop_back();
  EXPECT_THROW(bias_table(bias, make_context(4, 8, 1, 0, 64), 0, missing), std::invalid_argument);
}
