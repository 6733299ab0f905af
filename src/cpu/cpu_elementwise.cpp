// Elementwise ops: GELU (tanh approximation, as in GPT-2), addition and clamping.
//   gelu(x)  = ½ x (1 + tanh u),  u = √(2/π) (x + 0.044715 x³)
//   gelu'(x) = ½ (1 + tanh u) + ½ x (1 − tanh² u) √(2/π) (1 + 3·0.044715 x²)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

namespace {
template <class Real> constexpr Real kGeluScale = Real(0.7978845608028654);  // √(2/π)
template <class Real> constexpr Real kGeluCubic = Real(0.044715);
}  // namespace

template <class Real> void gelu_forward(int threads, Tensor out, Tensor x) {
  constexpr DType real = dtype_of<Real>();
  check_vector("gelu_forward", "x", x, real, x.numel());
  check_vector("gelu_forward", "out", out, real, x.numel());
  const Real* xs = x.as<Real>();
  Real* y = out.as<Real>();
  parallel_for(threads, x.numel(), [&](std::int64_t i) {
    const Real v = xs[i];
    y[i] = Real(0.5) * v * (Real(1) + std::tanh(kGeluScale<Real> * (v + kGeluCubic<Real> * v * v * v)));
  });
}

template <class Real> void gelu_backward(int threads, Tensor dx, Tensor dout, Tensor x) {
  constexpr DType real = dtype_of<Real>();
  check_vector("gelu_backward", "x", x, real, x.numel());
  check_vector("gelu_backward", "dout", dout, real, x.numel());
  check_vector("gelu_backward", "dx", dx, real, x.numel());
  const Real *xs = x.as<Real>(), *dy = dout.as<Real>();
  Real* d = dx.as<Real>();
  parallel_for(threads, x.numel(), [&](std::int64_t i) {
    const Real v = xs[i];
    const Real t = std::tanh(kGeluScale<Real> * (v + kGeluCubic<Real> * v * v * v));
    const Real du_dx = kGeluScale<Real> * (Real(1) + Real(3) * kGeluCubic<Real> * v * v);
    d[i] = dy[i] * (Real(0.5) * (Real(1) + t) + Real(0.5) * v * (Real(1) - t * t) * du_dx);
  });
}

template <class Real> void add(int threads, Tensor out, Tensor a, Tensor b) {
  constexpr DType real = dtype_of<Real>();
  check_vector("add", "a", a, real, a.numel());
  check_vector("add", "b", b, real, a.numel());
  check_vector("add", "out", out, real, a.numel());
  const Real *as = a.as<Real>(), *bs = b.as<Real>();
  Real* y = out.as<Real>();
  parallel_for(threads, a.numel(), [&](std::int64_t i) { y[i] = as[i] + bs[i]; });
}

template <class Real> void clamp(int threads, Tensor x, double lowest, double highest) {
  check_vector("clamp", "x", x, dtype_of<Real>(), x.numel());
  require(lowest <= highest, "clamp", fmt::format("lowest {} above highest {}", lowest, highest));
  const Real lo = Real(lowest), hi = Real(highest);
  Real* xs = x.as<Real>();
  parallel_for(threads, x.numel(), [&](std::int64_t i) { xs[i] = std::clamp(xs[i], lo, hi); });
}

template void gelu_forward<float>(int, Tensor, Tensor);
template void gelu_forward<double>(int, Tensor, Tensor);
template void gelu_backward<float>(int, Tensor, Tensor, Tensor);
template void gelu_backward<double>(int, Tensor, Tensor, Tensor);
template void add<float>(int, Tensor, Tensor, Tensor);
template void add<double>(int, Tensor, Tensor, Tensor);
template void clamp<float>(int, Tensor, double, double);
template void clamp<double>(int, Tensor, double, double);

}  // namespace pope::cpu
