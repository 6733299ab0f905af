// ALiBi (docs/encodings.md, section 4): a fixed linear score bias per head.
#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

#include "position/checks.hpp"
#include "position/encodings.hpp"

namespace pope {

namespace {

// 2^(−8(h+1)/H), h = 0..H−1: the geometric sequence for a power-of-two head count.
std::vector<double> power_of_two_slopes(int n_head) {
  std::vector<double> slopes(static_cast<std::size_t>(n_head));
  for (int h = 0; h < n_head; ++h) slopes[static_cast<std::size_t>(h)] = std::exp2(-8.0 * (h + 1) / n_head);
  return slopes;
}

}  // namespace

std::vector<double> alibi_slopes(int n_head) {
  if (n_head <= 0) throw std::invalid_argument("alibi_slopes: n_head must be positive, got " + std::to_string(n_head));
  const int n = static_cast<int>(std::bit_floor(static_cast<unsigned>(n_head)));
  std::vector<double> slopes = power_of_two_slopes(n);
  if (n == n_head) return slopes;
  // Not a power of two: keep the n slopes and interleave from the 2n set (every other one,
  // i.e. those between the n slopes), as many as are missing.
  const std::vector<double> finer = power_of_two_slopes(2 * n);
  for (int i = 0; i < n_head - n; ++i) slopes.push_back(finer[static_cast<std::size_t>(2 * i)]);
  return slopes;
}

AlibiEncoding::AlibiEncoding(AlibiConfig config) : config_(config) {
  if (!(config_.head_fraction > 0.0 && config_.head_fraction <= 1.0))
    throw ConfigError("model.position.alibi.head_fraction",
                      "expected a share of heads in (0, 1], got " + std::to_string(config_.head_fraction));
}

std::vector<double> AlibiEncoding::head_slopes(int n_head) const {
  const int biased_heads = static_cast<int>(std::lround(config_.head_fraction * n_head));
  std::vector<double> slopes(static_cast<std::size_t>(n_head), 0.0);
  if (biased_heads == 0) return slopes;
  const std::vector<double> biased = alibi_slopes(biased_heads);
  std::copy(biased.begin(), biased.end(), slopes.begin());
  return slopes;
}

BiasPlan AlibiEncoding::bias_plan(const PositionContext& ctx) const {
  BiasPlan plan;
  plan.kind = BiasKind::linear;
  for (const double m : head_slopes(ctx.n_head)) plan.slopes.push_back(-m);
  return plan;
}

template <class Real>
void AlibiEncoding::bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const {
  const std::string where = "alibi score bias";
  check_context(where, ctx);
  check_head(where, ctx, head);
  check_params(where, params, 0);
  if (ctx.seq_len > 0) check_pointer(where, table, "table");
  const double slope = head_slopes(ctx.n_head)[static_cast<std::size_t>(head)];
  for (int lag = 0; lag < ctx.seq_len; ++lag) table[lag] = static_cast<Real>(-slope * lag);
}

// ALiBi has no parameters, so there is nothing to accumulate; the arguments are still
// checked so that a caller wiring the hook wrongly hears about it.
template <class Real>
void AlibiEncoding::bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real*,
                                  ParamGrads<Real> dparams) const {
  const std::string where = "alibi score bias backward";
  check_context(where, ctx);
  check_head(where, ctx, head);
  check_params(where, params, 0);
  check_params(where + " (gradients)", dparams, 0);
}

template void AlibiEncoding::bias<float>(const PositionContext&, int, ParamValues<float>, float*) const;
template void AlibiEncoding::bias<double>(const PositionContext&, int, ParamValues<double>, double*) const;
template void AlibiEncoding::bias_backward<float>(const PositionContext&, int, ParamValues<float>, const float*,
                                                  ParamGrads<float>) const;
template void AlibiEncoding::bias_backward<double>(const PositionContext&, int, ParamValues<double>, const double*,
                                                   ParamGrads<double>) const;

}  // namespace pope
