// xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE whose pairs also decay
// exponentially with the distance. Pair m of a head (half-split, as our RoPE: channels m and
// m + d/2) rotates by p·θ_m, θ_m = base^(−2m/d), and is scaled by ζ_m^((t−c)/γ) on queries and
// ζ_m^(−(s−c)/γ) on keys, ζ_m = (2m/d + a)/(1 + a) (a = 0.4), γ the scale base (512), so that
// a score's pair m carries ζ_m^((t−s)/γ) ≤ 1. The centre c = L_train/2 cancels in every score;
// it halves the exponents within the training length and is the same for every call, so that
// keys encoded in one call (a KV cache) meet queries of another. No parameters.
//
// On the GPU it is the plan's scaled rotation: RoPE's phase tables with the scales folded in,
// one table for queries and one for keys, formed in double and stored in f32.
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "position/checks.hpp"
#include "position/math.hpp"
#include "position/registry.hpp"

namespace pope {

namespace {

// Largest |exponent| of a scale: e^80 ≈ 5.5e34 stays below bf16's and f32's 3.4e38 with room
// for the row's norm.
constexpr double kMaxExponent = 80.0;

class XposEncoding final : public PositionEncodingImpl<XposEncoding> {
 public:
  explicit XposEncoding(const XposConfig& config) : config_(config) {}

  std::string kind() const override { return "xpos"; }
  bool transforms_qk() const override { return true; }

  TransformPlan transform_plan(const PositionContext& ctx) const override {
    TransformPlan plan;
    plan.kind = TransformKind::rotary;
    plan.frequencies = geometric_frequencies(config_.base, ctx.head_dim / 2, 2.0 / ctx.head_dim);
    plan.scale_rates = rates(ctx, "xpos plan");
    plan.scale_centre = centre(ctx);
    return plan;
  }

  template <class Real>
  void transform(const QkTransformArgs<Real>& a) const {
    check_transform_args("xpos transform", a, 0);
    const PositionContext& ctx = *a.ctx;
    const int half = ctx.head_dim / 2;
    const std::vector<double> theta = geometric_frequencies(config_.base, half, 2.0 / ctx.head_dim);
    const std::vector<double> rate = rates(ctx, "xpos transform");
    for (int row = 0; row < ctx.seq_len; ++row) {
      const Real* x = a.x + row * a.x_stride;
      Real* y = a.y + std::int64_t(row) * ctx.head_dim;
      const double p = absolute_position(ctx, row);
      for (int m = 0; m < half; ++m) {
        const double s = scale(rate[std::size_t(m)], p, ctx, a.is_key);
        rotate_pair(s * double(x[m]), s * double(x[m + half]), rotation_by(p * theta[std::size_t(m)]), y[m],
                    y[m + half]);
      }
    }
  }

  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& a) const {
    check_transform_backward_args("xpos transform backward", a, 0);
    const PositionContext& ctx = *a.ctx;
    const int half = ctx.head_dim / 2;
    const std::vector<double> theta = geometric_frequencies(config_.base, half, 2.0 / ctx.head_dim);
    const std::vector<double> rate = rates(ctx, "xpos transform backward");
    for (int row = 0; row < ctx.seq_len; ++row) {
      const Real* dy = a.dy + std::int64_t(row) * ctx.head_dim;
      Real* dx = a.dx + row * a.dx_stride;
      const double p = absolute_position(ctx, row);
      for (int m = 0; m < half; ++m) {
        const double s = scale(rate[std::size_t(m)], p, ctx, a.is_key);
        accumulate_unrotated(s * double(dy[m]), s * double(dy[m + half]), rotation_by(p * theta[std::size_t(m)]),
                             dx[m], dx[m + half]);
      }
    }
  }

 private:
  static double centre(const PositionContext& ctx) { return std::floor(ctx.train_length / 2.0); }

  static double scale(double rate, double p, const PositionContext& ctx, bool is_key) {
    const double exponent = rate * (p - centre(ctx));
    return std::exp(is_key ? -exponent : exponent);
  }

  // r_m = ln ζ_m / γ for the d/2 pairs; refuses calls whose scales would overflow.
  std::vector<double> rates(const PositionContext& ctx, const std::string& where) const {
    check_context(where, ctx);
    if (ctx.head_dim % 2 != 0)
      throw std::invalid_argument(fmt::format("{}: head_dim {} is odd; xpos rotates pairs", where, ctx.head_dim));
    const int half = ctx.head_dim / 2;
    std::vector<double> rate(static_cast<std::size_t>(half));
    for (int m = 0; m < half; ++m) {
      const double zeta = (2.0 * m / ctx.head_dim + kZetaOffset) / (1.0 + kZetaOffset);
      rate[std::size_t(m)] = std::log(zeta) / config_.scale_base;
    }
    const double farthest = std::max(std::abs(double(ctx.position_offset) - centre(ctx)),
                                     std::abs(double(ctx.position_offset) + ctx.seq_len - 1 - centre(ctx)));
    if (half > 0 && std::abs(rate[0]) * farthest > kMaxExponent)
      throw std::invalid_argument(fmt::format(
          "{}: positions up to {} lie {} from the centre L_train/2 = {}, where xpos's scale ζ^(Δ/γ) leaves the "
          "floating-point range (at most {:.0f} positions from it with model.position.xpos.scale_base {})",
          where, ctx.position_offset + ctx.seq_len - 1, farthest, centre(ctx), kMaxExponent / std::abs(rate[0]),
          config_.scale_base));
    return rate;
  }

  static constexpr double kZetaOffset = 0.4;  // the paper's ζ_m = (2m/d + 0.4) / 1.4
  XposConfig config_;
};

std::unique_ptr<PositionEncoding> make_xpos(const ModelConfig& config) {
  if (config.head_dim() % 2 != 0)
    throw ConfigError("model.n_embd", fmt::format("xpos rotates pairs: expected an even head dim, found {}",
                                                  config.head_dim()));
  return std::make_unique<XposEncoding>(config.position.xpos);
}

using config_schema::above;

const PositionMethodRegistration kXpos(
    {"xpos", make_xpos, "RoPE with a per-pair exponential decay of the scores (Sun et al. 2022)"},
    {{POPE_CONFIG_KEY(model.position.xpos.base), above(1)},
     {POPE_CONFIG_KEY(model.position.xpos.scale_base), above(0)}});

}  // namespace

}  // namespace pope
