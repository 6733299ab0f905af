// PJ-rotary (spec 5.2): the spec's golden scores and features, relativity, K = 0 against
// RoPE, the shear for higher K, and finite-difference checks of the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

PjConfig rotary_config(int order, double base = 10000.0, double eta = 1.0) {
  PjConfig config;
  config.rotary_order = order;
  config.rotary_base = base;
  config.rotary_eta = eta;
  return config;
}

// The spec's golden example uses one block with ω = 0.37. Block 0 always has ω = 1, so the
// example sits in block 1 of a two-block head (ω_1 = base^(−1/2) = 0.37) with block 0 zero.
const double kGoldenBase = 1.0 / (0.37 * 0.37);

std::vector<double> in_block_one(const std::vector<double>& four) {
  std::vector<double> row(8, 0.0);
  std::copy(four.begin(), four.end(), row.begin() + 4);
  return row;
}

}  // namespace

TEST(PjRotary, GoldenScoresAndQueryFeature) {
  const PjRotaryEncoding rotary(rotary_config(1, kGoldenBase));
  EXPECT_NEAR(rotary.frequencies(8)[1], 0.37, 1e-15);
  const PositionContext ctx = make_context(1, 8, 1, 0, 16);
  const std::vector<double> q = in_block_one({0.2, -0.3, 0.5, 0.7});
  const std::vector<double> k = in_block_one({-0.6, 0.1, 0.3, -0.4});
  EXPECT_NEAR(transformed_score(rotary, ctx, 0, q, 9, k, 4), -0.309766252158, 1e-12);
  EXPECT_NEAR(transformed_score(rotary, ctx, 0, q, 5, k, 0), -0.309766252158, 1e-12);
  EXPECT_NEAR(transformed_score(rotary, ctx, 0, q, 4, k, 4), -0.28, 1e-12);
  EXPECT_NEAR(transformed_score(rotary, ctx, 0, q, 20, k, 3), -0.524844108005, 1e-12);
  const std::vector<double> q9 = transform_at(rotary, ctx, 9, 0, false, q);
  const double expected[] = {-0.455174818, -0.182226536, -0.360045624, -0.781259975};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(q9[4 + i], expected[i], 1e-9) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q9[i], 0.0);
}

TEST(PjRotary, ScoreDependsOnlyOnTheLagForEveryOrder) {
  for (int order : {0, 1, 2, 3}) {
    const PjRotaryEncoding rotary(rotary_config(order));
    const int d = 8 * (order + 1);
    const PositionContext ctx = make_context(1, d, 1, 0, 64);
    const std::vector<double> q = random_values(d, -1, 1, 1), k = random_values(d, -1, 1, 2);
    for (auto [t, s] : {std::pair{10, 3}, std::pair{300, 299}, std::pair{7, 7}}) {
      const double score = transformed_score(rotary, ctx, 0, q, t, k, s);
      for (int shift : {1, 50, 1000})
        EXPECT_NEAR(score, transformed_score(rotary, ctx, 0, q, t + shift, k, s + shift), 1e-10 * (1 + shift / 64.0))
            << "K = " << order << " (" << t << ", " << s << ") + " << shift;
    }
  }
}

TEST(PjRotary, OrderZeroIsRopeWithAdjacentPairs) {
  // PJ-rotary K = 0 pairs (x_{2m}, x_{2m+1}); RoPE pairs (x_m, x_{m+d/2}); same frequencies.
  const int d = 16;
  const PjRotaryEncoding rotary(rotary_config(0));
  const RopeEncoding rope{RopeConfig{}};
  const PositionContext ctx = make_context(1, d, 1, 0, 64);
  const std::vector<double> x = random_values(d, -1, 1, 3);
  std::vector<double> x_half_split(d);
  for (int m = 0; m < d / 2; ++m) {
    x_half_split[m] = x[2 * m];
    x_half_split[m + d / 2] = x[2 * m + 1];
  }
  for (int position : {0, 5, 1234}) {
    for (bool is_key : {false, true}) {
      const std::vector<double> y = transform_at(rotary, ctx, position, 0, is_key, x);
      const std::vector<double> y_rope = transform_at(rope, ctx, position, 0, is_key, x_half_split);
      for (int m = 0; m < d / 2; ++m) {
        EXPECT_NEAR(y[2 * m], y_rope[m], 1e-12) << position << " m " << m;
        EXPECT_NEAR(y[2 * m + 1], y_rope[m + d / 2], 1e-12) << position << " m " << m;
      }
    }
  }
  EXPECT_DOUBLE_EQ(rotary.softmax_scale(make_context(1, d)), rope.softmax_scale(make_context(1, d)));
}

