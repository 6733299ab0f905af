// T5's relative-position bias (Raffel et al. 2020, causal form): a learned scalar per head and
// bucket of the lag Δ = t − s ≥ 0, b_h(Δ) = w[h, bucket(Δ)]. The first B/2 buckets hold one
// lag each; the other B/2 split the lags from B/2 to max_distance logarithmically, and every
// lag past max_distance shares the last bucket:
//   bucket(Δ) = Δ                                                          for Δ < B/2
//             = min(B − 1, B/2 + ⌊ln(Δ/(B/2)) / ln(max_distance/(B/2)) · B/2⌋)  otherwise.
// The parameter "bias" [n_head, B] starts at zero (the model starts as NoPE) and is not
// weight-decayed. Its gradient is the sum of Ĝ_h(Δ) over each bucket's lags.
//
// On the GPU it is the plan's lag buckets: the table gathered from w on the device, the
// gradient summed per bucket from the fused attention's Ĝ.
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "position/checks.hpp"
#include "position/registry.hpp"

namespace pope {

namespace {

class T5BiasEncoding final : public PositionEncodingImpl<T5BiasEncoding> {
 public:
  explicit T5BiasEncoding(const T5BiasConfig& config) : config_(config) {}

  std::string kind() const override { return "t5_bias"; }
  bool has_score_bias() const override { return true; }
  std::vector<ParamSpec> layer_parameters(int n_head, int) const override {
    return {ParamSpec{"bias", {n_head, config_.buckets}, /*weight_decay=*/false, InitKind::zeros}};
  }

  BiasPlan bias_plan(const PositionContext& ctx) const override {
    BiasPlan plan;
    plan.kind = BiasKind::lag_buckets;
    plan.buckets.param = 0;
    plan.buckets.buckets = config_.buckets;
    plan.buckets.bucket_of_lag.resize(std::size_t(std::max(ctx.seq_len, 0)));
    for (int lag = 0; lag < ctx.seq_len; ++lag) plan.buckets.bucket_of_lag[std::size_t(lag)] = bucket(lag);
    return plan;
  }

  template <class Real>
  void bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const {
    const std::string where = "t5_bias score bias";
    check_context(where, ctx);
    check_head(where, ctx, head);
    check_params(where, params, 1);
    if (ctx.seq_len > 0) check_pointer(where, table, "table");
    const Real* w = params[0] + std::int64_t(head) * config_.buckets;
    for (int lag = 0; lag < ctx.seq_len; ++lag) table[lag] = w[bucket(lag)];
  }

  template <class Real>
  void bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real* diag_grad,
                     ParamGrads<Real> dparams) const {
    const std::string where = "t5_bias score bias backward";
    check_context(where, ctx);
    check_head(where, ctx, head);
    check_params(where, params, 1);
    check_params(where + " (gradients)", dparams, 1);
    Real* dw = dparams[0] + std::int64_t(head) * config_.buckets;
    for (int lag = 0; lag < ctx.seq_len; ++lag) dw[bucket(lag)] += diag_grad[lag];
  }

 private:
  int bucket(int lag) const {
    const int exact = config_.buckets / 2;
    if (lag < exact) return lag;
    const double spread = std::log(double(lag) / exact) / std::log(double(config_.max_distance) / exact);
    return std::min(config_.buckets - 1, exact + static_cast<int>(spread * (config_.buckets - exact)));
  }

  T5BiasConfig config_;
};

std::unique_ptr<PositionEncoding> make_t5_bias(const ModelConfig& config) {
  const T5BiasConfig& t5 = config.position.t5_bias;
  if (t5.max_distance <= t5.buckets / 2)
    throw ConfigError("model.position.t5_bias.max_distance",
                      fmt::format("expected more than half of model.position.t5_bias.buckets ({} / 2 = {} lags have "
                                  "a bucket each), found {}",
                                  t5.buckets, t5.buckets / 2, t5.max_distance));
  return std::make_unique<T5BiasEncoding>(t5);
}

using config_schema::at_least;
using config_schema::between;

const PositionMethodRegistration kT5Bias(
    {"t5_bias", make_t5_bias, "learned bias per head over log-spaced lag buckets (T5, Raffel et al. 2020)"},
    {{POPE_CONFIG_KEY(model.position.t5_bias.buckets), between(2, 4096)},
     {POPE_CONFIG_KEY(model.position.t5_bias.max_distance), at_least(2)}});

}  // namespace

}  // namespace pope
