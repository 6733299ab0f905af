// xPos (position/xpos.cpp) beyond the generic suites: the paper's decay ζ_m^((t−s)/γ) on
// top of RoPE's rotation, scores that depend on t − s only, and calls whose scales would leave
// the floating-point range refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model_shape.hpp"
#include "pope/position.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

constexpr int kHeadDim = 16;
constexpr int kTrain = 64;

std::unique_ptr<PositionEncoding> xpos(double scale_base = 512.0) {
  ModelConfig model = model_config({.n_head = 1, .n_embd = kHeadDim, .context_length = kTrain}, "xpos");
  model.position.xpos.scale_base = scale_base;
  return make_position_encoding(model);
}

// The score of a query at t and a key at s that are both the unit vector of channel c, all
// rows of one call of length T (the centre is the call's, as in attention).
double unit_score(const PositionEncoding& e, int c, int t, int s, int T) {
  const PositionContext ctx = make_context(T, kHeadDim, 1, 0, kTrain);
  std::vector<double> x(std::size_t(T) * kHeadDim, 0.0);
  for (int row = 0; row < T; ++row) x[std::size_t(row) * kHeadDim + c] = 1.0;
  const std::vector<double> q = transform_rows(e, ctx, 0, false, x, kHeadDim);
  const std::vector<double> k = transform_rows(e, ctx, 0, true, x, kHeadDim);
  double dot = 0.0;
  for (int i = 0; i < kHeadDim; ++i) dot += q[std::size_t(t) * kHeadDim + i] * k[std::size_t(s) * kHeadDim + i];
  return dot;
}

}  // namespace

TEST(Xpos, ScoresDecayAsZetaToTheLagOverGamma) {
  const auto e = xpos(8.0);  // a short γ so that the decay is large over a few lags
  for (int m : {0, 3, 7}) {
    const double zeta = (2.0 * m / kHeadDim + 0.4) / 1.4;
    const double theta = std::pow(10000.0, -2.0 * m / kHeadDim);
    for (auto [t, s] : {std::pair{5, 5}, {9, 2}, {40, 1}, {63, 30}}) {
      const double lag = t - s;
      EXPECT_NEAR(unit_score(*e, m, t, s, kTrain), std::pow(zeta, lag / 8.0) * std::cos(lag * theta), 1e-12)
          << "pair " << m << ", t " << t << ", s " << s;
    }
  }
}

TEST(Xpos, ScoresDependOnTheLagOnly) {
  const auto e = xpos();
  const double near = unit_score(*e, 2, 10, 3, kTrain);
  EXPECT_NEAR(unit_score(*e, 2, 60, 53, kTrain), near, 1e-12);
  EXPECT_NEAR(unit_score(*e, 2 + kHeadDim / 2, 31, 24, kTrain), near, 1e-12);  // the pair's second channel
}

TEST(Xpos, PositionsWhoseScaleWouldOverflowAreRefused) {
  const auto e = xpos(8.0);  // |ln ζ_0| / γ ≈ 0.157: e^80 is reached about 510 positions from the centre
  const PositionContext ctx = make_context(4, kHeadDim, 1, 1000, kTrain);
  std::vector<double> x(4 * kHeadDim, 1.0);
  try {
    (void)transform_rows(*e, ctx, 0, false, x, kHeadDim);
    FAIL() << "no error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("model.position.xpos.scale_base"), std::string::npos) << error.what();
  }
  EXPECT_THROW((void)e->plan(ctx), std::invalid_argument);
}
