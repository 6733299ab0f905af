// The finite-difference checker itself: it must accept a correct gradient, flag a wrong one
// and leave its inputs as it found them.
#include <gtest/gtest.h>

#include <vector>

#include "gradient_check.hpp"

using pope::testing::max_relative_gradient_error;

namespace {

// L = Σ a_i x_i³, dL/dx_i = 3 a_i x_i².
struct Cubic {
  std::vector<double> a{0.5, -1.5, 2.0};
  std::vector<double> x{0.3, -0.7, 1.1};
  double loss() const {
    double sum = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) sum += a[i] * x[i] * x[i] * x[i];
    return sum;
  }
  std::vector<double> gradient() const {
    std::vector<double> g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) g[i] = 3.0 * a[i] * x[i] * x[i];
    return g;
  }
};

}  // namespace

TEST(GradientCheck, AcceptsTheExactGradientAndRestoresInputs) {
  Cubic f;
  const std::vector<double> before = f.x;
  const std::vector<double> g = f.gradient();
  EXPECT_LT(max_relative_gradient_error([&] { return f.loss(); }, f.x, g), 1e-8);
  EXPECT_EQ(f.x, before);
}

TEST(GradientCheck, FlagsAWrongGradient) {
  Cubic f;
  std::vector<double> g = f.gradient();
  g[1] *= 1.01;  // a 1% error in one entry
  EXPECT_NEAR(max_relative_gradient_error([&] { return f.loss(); }, f.x, g), 0.01 / 1.01, 1e-6);
}

TEST(GradientCheck, RejectsMismatchedLengths) {
  Cubic f;
  const std::vector<double> g(2);
  EXPECT_THROW(max_relative_gradient_error([&] { return f.loss(); }, f.x, g), std::invalid_argument);
}
