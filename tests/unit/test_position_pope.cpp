// PoPE: the score identity Σ_c μ_q μ_k cos((s−t)ω_c + δ_c), relative-position invariance,
// the evenness of the δ = 0 response, δ's clamp and its gradient (and an unbounded δ's), the
// magnitude ablations, the no-δ variant, scales, frequencies, float accuracy at long positions,
// and finite-difference checks of the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

constexpr double kTwoPi = 2.0 * std::numbers::pi;

PopeConfig pope_config(MagnitudeKind magnitude = MagnitudeKind::softplus, bool learn_delta = true) {
  PopeConfig config;
  config.magnitude = magnitude;
  config.learn_delta = learn_delta;
  return config;
}

PopeConfig unbounded_config() {
  PopeConfig config;
  config.delta_bound = DeltaBound::none;
  return config;
}

double softplus(double x) { return std::log(1.0 + std::exp(x)); }

// Σ_c μ_q μ_k cos((s − t)ω_c + δ_c) written out directly from the spec.
double direct_score(const std::vector<double>& q, int t, const std::vector<double>& k, int s,
                    const std::vector<double>& delta_row) {
  const int d = static_cast<int>(q.size());
  double sum = 0.0;
  for (int c = 0; c < d; ++c) {
    const double omega = std::pow(10000.0, -static_cast<double>(c) / d);
    sum += softplus(q[c]) * softplus(k[c]) * std::cos((s - t) * omega + delta_row[c]);
  }
  return sum;
}

// A [n_head, d] δ parameter whose row `head` is `row` and whose other rows are garbage
// that must not be read.
std::vector<std::vector<double>> delta_param(int n_head, int head, const std::vector<double>& row) {
  std::vector<double> delta(n_head * row.size(), 1e3);
  std::copy(row.begin(), row.end(), delta.begin() + head * static_cast<std::ptrdiff_t>(row.size()));
  return {delta};
}

}  // namespace

TEST(Pope, ScoreIsTheSumOfMagnitudeProductsTimesCosines) {
  const PopeEncoding pope(pope_config());
  const int d = 16;
  const PositionContext ctx = make_context(1, d, 3);
  const std::vector<double> q = random_values(d, -2, 2, 1), k = random_values(d, -2, 2, 2);
  const std::vector<double> delta = random_values(d, -kTwoPi, 0, 3);
  const auto params = delta_param(3, 1, delta);
  for (auto [t, s] : {std::pair{0, 0}, std::pair{9, 4}, std::pair{300, 17}, std::pair{4, 9}})
    EXPECT_NEAR(transformed_score(pope, ctx, 1, q, t, k, s, params), direct_score(q, t, k, s, delta), 1e-12)
        << t << ", " << s;
}

TEST(Pope, OutputLayoutIsRealPartsThenImaginaryParts) {
  const PopeEncoding pope(pope_config());
  const std::vector<double> x{0.5, -1.0};
  const std::vector<double> y = transform_at(pope, make_context(1, 2, 1), 3, 0, false, x, delta_param(1, 0, {0, 0}));
  // d = 2: ω = (1, 10000^(−1/2) = 0.01).
  ASSERT_EQ(y.size(), 4u);
  EXPECT_NEAR(y[0], softplus(0.5) * std::cos(3.0), 1e-15);
  EXPECT_NEAR(y[1], softplus(-1.0) * std::cos(0.03), 1e-15);
  EXPECT_NEAR(y[2], softplus(0.5) * std::sin(3.0), 1e-15);
  EXPECT_NEAR(y[3], softplus(-1.0) * std::sin(0.03), 1e-15);
}

TEST(Pope, ScoreDependsOnlyOnRelativePosition) {
  const PopeEncoding pope(pope_config());
  const int d = 32;
  const PositionContext ctx = make_context(1, d, 1);
  const std::vector<double> q = random_values(d, -2, 2, 4), k = random_values(d, -2, 2, 5);
  const auto params = delta_param(1, 0, random_values(d, -kTwoPi, 0, 6));
  for (auto [t, s] : {std::pair{10, 3}, std::pair{1000, 990}, std::pair{3, 10}}) {
    const double score = transformed_score(pope, ctx, 0, q, t, k, s, params);
    EXPECT_NEAR(score, transformed_score(pope, ctx, 0, q, t + 7, k, s + 7, params), 1e-11) << t << ", " << s;
    EXPECT_GT(std::abs(score - transformed_score(pope, ctx, 0, q, t + 1, k, s, params)), 1e-4) << t << ", " << s;
  }
}

