// Optimizer support: the squared gradient norm (for clipping), the running loss sum, and
// AdamW (Loshchilov & Hutter), per element of a segment, with g = grad · grad_scale:
//   θ ← θ − lr · wd · θ                      (only on segments with weight_decay)
//   m ← β1 m + (1 − β1) g,   v ← β2 v + (1 − β2) g²
//   θ ← θ − lr · (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps)
// Elements outside every segment (alignment padding of the arena) are left untouched.
// adamw_guarded takes lr, the bias corrections and grad_scale from tensors instead of
// AdamWStep and converts them to Real exactly as adamw does, so both give the same bits.
#include <fmt/format.h>

#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

namespace {

// The per-step scalars of one update, in double as the callers have them.
struct AdamWScalars {
  double lr, grad_scale, correction1, correction2;
};

void check_adamw_arena(std::string_view op, DType real, Tensor params, Tensor grads, Tensor m, Tensor v,
                       std::span<const ParamSegment> segments, double beta1, double beta2, Tensor compute_copy) {
  const std::int64_t total = params.numel();
  check_vector(op, "params", params, real, total);
  check_vector(op, "grads", grads, real, total);
  check_vector(op, "m", m, real, total);
  check_vector(op, "v", v, real, total);
  require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, op,
          fmt::format("beta1 {} and beta2 {} must lie in [0, 1)", beta1, beta2));
  for (std::size_t i = 0; i < segments.size(); ++i)
    require(segments[i].offset >= 0 && segments[i].numel >= 0 && segments[i].offset + segments[i].numel <= total, op,
            fmt::format("segment {} covers [{}, {}), outside the arena's {} elements", i, segments[i].offset,
                        segments[i].offset + segments[i].numel, total));
  if (!compute_copy.empty()) check_floating(op, "compute_copy", compute_copy);
}

template <class Real>
void apply_adamw(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                 double beta1_, double beta2_, double eps_, double weight_decay, const AdamWScalars& s,
                 Tensor compute_copy) {
  const Real lr = Real(s.lr), beta1 = Real(beta1_), beta2 = Real(beta2_), eps = Real(eps_);
  const Real grad_scale = Real(s.grad_scale);
  const Real correction1 = Real(s.correction1), correction2 = Real(s.correction2);
  Real *theta = params.as<Real>(), *first = m.as<Real>(), *second = v.as<Real>();
  const Real* g_all = grads.as<Real>();
  for (const ParamSegment& segment : segments) {
    const Real decay = segment.weight_decay ? lr * Real(weight_decay) : Real(0);
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

}  // namespace

template <class Real> double sum_of_squares(int threads, Tensor x) {
  check_vector("sum_of_squares", "x", x, dtype_of<Real>(), x.numel());
  const Real* xs = x.as<Real>();
  return deterministic_sum(threads, x.numel(), [&](std::int64_t i) { return double(xs[i]) * double(xs[i]); });
}

template <class Real> void sum_of_squares_into(int threads, Tensor result, Tensor x) {
  check_vector("sum_of_squares_into", "result", result, DType::f64, 1);
  *result.as<double>() = sum_of_squares<Real>(threads, x);
}

// In index order on one thread: the loss of a micro-batch is summed exactly as a host loop
// over the per-token losses would (B·T terms, negligible next to the model).
template <class Real> void accumulate_sum(Tensor total, Tensor values) {
  check_vector("accumulate_sum", "total", total, DType::f64, 1);
  check_vector("accumulate_sum", "values", values, dtype_of<Real>(), values.numel());
  const Real* xs = values.as<Real>();
  double sum = 0.0;
  for (std::int64_t i = 0; i < values.numel(); ++i) sum += double(xs[i]);
  *total.as<double>() += sum;
}

template <class Real>
void adamw(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
           const AdamWStep& step, Tensor compute_copy) {
  constexpr std::string_view op = "adamw";
  check_adamw_arena(op, dtype_of<Real>(), params, grads, m, v, segments, step.beta1, step.beta2, compute_copy);
  require(step.step >= 1, op, fmt::format("step is {}, expected >= 1 (1-based for bias correction)", step.step));
  const AdamWScalars scalars{step.lr, step.grad_scale, 1 - std::pow(step.beta1, double(step.step)),
                             1 - std::pow(step.beta2, double(step.step))};
  apply_adamw<Real>(threads, params, grads, m, v, segments, step.beta1, step.beta2, step.eps, step.weight_decay,
                    scalars, compute_copy);
}

template <class Real>
void adamw_guarded(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                   const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy) {
  constexpr std::string_view op = "adamw_guarded";
  check_adamw_arena(op, dtype_of<Real>(), params, grads, m, v, segments, hyper.beta1, hyper.beta2, compute_copy);
  check_vector(op, "schedule", schedule, DType::f64, kStepScheduleSize);
  check_vector(op, "stats", stats, DType::f64, kStepStatsSize);
  const double* inputs = schedule.as<double>();
  double* results = stats.as<double>();
  const double norm = std::sqrt(results[kStatsGradSquares]);
  const bool finite = std::isfinite(results[kStatsLossSum]) && std::isfinite(norm);
  results[kStatsApplied] = finite ? 1.0 : 0.0;
  if (!finite) return;
  const AdamWScalars scalars{inputs[kScheduleLr], clip_scale(hyper.grad_clip, norm), inputs[kScheduleCorrection1],
                             inputs[kScheduleCorrection2]};
  apply_adamw<Real>(threads, params, grads, m, v, segments, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay,
                    scalars, compute_copy);
}

template double sum_of_squares<float>(int, Tensor);
template double sum_of_squares<double>(int, Tensor);
template void sum_of_squares_into<float>(int, Tensor, Tensor);
template void sum_of_squares_into<double>(int, Tensor, Tensor);
template void accumulate_sum<float>(Tensor, Tensor);
template void accumulate_sum<double>(Tensor, Tensor);
template void adamw<float>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>, const AdamWStep&, Tensor);
template void adamw<double>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>, const AdamWStep&, Tensor);
template void adamw_guarded<float>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>,
                                   const AdamWHyper&, Tensor, Tensor, Tensor);
template void adamw_guarded<double>(int, Tensor, Tensor, Tensor, Tensor, std::span<const ParamSegment>,
                                    const AdamWHyper&, Tensor, Tensor, Tensor);

}  // namespace pope::cpu