TEST(PjRotary, OrderTwoShearsWithTheJetMatrix) {
  // One block, K = 2, at position p = L (c = η = 0.5): before the rotation,
  // query y_r = Σ_{t≥r} c^{t−r}/(t−r)! z_t, key y_r = Σ_{t≤r} (−c)^{r−t}/(r−t)! z_t. With ω = 1
  // (block 0) and p = 16 the rotation is by 16 rad.
  const PjRotaryEncoding rotary(rotary_config(2, 10000.0, 0.5));
  const PositionContext ctx = make_context(1, 6, 1, 0, 16);
  const std::vector<double> z = {1.0, 0.0, 0.0, 2.0, -1.0, 0.5};
  const double c = 0.5;
  const double re[3] = {1.0 + c * 0.0 + c * c / 2 * -1.0, 0.0 + c * -1.0, -1.0};
  const double im[3] = {0.0 + c * 2.0 + c * c / 2 * 0.5, 2.0 + c * 0.5, 0.5};
  const double key_re[3] = {1.0, 0.0 - c * 1.0, -1.0 - c * 0.0 + c * c / 2 * 1.0};
  const double key_im[3] = {0.0, 2.0 - c * 0.0, 0.5 - c * 2.0 + c * c / 2 * 0.0};
  const std::vector<double> y = transform_at(rotary, ctx, 16, 0, false, z);
  const std::vector<double> y_key = transform_at(rotary, ctx, 16, 0, true, z);
  const double cs = std::cos(16.0), sn = std::sin(16.0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NEAR(y[2 * r], re[r] * cs - im[r] * sn, 1e-14) << r;
    EXPECT_NEAR(y[2 * r + 1], re[r] * sn + im[r] * cs, 1e-14) << r;
    EXPECT_NEAR(y_key[2 * r], key_re[r] * cs - key_im[r] * sn, 1e-14) << r;
    EXPECT_NEAR(y_key[2 * r + 1], key_re[r] * sn + key_im[r] * cs, 1e-14) << r;
  }
}

TEST(PjRotary, BackwardMatchesFiniteDifferences) {
  for (int order : {0, 1, 3}) {
    const PjRotaryEncoding rotary(rotary_config(order));
    const int d = 4 * (order + 1);
    for (bool is_key : {false, true}) {
      const PositionContext ctx = make_context(5, d, 2, 90, 32);
      std::vector<double> x = random_values(5 * (d + 2), -1, 1, 9);  // rows with a longer stride
      std::vector<std::vector<double>> params;
      EXPECT_LT(transform_gradient_error(rotary, ctx, 1, is_key, x, d + 2, params), 1e-8)
          << "K = " << order << (is_key ? " keys" : " queries");
    }
  }
}

TEST(PjRotary, FloatAgreesWithDouble) {
  const PjRotaryEncoding rotary(rotary_config(1));
  const PositionContext ctx = make_context(4, 8, 1, 3000, 1024);
  const std::vector<double> x = random_values(32, -1, 1, 4);
  const std::vector<float> xf(x.begin(), x.end());
  const auto y = transform_rows(rotary, ctx, 0, false, x, 8);
  const auto yf = transform_rows(rotary, ctx, 0, false, xf, 8);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yf[i], y[i], 2e-6) << i;
}

TEST(PjRotary, RejectsBadOptions) {
  const auto expect_key = [](const PjConfig& config, int head_dim, const std::string& key) {
    try {
      PjRotaryEncoding(config).blocks(head_dim);
      ADD_FAILURE() << "expected ConfigError for " << key;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.path(), key);
    }
  };
  expect_key(rotary_config(2), 64, "model.position.pj.rotary_order");  // blocks of 6 do not divide 64
  expect_key(rotary_config(16), 64, "model.position.pj.rotary_order");
  expect_key(rotary_config(1, 1.0), 64, "model.position.pj.rotary_base");
  expect_key(rotary_config(1, 10000.0, -1.0), 64, "model.position.pj.rotary_eta");
  EXPECT_EQ(PjRotaryEncoding(rotary_config(1)).blocks(64), 16);
  EXPECT_TRUE(PjRotaryEncoding(rotary_config(1)).layer_parameters(4, 64).empty());
}

// The shear rate the CUDA plan takes: c_p = (η / L_train)·p, and a context without L_train is
// named as such instead of dividing by zero.
TEST(PjRotary, ShearRateIsEtaOverTrainLength) {
  const PjRotaryEncoding rotary(rotary_config(1, 10000.0, 0.5));
  EXPECT_DOUBLE_EQ(rotary.shear_rate(make_context(4, 8, 1, 0, 16), "test"), 0.5 / 16);
  EXPECT_THROW(rotary.shear_rate(make_context(4, 8, 1, 0, 0), "test"), std::invalid_argument);
}
