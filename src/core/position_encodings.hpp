// The concrete positional encodings (spec: positional-encodings.md, sections 1-4). The
// factory (make_position_encoding) builds them from a ModelConfig; tests construct them
// directly with explicit options. Each implements the templated hooks that
// PositionEncodingImpl forwards its float/double virtuals to; the templates are defined and
// explicitly instantiated (float, double) in position_<kind>.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pope/config.hpp"
#include "pope/position.hpp"

namespace pope {

// NoPE: no transform, no bias, scale 1/√d; the causal mask alone carries order.
class NopeEncoding final : public PositionEncodingImpl<NopeEncoding> {
 public:
  std::string kind() const override;
};

// RoPE with NeoX half-split pairing over the first r = fraction·d channels of each head:
// pair m is (x_m, x_{m+r/2}), rotated by p·θ'_m; channels r..d−1 pass through unchanged.
// QK width stays d. Scalings: see rope_frequencies.hpp.
class RopeEncoding final : public PositionEncodingImpl<RopeEncoding> {
 public:
  explicit RopeEncoding(RopeConfig config);  // throws ConfigError on bad options

  std::string kind() const override { return "rope"; }
  bool transforms_qk() const override { return true; }
  // 1/√d, times t² under YaRN (t = its q/k multiplier).
  double softmax_scale(const PositionContext& ctx) const override;

  // θ'_m used for this call (depends on ctx for dynamic NTK).
  std::vector<double> frequencies(const PositionContext& ctx) const;

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;

 private:
  RopeConfig config_;
};

// How PoPE turns a real channel into a non-negative magnitude μ = f(x) (Table 5 ablations).
enum class PopeMagnitude { softplus, identity, relu };

// PoPE. Each real channel c of a head becomes a complex feature μ_c·e^{iφ_c} with
// μ_c = f(x_c), ω_c = base^(−c/d), φ_c = p·ω_c for queries and p·ω_c + clamp(δ_{h,c}, −2π, 0)
// for keys. QK width 2d, laid out (the CUDA kernels follow it):
//   y[c]     = μ_c cos φ_c     (real parts, c = 0..d−1)
//   y[d + c] = μ_c sin φ_c     (imaginary parts)
// so <q̃_t, k̃_s> = Σ_c μ_q μ_k cos((s−t)ω_c + δ_c).
// Parameter "delta" [n_head, d] (no weight decay) unless learn_delta is false. δ outside
// [−2π, 0] acts as the nearest bound and gets zero gradient; on the bounds it gets the full
// gradient (δ starts at exactly 0).
class PopeEncoding final : public PositionEncodingImpl<PopeEncoding> {
 public:
  explicit PopeEncoding(PopeConfig config);  // throws ConfigError on bad options

  std::string kind() const override { return "pope"; }
  bool transforms_qk() const override { return true; }
  int qk_width(int head_dim) const override { return 2 * head_dim; }
  // inv_sqrt_d: 1/√d, inv_sqrt_2d: 1/√(2d), d the untransformed head dim.
  double softmax_scale(const PositionContext& ctx) const override;
  std::vector<ParamSpec> layer_parameters(int n_head, int head_dim) const override;

  // ω_c, c = 0..head_dim−1.
  std::vector<double> frequencies(int head_dim) const;
  PopeMagnitude magnitude() const { return magnitude_; }

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;

 private:
  std::size_t param_count() const { return config_.learn_delta ? 1 : 0; }

  PopeConfig config_;
  PopeMagnitude magnitude_;
};

// ALiBi: bias b_h(Δ) = −m_h·Δ with the paper's slopes (see alibi_slopes). With
// head_fraction < 1 the first n = round(fraction·H) heads get the slopes computed for n
// heads and the remaining heads get slope 0 (NoPE heads). No parameters.
class AlibiEncoding final : public PositionEncodingImpl<AlibiEncoding> {
 public:
  explicit AlibiEncoding(AlibiConfig config);  // throws ConfigError on bad options

  std::string kind() const override { return "alibi"; }
  bool has_score_bias() const override { return true; }

  // m_h for h = 0..n_head−1, head_fraction applied.
  std::vector<double> head_slopes(int n_head) const;

  template <class Real>
  void bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const;
  template <class Real>
  void bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real* diag_grad,
                     ParamGrads<Real> dparams) const;

 private:
  AlibiConfig config_;
};

// The ALiBi paper's slopes for `n_head` heads: 2^(−8(h+1)/H) when H is a power of two;
// otherwise the n = 2^⌊log₂H⌋ slopes followed by every other slope of the 2n set, up to H.
std::vector<double> alibi_slopes(int n_head);

}  // namespace pope
