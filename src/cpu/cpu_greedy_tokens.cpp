// Greedy decoding's choice over each logits row's first vocab_size columns: the first of the
// largest, and its log-softmax −log Σ_j exp(z_j − max) (the chosen logit is the max). A row
// holding a non-finite logit gets id 0 and log-probability NaN. past[0] += advance, where given.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"

namespace pope::cpu {

template <class Real>
void greedy_tokens(int threads, Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past, int advance) {
  constexpr std::string_view op = "greedy_tokens";
  constexpr DType real = dtype_of<Real>();
  const std::int64_t rows = check_logits(op, logits, real, vocab_size), padded = logits.dim(1);
  check_vector(op, "ids", ids, DType::i32, rows);
  check_vector(op, "log_probs", log_probs, real, rows);
  if (!past.empty()) {
    check_vector(op, "past", past, DType::i32, 1);
    *past.as<std::int32_t>() += advance;
  }
  const Real* z_all = logits.as<Real>();
  auto* id = ids.as<std::int32_t>();
  Real* log_prob = log_probs.as<Real>();
  parallel_for(threads, rows, [&](std::int64_t n) {
    const Real* z = z_all + n * padded;
    int best = 0;
    for (int j = 0; j < vocab_size; ++j) {
      if (!std::isfinite(z[j])) {
        id[n] = 0;
        log_prob[n] = std::numeric_limits<Real>::quiet_NaN();
        return;
      }
      if (z[j] > z[best]) best = j;
    }
    double sum = 0;  // a vocabulary of terms: summed in double, as the reference it is
    for (int j = 0; j < vocab_size; ++j) sum += double(std::exp(z[j] - z[best]));
    id[n] = best;
    log_prob[n] = Real(-std::log(sum));
  });
}

template void greedy_tokens<float>(int, Tensor, Tensor, Tensor, int, Tensor, int);
template void greedy_tokens<double>(int, Tensor, Tensor, Tensor, int, Tensor, int);

}  // namespace pope::cpu
