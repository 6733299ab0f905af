// GELU, tanh approximation (as in GPT-2), and its derivative, on one value in Real: one definition for
// the elementwise ops and the FP8 casts that apply GELU on the way.
//   gelu(x)  = ½ x (1 + tanh u),  u = √(2/π) (x + 0.044715 x³)
//   gelu'(x) = ½ (1 + tanh u) + ½ x (1 − tanh² u) √(2/π) (1 + 3·0.044715 x²)
#pragma once

#include <cmath>

namespace pope::cpu {

template <class Real> constexpr Real kGeluScale = Real(0.7978845608028654);  // √(2/π)
template <class Real> constexpr Real kGeluCubic = Real(0.044715);

template <class Real> Real gelu(Real v) {
  return Real(0.5) * v * (Real(1) + std::tanh(kGeluScale<Real> * (v + kGeluCubic<Real> * v * v * v)));
}

template <class Real> Real gelu_derivative(Real v) {
  const Real t = std::tanh(kGeluScale<Real> * (v + kGeluCubic<Real> * v * v * v));
  const Real du_dx = kGeluScale<Real> * (Real(1) + Real(3) * kGeluCubic<Real> * v * v);
  return Real(0.5) * (Real(1) + t) + Real(0.5) * v * (Real(1) - t * t) * du_dx;
}

}  // namespace pope::cpu
