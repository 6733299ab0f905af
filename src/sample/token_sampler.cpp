// Temperature, top-k and nucleus (top-p) sampling over one step's logits.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "pope/sample.hpp"

namespace pope {

void check_sampling_options(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    throw std::invalid_argument(fmt::format("--temperature {}: expected a finite number ≥ 0 (0: greedy)", o.temperature));
  if (o.top_k < 0) throw std::invalid_argument(fmt::format("--top-k {}: expected ≥ 0 (0: every token)", o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    throw std::invalid_argument(fmt::format("--top-p {}: expected a probability in (0, 1]", o.top_p));
}

double token_log_probability(std::span<const float> logits, std::int32_t id) {
  if (id < 0 || std::size_t(id) >= logits.size())
    throw std::invalid_argument(fmt::format("token {} outside the {} logits", id, logits.size()));
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;  // float terms (a vectorised loop per step), summed in double
  for (float x : logits) sum += double(std::exp(x - max_logit));
  return double(logits[std::size_t(id)]) - double(max_logit) - std::log(sum);
}

TokenSampler::TokenSampler(const SamplingOptions& options, std::uint64_t seed) : options_(options), rng_(seed) {
  check_sampling_options(options_);
}

std::int32_t TokenSampler::next(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("TokenSampler: no logits");
  for (float x : logits)
    if (!std::isfinite(x)) throw std::runtime_error("TokenSampler: the model produced a non-finite logit");
  if (options_.temperature == 0.0)
    return std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first of ties

  const float top = *std::max_element(logits.begin(), logits.end());
  const double inverse_temperature = 1.0 / options_.temperature;
  const bool truncated = options_.top_k > 0 || options_.top_p < 1.0;
  if (!truncated) {  // every token, in id order: no sorting
    weights_.resize(logits.size());
    double total = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i)
      total += (weights_[i] = std::exp((double(logits[i]) - top) * inverse_temperature));
    const double u = rng_.uniform() * total;
    double cumulative = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      cumulative += weights_[i];
      if (u < cumulative) return std::int32_t(i);
    }
    return std::int32_t(logits.size() - 1);  // u within rounding of the total
  }
  order_.clear();
  for (std::size_t i = 0; i < logits.size(); ++i) order_.emplace_back(logits[i], std::int32_t(i));
  // Most likely first, ties by id: the same order everywhere.
  auto likelier = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  std::size_t keep = order_.size();
  if (options_.top_k > 0 && std::size_t(options_.top_k) < keep) {
    keep = std::size_t(options_.top_k);
    std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(keep - 1), order_.end(), likelier);
    std::sort(order_.begin(), order_.begin() + std::ptrdiff_t(keep), likelier);
  } else {
    std::sort(order_.begin(), order_.end(), likelier);
  }
  weights_.assign(keep, 0.0);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    total += (weights_[i] = std::exp((double(order_[i].first) - top) * inverse_temperature));
  if (options_.top_p < 1.0) {
    double mass = 0.0;
    std::size_t nucleus = 0;
    while (nucleus < keep && mass < options_.top_p * total) mass += weights_[nucleus++];
    keep = std::max<std::size_t>(nucleus, 1);
    total = 0.0;
    for (std::size_t i = 0; i < keep; ++i) total += weights_[i];
  }
  const double u = rng_.uniform() * total;
  double cumulative = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cumulative += weights_[i];
    if (u < cumulative) return order_[i].second;
  }
  return order_[keep - 1].second;  // u within rounding of the total
}

}  // namespace pope
