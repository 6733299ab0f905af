// Helpers for the CPU backend tests: host tensors over std::vector, random inputs, and an
// element-wise gradient comparison (finite differences come from gradient_check.hpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gradient_check.hpp"
#include "pope/tensor.hpp"

namespace pope::test {

template <class T> Tensor host_tensor(std::vector<T>& values, Shape shape) {
  return Tensor{values.data(), dtype_of<T>(), DeviceKind::cpu, std::move(shape)};
}

inline std::vector<double> random_values(std::size_t count, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> values(count);
  for (double& v : values) v = normal(engine);
  return values;
}

using pope::testing::numerical_gradient;

// |analytic − numeric| ≤ tolerance · max(1, |numeric|) element by element, naming the
// first offending index. Also requires the gradient not to be identically zero, so a
// backward that does nothing cannot pass against a loss that ignores the input.
inline void expect_gradient_matches(const std::vector<double>& analytic, const std::vector<double>& numeric,
                                    const std::string& what, double tolerance = 1e-6) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  double largest = 0.0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    largest = std::max(largest, std::abs(numeric[i]));
    ASSERT_NEAR(analytic[i], numeric[i], tolerance * std::max(1.0, std::abs(numeric[i])))
        << what << ": gradient element " << i;
  }
  EXPECT_GT(largest, 1e-3) << what << ": the numerical gradient vanishes, so the check would prove nothing";
}

// Σ_i weights_i · values_i: a loss whose gradient with respect to `values` is `weights`.
inline double weighted_sum(const std::vector<double>& values, const std::vector<double>& weights) {
  double sum = 0.0;
  for (std::size_t i = 0; i < values.size(); ++i) sum += values[i] * weights[i];
  return sum;
}

}  // namespace pope::test