TEST(Pope, ZeroDeltaResponseIsEvenInTheLag) {
  const PopeEncoding pope(pope_config());
  const int d = 16;
  const PositionContext ctx = make_context(1, d, 1);
  const std::vector<double> q = random_values(d, -2, 2, 7), k = random_values(d, -2, 2, 8);
  const auto zero = delta_param(1, 0, std::vector<double>(d, 0.0));
  const auto shifted = delta_param(1, 0, std::vector<double>(d, -1.0));
  for (auto [t, s] : {std::pair{12, 5}, std::pair{40, 0}}) {
    // Swapping the positions of q and k flips the sign of s − t.
    EXPECT_NEAR(transformed_score(pope, ctx, 0, q, t, k, s, zero), transformed_score(pope, ctx, 0, q, s, k, t, zero),
                1e-12);
    // A non-zero δ breaks the symmetry (it is what makes PoPE directional).
    EXPECT_GT(std::abs(transformed_score(pope, ctx, 0, q, t, k, s, shifted) -
                       transformed_score(pope, ctx, 0, q, s, k, t, shifted)),
              1e-3);
  }
}

TEST(Pope, DeltaOnlyShiftsKeys) {
  const PopeEncoding pope(pope_config());
  const PositionContext ctx = make_context(1, 4, 1);
  const std::vector<double> x = random_values(4, -1, 1, 9);
  const auto zero = delta_param(1, 0, std::vector<double>(4, 0.0));
  const auto shifted = delta_param(1, 0, std::vector<double>(4, -2.0));
  EXPECT_EQ(transform_at(pope, ctx, 5, 0, false, x, zero), transform_at(pope, ctx, 5, 0, false, x, shifted));
  EXPECT_NE(transform_at(pope, ctx, 5, 0, true, x, zero), transform_at(pope, ctx, 5, 0, true, x, shifted));
}

TEST(Pope, DeltaOutsideTheRangeActsClampedAndGetsNoGradient) {
  const PopeEncoding pope(pope_config());
  const int d = 4;
  const PositionContext ctx = make_context(2, d, 1, 3);
  const std::vector<double> x = random_values(2 * d, -1, 1, 10), dy = random_values(4 * d, -1, 1, 11);
  const auto outside = delta_param(1, 0, {0.7, -9.0, -1.0, -kTwoPi - 0.1});
  const auto clamped = delta_param(1, 0, {0.0, -kTwoPi, -1.0, -kTwoPi});
  EXPECT_EQ(transform_rows(pope, ctx, 0, true, x, d, outside), transform_rows(pope, ctx, 0, true, x, d, clamped));

  std::vector<double> dx(2 * d, 0.0);
  std::vector<std::vector<double>> ddelta{std::vector<double>(d, 0.0)};
  transform_backward_rows(pope, ctx, 0, true, x, d, outside, dy, dx, ddelta);
  EXPECT_EQ(ddelta[0][0], 0.0);
  EXPECT_EQ(ddelta[0][1], 0.0);
  EXPECT_NE(ddelta[0][2], 0.0);
  EXPECT_EQ(ddelta[0][3], 0.0);
}

TEST(Pope, UnboundedDeltaActsAsStoredAndAlwaysGetsItsGradient) {
  const PopeEncoding clamped(pope_config()), unbounded(unbounded_config());
  const int d = 4;
  const PositionContext ctx = make_context(2, d, 1, 3);
  const std::vector<double> x = random_values(2 * d, -1, 1, 10), dy = random_values(4 * d, -1, 1, 11);
  const std::vector<double> outside_row{0.7, -9.0, -1.0, -kTwoPi - 0.1};
  auto outside = delta_param(1, 0, outside_row);
  EXPECT_NE(transform_rows(unbounded, ctx, 0, true, x, d, outside),
            transform_rows(clamped, ctx, 0, true, x, d, outside));
  const std::vector<double> q = random_values(d, -2, 2, 1), k = random_values(d, -2, 2, 2);
  for (auto [t, s] : {std::pair{9, 4}, std::pair{4, 9}})
    EXPECT_NEAR(transformed_score(unbounded, ctx, 0, q, t, k, s, outside), direct_score(q, t, k, s, outside_row),
                1e-12)
        << t << ", " << s;

  std::vector<double> dx(2 * d, 0.0);
  std::vector<std::vector<double>> ddelta{std::vector<double>(d, 0.0)};
  transform_backward_rows(unbounded, ctx, 0, true, x, d, outside, dy, dx, ddelta);
  for (int c = 0; c < d; ++c) EXPECT_GT(std::abs(ddelta[0][c]), 1e-3) << "c = " << c;
  std::vector<double> x_point = x;
  EXPECT_LT(transform_gradient_error(unbounded, ctx, 0, true, x_point, d, outside), 1e-6);
}

TEST(Pope, PlanSaysWhetherDeltaIsClamped) {
  const PositionContext ctx = make_context(4, 8, 2);
  EXPECT_TRUE(PopeEncoding(pope_config()).transform_plan(ctx).clamp_delta);
  EXPECT_FALSE(PopeEncoding(unbounded_config()).transform_plan(ctx).clamp_delta);
}

