// Central-difference gradient check shared by every test that verifies a backward pass.
//
//   double error = max_relative_gradient_error(loss, inputs, analytic);
//
// `loss` evaluates a scalar from the current values of `inputs` (it must read them each
// call); `analytic` holds dL/dinputs from the backward under test, element for element.
// Each input is moved to x ± h, the loss re-evaluated, and the input restored exactly, so
// the caller's values are unchanged afterwards. Work in double: with h = 1e-5 the
// central difference is accurate to ~1e-10 for smooth losses of order one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace pope::testing {

struct GradientCheckOptions {
  double step = 1e-5;  // h of (L(x + h) − L(x − h)) / 2h
  // Denominators smaller than this are raised to it: a gradient that should be ~0 is then
  // compared in absolute terms instead of dividing rounding noise by ~0.
  double magnitude_floor = 1e-3;
};

// dloss/dx_i by central differences of step h, each input restored exactly afterwards.
inline std::vector<double> numerical_gradient(std::span<double> inputs, const std::function<double()>& loss,
                                              double step = 1e-5) {
  std::vector<double> gradient(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double original = inputs[i];
    inputs[i] = original + step;
    const double loss_plus = loss();
    inputs[i] = original - step;
    const double loss_minus = loss();
    inputs[i] = original;
    gradient[i] = (loss_plus - loss_minus) / (2.0 * step);
  }
  return gradient;
}

// max_i |analytic_i − numeric_i| / max(|analytic_i|, |numeric_i|, magnitude_floor);
// 0 for empty inputs. Throws std::invalid_argument when the spans differ in length.
inline double max_relative_gradient_error(const std::function<double()>& loss, std::span<double> inputs,
                                          std::span<const double> analytic, GradientCheckOptions options = {}) {
  if (inputs.size() != analytic.size())
    throw std::invalid_argument("max_relative_gradient_error: " + std::to_string(inputs.size()) + " inputs but " +
                                std::to_string(analytic.size()) + " analytic gradient entries");
  const std::vector<double> numeric = numerical_gradient(inputs, loss, options.step);
  double worst = 0.0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double scale = std::max({std::abs(analytic[i]), std::abs(numeric[i]), options.magnitude_floor});
    worst = std::max(worst, std::abs(analytic[i] - numeric[i]) / scale);
  }
  return worst;
}

}  // namespace pope::testing
