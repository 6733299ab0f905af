// Elementwise ops: GELU (cpu/cpu_gelu.hpp), addition and clamping.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_gelu.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

template <class Real> void gelu_forward(int threads, Tensor out, Tensor x) {
  constexpr DType real = dtype_of<Real>();
  check_vector("gelu_forward", "x", x, real, x.numel());
  check_vector("gelu_forward", "out", out, real, x.numel());
  const Real* xs = x.as<Real>();
  Real* y = out.as<Real>();
  parallel_for(threads, x.numel(), [&](std::int64_t i) { y[i] = gelu(xs[i]); });
}

template <class Real> void gelu_backward(int threads, Tensor dx, Tensor dout, Tensor x) {
  constexpr DType real = dtype_of<Real>();
  check_vector("gelu_backward", "x", x, real, x.numel());
  check_vector("gelu_backward", "dout", dout, real, x.numel());
  check_vector("gelu_backward", "dx", dx, real, x.numel());
  const Real *xs = x.as<Real>(), *dy = dout.as<Real>();
  Real* d = dx.as<Real>();
  parallel_for(threads, x.numel(), [&](std::int64_t i) { d[i] = dy[i] * gelu_derivative(xs[i]); });
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
