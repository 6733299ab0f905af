// PoPE's softplus on the device (kernels::softplus_parts: one exponential, a series or the
// hardware log2, see encoding_math.cuh) against double precision: softplus(x) = log1p(e^x) and
// σ(x) = 1 / (1 + e^−x) within 4e−6 relative error over x ∈ [−30, 30] in steps of 2^−12 (both
// sides of the series' switch at |x| = ln 8 included) and at the edges of float's normal range
// for e^−|x| (|x| up to 80). Reports SKIPPED without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "cuda_op_test_support.hpp"
#include "softplus_values.hpp"

namespace {

using namespace pope;

// |got − want| / want, infinite for NaN so that a NaN is the worst error.
double relative_error(double got, double want) {
  const double error = std::abs(got - want) / want;
  return std::isnan(error) ? INFINITY : error;
}

TEST(CudaSoftplus, MatchesDoublePrecision) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_backend(DeviceChoice::cuda);
  std::vector<float> x;
  for (int i = -30 * 4096; i <= 30 * 4096; ++i) x.push_back(float(i) / 4096.0f);
  const float ln8 = std::log(8.0f);
  for (float edge : {0.0f, 1e-30f, -1e-30f, ln8, -ln8, std::nextafter(ln8, 0.0f), std::nextafter(-ln8, 0.0f),
                     std::nextafter(ln8, 10.0f), std::nextafter(-ln8, -10.0f), 40.0f, -40.0f, 80.0f, -80.0f})
    x.push_back(edge);
  const int count = int(x.size());
  const OwnedTensor input = test::make_tensor(*gpu, {count}, DType::f32, x);
  const OwnedTensor value = test::make_tensor(*gpu, {count}, DType::f32, std::vector<float>(x.size(), std::nanf("")));
  const OwnedTensor derivative =
      test::make_tensor(*gpu, {count}, DType::f32, std::vector<float>(x.size(), std::nanf("")));
  gpu->synchronize();
  ASSERT_EQ(pope::testing::softplus_values(static_cast<const float*>(input.tensor.data), count,
                                           static_cast<float*>(value.tensor.data),
                                           static_cast<float*>(derivative.tensor.data)),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> got_value = test::download(*gpu, value.tensor);
  const std::vector<double> got_derivative = test::download(*gpu, derivative.tensor);
  double worst_value = 0.0, worst_derivative = 0.0;
  int worst_value_at = 0, worst_derivative_at = 0;
  for (int i = 0; i < count; ++i) {
    const double xi = x[std::size_t(i)];
    const double want_value = std::log1p(std::exp(xi)), want_derivative = 1.0 / (1.0 + std::exp(-xi));
    const double value_error = relative_error(got_value[std::size_t(i)], want_value);
    const double derivative_error = relative_error(got_derivative[std::size_t(i)], want_derivative);
    if (value_error > worst_value) worst_value = value_error, worst_value_at = i;
    if (derivative_error > worst_derivative) worst_derivative = derivative_error, worst_derivative_at = i;
  }
  EXPECT_LT(worst_value, 4e-6) << "softplus at x = " << x[std::size_t(worst_value_at)];
  EXPECT_LT(worst_derivative, 4e-6) << "its derivative at x = " << x[std::size_t(worst_derivative_at)];
}

}  // namespace
