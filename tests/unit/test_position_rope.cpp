// RoPE: frequency tables (plain and scaled, against numbers computed here from the spec's
// formulas), the relative-position and norm identities, partial rotation, the YaRN logit
// scale, and finite-difference checks of the backward under every scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

RopeConfig rope_config(RopeScalingKind scaling = RopeScalingKind::none, double factor = 1.0, double fraction = 1.0) {
  RopeConfig config;
  config.fraction = fraction;
  config.scaling.kind = scaling;
  config.scaling.factor = factor;
  return config;
}

double norm(const std::vector<double>& v) { return std::sqrt(dot(v, v)); }

}  // namespace

TEST(Rope, FrequencyTableIsBasePowerMinus2mOverD) {
  const RopeEncoding rope(rope_config());
  const std::vector<double> theta = rope.frequencies(make_context(8, 64));
  ASSERT_EQ(theta.size(), 32u);
  EXPECT_DOUBLE_EQ(theta[0], 1.0);
  EXPECT_NEAR(theta[1], 0.7498942093324559, 1e-15);     // 10000^(−2/64)
  EXPECT_NEAR(theta[31], 1.333521432163324e-4, 1e-18);  // 10000^(−62/64)
  for (int m = 0; m < 32; ++m) EXPECT_NEAR(theta[m], std::pow(10000.0, -2.0 * m / 64), 1e-15) << "m = " << m;
}

TEST(Rope, RotatesHalfSplitPairsByPositionTimesFrequency) {
  const RopeEncoding rope(rope_config());
  const PositionContext ctx = make_context(1, 4);
  // d = 4: pairs (x0, x2) with θ0 = 1 and (x1, x3) with θ1 = 10000^(−1/2) = 0.01.
  const std::vector<double> y = transform_at(rope, ctx, 3, 0, false, std::vector<double>{1.0, 2.0, 0.5, -1.0});
  EXPECT_NEAR(y[0], 1.0 * std::cos(3.0) - 0.5 * std::sin(3.0), 1e-15);
  EXPECT_NEAR(y[2], 1.0 * std::sin(3.0) + 0.5 * std::cos(3.0), 1e-15);
  EXPECT_NEAR(y[1], 2.0 * std::cos(0.03) + 1.0 * std::sin(0.03), 1e-15);
  EXPECT_NEAR(y[3], 2.0 * std::sin(0.03) - 1.0 * std::cos(0.03), 1e-15);
}

TEST(Rope, ScoreDependsOnlyOnRelativePosition) {
  const RopeEncoding rope(rope_config());
  const PositionContext ctx = make_context(1, 64);
  const std::vector<double> q = random_values(64, -1, 1, 1), k = random_values(64, -1, 1, 2);
  for (auto [t, s] : {std::pair{10, 3}, std::pair{500, 499}, std::pair{20, 40}}) {
    const double score = transformed_score(rope, ctx, 0, q, t, k, s);
    EXPECT_NEAR(score, transformed_score(rope, ctx, 0, q, t + 7, k, s + 7), 1e-12) << t << ", " << s;
    // …and it does depend on t − s.
    EXPECT_GT(std::abs(score - transformed_score(rope, ctx, 0, q, t + 1, k, s)), 1e-3) << t << ", " << s;
  }
}

TEST(Rope, PreservesNorms) {
  const RopeEncoding rope(rope_config(RopeScalingKind::yarn, 4.0, 0.5));
  const std::vector<double> x = random_values(64, -1, 1, 3);
  for (int p : {0, 1, 777, 16000})
    EXPECT_NEAR(norm(transform_at(rope, make_context(1, 64), p, 1, true, x)), norm(x), 1e-12) << "p = " << p;
}

TEST(Rope, FloatRotationStaysAccurateAtLongPositions) {
  const RopeEncoding rope(rope_config());
  const int d = 64, rows = 4;
  const PositionContext ctx = make_context(rows, d, 1, 16000);
  const std::vector<double> x = random_values(rows * d, -2, 2, 21);
  const std::vector<float> x_float(x.begin(), x.end());
  const std::vector<double> x_rounded(x_float.begin(), x_float.end());
  const std::vector<double> exact = transform_rows(rope, ctx, 0, false, x_rounded, d);
  const std::vector<float> approx = transform_rows(rope, ctx, 0, false, x_float, d);
  double worst = 0.0;
  for (std::size_t i = 0; i < exact.size(); ++i) worst = std::max(worst, std::abs(exact[i] - approx[i]));
  // Only the output's float rounding (~2.4e−7 at |y| ≤ 2√2) remains; a float angle at
  // 16000 rad would be off by up to ~1e−3.
  EXPECT_LT(worst, 1e-6);
}