TEST(Pope, DeltaOnTheBoundGetsTheGradientFromInside) {
  // δ starts at exactly 0, so the bound itself must pass the gradient or δ never learns.
  const PopeEncoding pope(pope_config());
  const int d = 4;
  const PositionContext ctx = make_context(2, d, 1);
  const std::vector<double> x = random_values(2 * d, -1, 1, 12), w = random_values(4 * d, -1, 1, 13);
  auto delta = delta_param(1, 0, {0.0, 0.0, -kTwoPi, -kTwoPi});
  std::vector<double> dx(2 * d, 0.0);
  std::vector<std::vector<double>> ddelta{std::vector<double>(d, 0.0)};
  transform_backward_rows(pope, ctx, 0, true, x, d, delta, w, dx, ddelta);
  const auto loss = [&] { return dot(w, transform_rows(pope, ctx, 0, true, x, d, delta)); };
  const double h = 1e-6;
  for (int c = 0; c < d; ++c) {
    const double inward = c < 2 ? -h : h;  // step into [−2π, 0]
    const double at_bound = loss();
    delta[0][c] += inward;
    const double one_sided = (loss() - at_bound) / inward;
    delta[0][c] -= inward;
    EXPECT_NEAR(ddelta[0][c], one_sided, 1e-5) << "c = " << c;
    EXPECT_GT(std::abs(ddelta[0][c]), 1e-3) << "c = " << c;
  }
}

TEST(Pope, MagnitudeAblations) {
  const PositionContext ctx = make_context(1, 2, 1);
  const std::vector<double> x{0.8, -0.6};
  const auto zero = delta_param(1, 0, {0.0, 0.0});
  const std::vector<double> identity = transform_at(PopeEncoding(pope_config(MagnitudeKind::identity)), ctx, 2, 0, true, x, zero);
  EXPECT_NEAR(identity[0], 0.8 * std::cos(2.0), 1e-15);
  EXPECT_NEAR(identity[1], -0.6 * std::cos(0.02), 1e-15);  // negative magnitudes pass through
  EXPECT_NEAR(identity[3], -0.6 * std::sin(0.02), 1e-15);
  const std::vector<double> relu = transform_at(PopeEncoding(pope_config(MagnitudeKind::relu)), ctx, 2, 0, true, x, zero);
  EXPECT_NEAR(relu[0], 0.8 * std::cos(2.0), 1e-15);
  EXPECT_NEAR(relu[2], 0.8 * std::sin(2.0), 1e-15);
  EXPECT_EQ(relu[1], 0.0);
  EXPECT_EQ(relu[3], 0.0);
  const std::vector<double> soft = transform_at(PopeEncoding(pope_config(MagnitudeKind::softplus)), ctx, 2, 0, true, x, zero);
  EXPECT_NEAR(soft[1], softplus(-0.6) * std::cos(0.02), 1e-15);
}

TEST(Pope, SoftplusIsLinearForLargeInputs) {
  const PopeEncoding pope(pope_config(MagnitudeKind::softplus, false));
  const std::vector<double> y =
      transform_at(pope, make_context(1, 2, 1), 0, 0, false, std::vector<double>{25.0, 800.0});
  EXPECT_EQ(y[0], 25.0);
  EXPECT_EQ(y[1], 800.0);  // no overflow of e^x
}

TEST(Pope, NoDeltaVariantHasNoParameters) {
  const PopeEncoding pope(pope_config(MagnitudeKind::softplus, false));
  EXPECT_TRUE(pope.layer_parameters(12, 64).empty());
  const PositionContext ctx = make_context(1, 8, 1);
  const std::vector<double> q = random_values(8, -1, 1, 14), k = random_values(8, -1, 1, 15);
  EXPECT_NEAR(transformed_score(pope, ctx, 0, q, 9, k, 4), direct_score(q, 9, k, 4, std::vector<double>(8, 0.0)),
              1e-12);
  EXPECT_THROW(transform_at(pope, ctx, 0, 0, true, k, delta_param(1, 0, std::vector<double>(8, 0.0))),
               std::invalid_argument);
}

TEST(Pope, DeltaParameterSpec) {
  const std::vector<ParamSpec> zero = PopeEncoding(pope_config()).layer_parameters(12, 64);
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(zero[0].name, "delta");
  EXPECT_EQ(zero[0].shape, (Shape{12, 64}));
  EXPECT_FALSE(zero[0].weight_decay);
  EXPECT_EQ(zero[0].init, InitKind::zeros);
  PopeConfig uniform_config = pope_config();
  uniform_config.delta_init = DeltaInit::uniform;
  const std::vector<ParamSpec> uniform = PopeEncoding(uniform_config).layer_parameters(4, 32);
  ASSERT_EQ(uniform.size(), 1u);
  EXPECT_EQ(uniform[0].init, InitKind::uniform);
  EXPECT_DOUBLE_EQ(uniform[0].init_a, -kTwoPi);
  EXPECT_DOUBLE_EQ(uniform[0].init_b, 0.0);
  EXPECT_FALSE(uniform[0].weight_decay);
}

