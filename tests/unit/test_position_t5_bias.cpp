// T5's bucketed bias (position/t5_bias.cpp) beyond the generic suites: the buckets of
// T5's causal formula at its defaults, the gradient as the sum of Ĝ over a bucket's lags, and
// the refusal of a max_distance the log-spaced buckets cannot reach.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model_shape.hpp"
#include "pope/position.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

ModelConfig t5_model(int buckets = 32, int max_distance = 128) {
  ModelConfig model = model_config({.n_head = 2, .n_embd = 16, .context_length = 64}, "t5_bias");
  model.position.t5_bias.buckets = buckets;
  model.position.t5_bias.max_distance = max_distance;
  return model;
}

}  // namespace

TEST(T5Bias, BucketsFollowT5sCausalFormula) {
  const auto e = make_position_encoding(t5_model());
  const BiasPlan plan = e->bias_plan(make_context(1200, 8, 2));
  ASSERT_EQ(plan.kind, BiasKind::lag_buckets);
  const std::vector<int>& bucket = plan.buckets.bucket_of_lag;
  for (int lag = 0; lag < 16; ++lag) EXPECT_EQ(bucket[std::size_t(lag)], lag);
  // 16 + ⌊ln(Δ/16) / ln(128/16) · 16⌋, at most 31.
  EXPECT_EQ(bucket[16], 16);
  EXPECT_EQ(bucket[20], 17);
  EXPECT_EQ(bucket[64], 26);
  EXPECT_EQ(bucket[127], 31);
  EXPECT_EQ(bucket[128], 31);
  EXPECT_EQ(bucket[1199], 31);
}

TEST(T5Bias, GradientIsTheSumOfTheDiagonalsOverEachBucket) {
  const auto e = make_position_encoding(t5_model(8, 16));  // buckets 0..3 exact, then 4..7 over 4..15
  const PositionContext ctx = make_context(40, 8, 2);
  std::vector<double> w(16, 0.0), dw(16, 0.0), diag(40);
  for (int lag = 0; lag < 40; ++lag) diag[std::size_t(lag)] = 1.0 + lag;
  const std::vector<const double*> params{w.data()};
  const std::vector<double*> grads{dw.data()};
  e->score_bias_backward(ctx, 1, params, diag.data(), grads);
  const std::vector<int>& bucket = e->bias_plan(ctx).buckets.bucket_of_lag;
  std::vector<double> want(8, 0.0);
  for (int lag = 0; lag < 40; ++lag) want[std::size_t(bucket[std::size_t(lag)])] += 1.0 + lag;
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ(dw[std::size_t(b)], 0.0) << "head 0 is untouched";
    EXPECT_EQ(dw[std::size_t(8 + b)], want[std::size_t(b)]) << "bucket " << b;
  }
  EXPECT_EQ(bucket[39], 7);  // the last bucket holds every lag from max_distance on
}

TEST(T5Bias, MaxDistanceMustPassTheExactBuckets) {
  try {
    (void)make_position_encoding(t5_model(32, 16));
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.path(), "model.position.t5_bias.max_distance");
  }
}