TEST(Rope, PartialRotationLeavesTheOtherChannelsUntouched) {
  const RopeEncoding rope(rope_config(RopeScalingKind::none, 1.0, 0.5));
  const PositionContext ctx = make_context(1, 64);
  const std::vector<double> x = random_values(64, -1, 1, 4);
  const std::vector<double> y = transform_at(rope, ctx, 123, 0, false, x);
  for (int c = 32; c < 64; ++c) EXPECT_EQ(y[c], x[c]) << "c = " << c;
  // The first 32 channels rotate as a 32-wide RoPE: θ_m = 10000^(−2m/32), pairs (m, m + 16).
  const std::vector<double> theta = rope.frequencies(ctx);
  ASSERT_EQ(theta.size(), 16u);
  EXPECT_NEAR(theta[1], std::pow(10000.0, -2.0 / 32), 1e-15);
  EXPECT_NEAR(y[5], x[5] * std::cos(123 * theta[5]) - x[21] * std::sin(123 * theta[5]), 1e-12);
}

TEST(Rope, PositionInterpolationDividesFrequencies) {
  const RopeEncoding rope(rope_config(RopeScalingKind::pi, 4.0));
  const std::vector<double> theta = rope.frequencies(make_context(8, 64));
  EXPECT_DOUBLE_EQ(theta[0], 0.25);
  EXPECT_NEAR(theta[1], 0.7498942093324559 / 4, 1e-15);
  EXPECT_NEAR(theta[31], 1.333521432163324e-4 / 4, 1e-18);
}

TEST(Rope, NtkScalesTheBase) {
  const RopeEncoding rope(rope_config(RopeScalingKind::ntk, 4.0));
  const std::vector<double> theta = rope.frequencies(make_context(8, 64));
  const double scaled_base = 10000.0 * std::pow(4.0, 64.0 / 62.0);  // ≈ 41829.37
  EXPECT_NEAR(scaled_base, 41829.36592889948, 1e-8);
  EXPECT_DOUBLE_EQ(theta[0], 1.0);
  EXPECT_NEAR(theta[1], 0.7170983281048126, 1e-14);  // 41829.37^(−2/64)
  // The lowest frequency is divided by exactly s: base'^(−62/64) = base^(−62/64) / 4.
  EXPECT_NEAR(theta[31], 1.333521432163324e-4 / 4, 1e-17);
}

TEST(Rope, DynamicNtkScalesOnlyPastTheTrainingLength) {
  const RopeEncoding dynamic(rope_config(RopeScalingKind::dynamic_ntk));
  const RopeEncoding plain(rope_config());
  const RopeEncoding ntk2(rope_config(RopeScalingKind::ntk, 2.0));
  EXPECT_EQ(dynamic.frequencies(make_context(1024, 64)), plain.frequencies(make_context(1024, 64)));
  // T = position_offset + seq_len = 2048 = 2·L_train → NTK with s = 2.
  const std::vector<double> extended = dynamic.frequencies(make_context(1024, 64, 2, 1024));
  const std::vector<double> expected = ntk2.frequencies(make_context(1024, 64));
  for (int m = 0; m < 32; ++m) EXPECT_NEAR(extended[m], expected[m], 1e-15) << "m = " << m;
}

TEST(Rope, YarnRampsBetweenInterpolationAndTheOriginalFrequencies) {
  const RopeEncoding rope(rope_config(RopeScalingKind::yarn, 4.0));
  const std::vector<double> theta = rope.frequencies(make_context(8, 64, 2, 0, 1024));
  // m = 0: θ = 1 rotates 1024/(2π) ≈ 163 times over L_train ≥ β = 32 → unchanged.
  EXPECT_DOUBLE_EQ(theta[0], 1.0);
  // m = 10: θ = 10000^(−20/64) ≈ 0.05623, r = 1024·θ/(2π) ≈ 9.165, γ = (r − 1)/31 ≈ 0.2634.
  const double theta10 = std::pow(10000.0, -20.0 / 64.0);
  const double gamma10 = (1024.0 * theta10 / (2.0 * std::numbers::pi) - 1.0) / 31.0;
  EXPECT_NEAR(gamma10, 0.2633786685403368, 1e-12);
  EXPECT_NEAR(theta[10], (1.0 - gamma10) * theta10 / 4.0 + gamma10 * theta10, 1e-15);
  EXPECT_NEAR(theta[10], 0.02516668634179693, 1e-14);
  // m = 20: r ≈ 0.515 ≤ α = 1 → pure interpolation θ/4.
  EXPECT_NEAR(theta[20], std::pow(10000.0, -40.0 / 64.0) / 4.0, 1e-16);
}

