// ALiBi: slopes for power-of-two and other head counts (hand-written expected lists),
// head_fraction, the bias table, and the (parameter-free) backward.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

void expect_slopes(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t h = 0; h < expected.size(); ++h) EXPECT_NEAR(actual[h], expected[h], 1e-15) << "head " << h;
}

AlibiConfig alibi_config(double head_fraction = 1.0) {
  AlibiConfig config;
  config.head_fraction = head_fraction;
  return config;
}

}  // namespace

TEST(Alibi, SlopesForEightHeadsAreOneHalfToOne256th) {
  expect_slopes(alibi_slopes(8), {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625});
}

TEST(Alibi, SlopesForTwelveHeadsInterleaveTheSixteenHeadSet) {
  // The 8-head slopes, then 2^(−0.5), 2^(−1.5), 2^(−2.5), 2^(−3.5) from the 16-head set.
  expect_slopes(alibi_slopes(12), {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                                   0.7071067811865476, 0.3535533905932738, 0.1767766952966369, 0.08838834764831845});
}

TEST(Alibi, SlopesForSixHeadsInterleaveTheEightHeadSet) {
  // The 4-head slopes 2^(−2(h+1)), then 2^(−1), 2^(−3) from the 8-head set.
  expect_slopes(alibi_slopes(6), {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
}

TEST(Alibi, HeadFractionGivesTheFirstHeadsTheirOwnSlopesAndTheRestNone) {
  expect_slopes(AlibiEncoding(alibi_config(0.5)).head_slopes(8), {0.25, 0.0625, 0.015625, 0.00390625, 0, 0, 0, 0});
  expect_slopes(AlibiEncoding(alibi_config(1.0)).head_slopes(8), alibi_slopes(8));
}

TEST(Alibi, BiasTableIsMinusSlopeTimesLag) {
  const AlibiEncoding alibi(alibi_config(0.5));
  const PositionContext ctx = make_context(6, 64, 8, 100);
  std::vector<float> table_f(6);
  std::vector<double> table(6);
  alibi.score_bias(ctx, 1, ParamValues<double>{}, table.data());
  alibi.score_bias(ctx, 1, ParamValues<float>{}, table_f.data());
  for (int lag = 0; lag < 6; ++lag) {
    EXPECT_DOUBLE_EQ(table[lag], -0.0625 * lag);
    EXPECT_FLOAT_EQ(table_f[lag], static_cast<float>(-0.0625 * lag));
  }
  alibi.score_bias(ctx, 6, ParamValues<double>{}, table.data());  // a head without a slope
  for (double b : table) EXPECT_EQ(b, 0.0);
}

TEST(Alibi, PlansItsTableAsLinearWithSlopeMinusM) {
  // What the GPU kernels compute instead of reading the table: the table must be slope · Δ.
  const AlibiEncoding alibi(alibi_config(0.5));
  const PositionContext ctx = make_context(50, 64, 8, 100);
  const BiasPlan plan = alibi.bias_plan(ctx);
  ASSERT_EQ(plan.kind, BiasKind::linear);
  ASSERT_EQ(plan.slopes.size(), 8u);
  std::vector<double> table(50);
  for (int h = 0; h < 8; ++h) {
    const double slope = plan.slopes[std::size_t(h)];
    EXPECT_DOUBLE_EQ(slope, -alibi.head_slopes(8)[std::size_t(h)]);
    alibi.score_bias(ctx, h, ParamValues<double>{}, table.data());
    for (int lag = 0; lag < 50; ++lag) EXPECT_DOUBLE_EQ(table[std::size_t(lag)], slope * lag) << h << " " << lag;
  }
}

TEST(Alibi, HasABiasButNoParametersAndNoTransform) {
  const AlibiEncoding alibi(alibi_config());
  EXPECT_TRUE(alibi.has_score_bias());
  EXPECT_FALSE(alibi.transforms_qk());
  EXPECT_TRUE(alibi.layer_parameters(8, 64).empty());
  EXPECT_DOUBLE_EQ(alibi.softmax_scale(make_context(8, 64)), 0.125);
  EXPECT_THROW(transform_rows(alibi, make_context(1, 4), 0, false, std::vector<double>(4), 4), std::logic_error);
}

TEST(Alibi, BiasBackwardHasNothingToAccumulate) {
  // ALiBi's bias has no parameters: the hook must accept the empty set but refuse a
  // parameter it does not have.
  const AlibiEncoding alibi(alibi_config());
  const PositionContext ctx = make_context(4, 64, 8);
  const std::vector<double> diag_grad{1.0, -2.0, 0.5, 3.0};
  EXPECT_NO_THROW(alibi.score_bias_backward(ctx, 3, ParamValues<double>{}, diag_grad.data(), ParamGrads<double>{}));
  double spurious = 0.0;
  double* spurious_grad[] = {&spurious};
  EXPECT_THROW(
      alibi.score_bias_backward(ctx, 3, ParamValues<double>{}, diag_grad.data(), ParamGrads<double>(spurious_grad)),
      std::invalid_argument);
}

TEST(Alibi, RejectsBadArguments) {
  EXPECT_THROW((void)AlibiEncoding(alibi_config(0.0)), ConfigError);
  EXPECT_THROW((void)AlibiEncoding(alibi_config(1.5)), ConfigError);
  EXPECT_THROW(alibi_slopes(0), std::invalid_argument);
  std::vector<double> table(4);
  EXPECT_THROW(AlibiEncoding(alibi_config()).score_bias(make_context(4, 64, 8), 8, ParamValues<double>{}, table.data()),
               std::invalid_argument);
}