TEST(Pope, QkWidthAndScaleOptions) {
  PopeConfig config = pope_config();
  EXPECT_EQ(PopeEncoding(config).qk_width(64), 128);
  EXPECT_TRUE(PopeEncoding(config).transforms_qk());
  EXPECT_DOUBLE_EQ(PopeEncoding(config).softmax_scale(make_context(8, 64)), 0.125);
  config.scale = PopeScale::inv_sqrt_2d;
  EXPECT_DOUBLE_EQ(PopeEncoding(config).softmax_scale(make_context(8, 64)), 1.0 / std::sqrt(128.0));
}

TEST(Pope, FrequenciesRunFromOneDownToAbout1e4) {
  const std::vector<double> omega = PopeEncoding(pope_config()).frequencies(64);
  ASSERT_EQ(omega.size(), 64u);
  EXPECT_DOUBLE_EQ(omega[0], 1.0);
  EXPECT_NEAR(omega[1], 0.8659643233600653, 1e-15);      // 10000^(−1/64)
  EXPECT_NEAR(omega[63], 1.1547819846894582e-4, 1e-18);  // 10000^(−63/64)
}

TEST(Pope, FloatPhasesStayAccurateAtLongPositions) {
  const PopeEncoding pope(pope_config());
  const int d = 64, rows = 4;
  const PositionContext ctx = make_context(rows, d, 1, 16000);
  const std::vector<double> x = random_values(rows * d, -2, 2, 16);
  const std::vector<double> delta = random_values(d, -kTwoPi, 0, 17);
  const std::vector<float> x_float(x.begin(), x.end()), delta_float(delta.begin(), delta.end());
  const std::vector<double> x_rounded(x_float.begin(), x_float.end()),
      delta_rounded(delta_float.begin(), delta_float.end());
  const std::vector<double> exact = transform_rows(pope, ctx, 0, true, x_rounded, d, {delta_rounded});
  const std::vector<float> approx = transform_rows(pope, ctx, 0, true, x_float, d, {delta_float});
  double worst = 0.0;
  for (std::size_t i = 0; i < exact.size(); ++i) worst = std::max(worst, std::abs(exact[i] - approx[i]));
  // Float storage of values up to ~2.2 rounds at ~1.2e−7; a float angle at 16000 rad would
  // be off by up to ~1e−3.
  EXPECT_LT(worst, 1e-6);
}

TEST(Pope, BackwardMatchesFiniteDifferences) {
  const int d = 8, t_len = 4, stride = 3 * d, n_head = 2, head = 1;
  for (MagnitudeKind magnitude : {MagnitudeKind::softplus, MagnitudeKind::identity, MagnitudeKind::relu}) {
    const PopeEncoding pope(pope_config(magnitude));
    const PositionContext ctx = make_context(t_len, d, n_head, 50);
    for (bool is_key : {false, true}) {
      // Inputs kept away from relu's kink at 0: |x| in [0.2, 2].
      std::vector<double> x = random_values(t_len * stride, 0.2, 2, 18);
      for (std::size_t i = 0; i < x.size(); i += 2) x[i] = -x[i];
      std::vector<std::vector<double>> params{random_values(n_head * d, -6.0, -0.2, 19)};
      EXPECT_LT(transform_gradient_error(pope, ctx, head, is_key, x, stride, params), 1e-6)
          << magnitude << (is_key ? ", keys" : ", queries");
    }
  }
}

TEST(Pope, BackwardWithoutDeltaMatchesFiniteDifferences) {
  const PopeEncoding pope(pope_config(MagnitudeKind::softplus, false));
  const PositionContext ctx = make_context(3, 8, 1, 5);
  std::vector<double> x = random_values(3 * 8, -3, 3, 20);
  std::vector<std::vector<double>> no_params;
  EXPECT_LT(transform_gradient_error(pope, ctx, 0, true, x, 8, no_params), 1e-6);
}

// Unknown magnitude, delta_init and scale names are refused where the config is parsed
// (Config.RefusesUnknownNames).
TEST(Pope, RejectsABaseOfAtMostOne) {
  PopeConfig config;
  config.base = 0.5;
  try {
    PopeEncoding encoding(config);
    ADD_FAILURE() << "accepted base 0.5";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "model.position.pope.base");
  }
}
