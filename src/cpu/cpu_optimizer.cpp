// Optimizer support: the squared gradient norm (for clipping) and AdamW.
// AdamW (Loshchilov & Hutter), per element of a segment, with g = grad · grad_scale:
//   θ ← θ − lr · wd · θ                      (only on segments with weight_decay)
//   m ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²
//   θ ← θ − lr · (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps)
// Elements outside every segment (alignment padding of the arena) are left untouched.
#include <fmt/format.h>

#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

template <class Real> double sum_of_squares(int threads, Tensor x) {
  check_vector("sum_of_squares", "x", x, dtype_of<Real>(), x.numel());
  const Real* xs = x.as<Real>();
  return deterministic_sum(threads, x.numel(), [&](std::int64_t i) { return double(xs[i]) * double(xs[i]); });
}

template <class Real>
void adamw(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
           const AdamWStep& step, Tensor compute_copy) {
  constexpr std::string_view op = "adamw";
  constexpr DType real = dtype_of<Real>();
  const std::int64_t total = params.numel();
  check_vector(op, "params", params, real, total);
  check_vector(op, "grads", grads, real, total);
  check_vector(op, "m", m, real, total);
  check_vector(op, "v", v, real, total);
  require(step.step >= 1, op, fmt::format("step is {}, expected >= 1 (1-based for bias correction)", step.step));
  require(step.beta1 >= 0 && step.beta1 < 1 && step.beta2 >= 0 && step.beta2 < 1, op,
          fmt::format("beta1 {} and beta2 {} must lie in [0, 1)", step.beta1, step.beta2));
  for (std::size_t i = 0; i < segments.size(); ++i)
    require(segments[i].offset >= 0 && segments[i].numel >= 0 && segments[i].offset + segments[i].numel <= total, op,
            fmt::format("segment {} covers [{}, {}), outside the arena's {} elements", i, segments[i].offset,
                        segments[i].offset + segments[i].numel, total));
  if (!compute_copy.empty()) check_floating(op, "compute_copy", compute_copy);

  const Real lr = Real(step.lr), beta1 = Real(step.beta1), beta2 = Real(step.beta2), eps = Real(step.eps);
  const Real grad_scale = Real(step.grad_scale);
  const Real correction1 = Real(1 - std::pow(step.beta1, double(step.step)));
  const Real correction2 = Real(1 - std::pow(step.beta2, double(step.step)));
  Real *theta = params.as<Real>(), *first = m.as<Real>(), *second = v.as<Real>();
  const Real* g_all = grads.as<Real>();
  for (const ParamSegment& segment : segments) {
    const Real decay = segment.weight_decay ? lr * Real(step.weight_decay) : Real(0);
    parallel_for(threads, segment.numel, [&](std::int64_t j) {
      const std::int64_t i = segment.offset + j;
      const Real g = g_all[i] * grad_scale;
      first[i] = beta1 * first[i] + (1 - beta1) * g;
      second[i] = beta2 * second[i] + (1 - beta2) * g * g;
      const Real m_hat = first[i] / correction1, v_hat = second[i] / correction2;
      theta[i] -= decay * theta[i] + lr * m_hat / (std::sqrt(v_hat) + eps);
    });
  }
  if (!compute_copy.empty()) convert(threads, compute_copy, params);
}

template double sum_of_squares<float>(int, Tensor);
template double sum_of_squares<double>(int, Tensor);
template void adamw<float>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>, const AdamWStep&, Tensor);
template void adamw<double>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>, const AdamWStep&, Tensor);

}  // namespace pope::cpu
