// Softmax cross-entropy over the first vocab_size columns of each logits row (the rest is
// padding to an aligned width and takes no part). With m = max_j z_j over real columns:
//   loss   = log Σ_j exp(z_j − m) + m − z_target
//   dlogit = (softmax(z)_j − [j = target]) · grad_scale,  0 in padded columns
// A negative target masks the row: loss 0 and, with compute_grad, a zero gradient row.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

template <class Real>
void cross_entropy(int threads, Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                   double grad_scale) {
  constexpr std::string_view op = "cross_entropy";
  constexpr DType real = dtype_of<Real>();
  const std::int64_t rows = check_logits(op, logits, real, vocab_size), padded = logits.dim(1);
  check_vector(op, "targets", targets, DType::i32, rows);
  check_vector(op, "losses", losses, real, rows);
  const auto* target = targets.as<std::int32_t>();
  for (std::int64_t n = 0; n < rows; ++n)
    require(target[n] < vocab_size, op,
            fmt::format("targets[{}] = {} is not below vocab_size {} (negative targets mean masked)", n, target[n],
                        vocab_size));

  Real* z_all = logits.as<Real>();
  Real* loss = losses.as<Real>();
  const Real scale = Real(grad_scale);
  parallel_for(threads, rows, [&](std::int64_t n) {
    Real* z = z_all + n * padded;
    if (target[n] < 0) {
      loss[n] = 0;
      if (compute_grad) std::fill(z, z + padded, Real(0));
      return;
    }
    const Real max_logit = *std::max_element(z, z + vocab_size);
    Real sum = 0;
    for (int j = 0; j < vocab_size; ++j) sum += std::exp(z[j] - max_logit);
    const Real log_sum = std::log(sum);
    loss[n] = log_sum + max_logit - z[target[n]];
    if (!compute_grad) return;
    for (int j = 0; j < vocab_size; ++j) {
      const Real probability = std::exp(z[j] - max_logit - log_sum);
      z[j] = (probability - (j == target[n] ? Real(1) : Real(0))) * scale;
    }
    std::fill(z + vocab_size, z + padded, Real(0));
  });
}

template void cross_entropy<float>(int, Tensor, Tensor, Tensor, int, bool, double);
template void cross_entropy<double>(int, Tensor, Tensor, Tensor, int, bool, double);

}  // namespace pope::cpu