TEST(Rope, SoftmaxScaleIncludesTheYarnTemperature) {
  const PositionContext ctx = make_context(8, 64);
  EXPECT_DOUBLE_EQ(RopeEncoding(rope_config()).softmax_scale(ctx), 0.125);
  EXPECT_DOUBLE_EQ(RopeEncoding(rope_config(RopeScalingKind::pi, 4.0)).softmax_scale(ctx), 0.125);
  const double t = 0.1 * std::log(4.0) + 1.0;  // ≈ 1.1386
  EXPECT_NEAR(RopeEncoding(rope_config(RopeScalingKind::yarn, 4.0)).softmax_scale(ctx), 0.125 * t * t, 1e-15);
  EXPECT_NEAR(RopeEncoding(rope_config(RopeScalingKind::yarn, 4.0)).softmax_scale(ctx), 0.16206, 1e-5);
  RopeConfig fixed = rope_config(RopeScalingKind::yarn, 4.0);
  fixed.scaling.yarn_temperature = 1.2;
  EXPECT_NEAR(RopeEncoding(fixed).softmax_scale(ctx), 0.125 * 1.44, 1e-15);
}

TEST(Rope, BackwardMatchesFiniteDifferencesUnderEveryScaling) {
  const int d = 16, t_len = 5, stride = 3 * d;  // stride like the fused qkv activation
  for (RopeScalingKind scaling : {RopeScalingKind::none, RopeScalingKind::pi, RopeScalingKind::ntk,
                                  RopeScalingKind::dynamic_ntk, RopeScalingKind::yarn}) {
    for (double fraction : {1.0, 0.5}) {
      const RopeEncoding rope(rope_config(scaling, 3.0, fraction));
      // Offset 40 with L_train 32 puts dynamic NTK past the training length.
      const PositionContext ctx = make_context(t_len, d, 2, 40, 32);
      for (bool is_key : {false, true}) {
        std::vector<double> x = random_values(t_len * stride, -2, 2, 11);
        std::vector<std::vector<double>> no_params;
        EXPECT_LT(transform_gradient_error(rope, ctx, 1, is_key, x, stride, no_params), 1e-6)
            << scaling << ", fraction " << fraction << (is_key ? ", keys" : ", queries");
      }
    }
  }
}

TEST(Rope, BackwardAccumulatesIntoDx) {
  const RopeEncoding rope(rope_config());
  const PositionContext ctx = make_context(3, 8);
  const std::vector<double> x = random_values(24, -1, 1, 5), dy = random_values(24, -1, 1, 6);
  std::vector<std::vector<double>> none_params, none_grads;
  std::vector<double> fresh(24, 0.0), preloaded(24, 10.0);
  transform_backward_rows(rope, ctx, 0, false, x, 8, none_params, dy, fresh, none_grads);
  transform_backward_rows(rope, ctx, 0, false, x, 8, none_params, dy, preloaded, none_grads);
  for (int i = 0; i < 24; ++i) EXPECT_NEAR(preloaded[i], 10.0 + fresh[i], 1e-12) << "i = " << i;
}

TEST(Rope, RejectsBadOptionsAndArguments) {
  EXPECT_THROW((void)RopeEncoding(rope_config(RopeScalingKind::pi, 0.5)), ConfigError);
  EXPECT_THROW((void)RopeEncoding(rope_config(RopeScalingKind::none, 1.0, 0.0)), ConfigError);
  try {
    RopeEncoding(rope_config(RopeScalingKind::none, 1.0, 0.3)).frequencies(make_context(1, 64));  // 19.2 channels
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "model.position.rope.fraction");
  }
  const RopeEncoding rope(rope_config());
  const std::vector<double> x(8);
  EXPECT_THROW(transform_rows(rope, make_context(1, 8, 2), 2, false, x, 8), std::invalid_argument);  // head 2 of 2
  EXPECT_THROW(transform_rows(rope, make_context(1, 8), 0, false, x, 4), std::invalid_argument);     // stride < d
  EXPECT_THROW(transform_rows(rope, make_context(1, 8), 0, false, x, 8, {{0.0}}), std::invalid_argument);
}
