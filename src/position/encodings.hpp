// The concrete positional encodings (docs/encodings.md, sections 1-4). The
// factory (make_position_encoding) builds them from a ModelConfig; tests construct them
// directly with explicit options. Each implements the templated hooks that
// PositionEncodingImpl forwards its float/double virtuals to; the templates are defined and
// explicitly instantiated (float, double) in position_<kind>.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pope/config.hpp"
#include "pope/position.hpp"
#include "position/pj_bias_math.hpp"
#include "position/registry.hpp"

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

  bool extrapolates() const override { return config_.scaling.kind != RopeScalingKind::none; }
  bool transform_varies_with_length() const override { return config_.scaling.kind == RopeScalingKind::dynamic_ntk; }
  TransformPlan transform_plan(const PositionContext& ctx) const override;

  // θ'_m used for this call (depends on ctx for dynamic NTK).
  std::vector<double> frequencies(const PositionContext& ctx) const;

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;

 private:
  RopeConfig config_;
};

// PoPE. Each real channel c of a head becomes a complex feature μ_c·e^{iφ_c} with
// μ_c = f(x_c), ω_c = base^(−c/d), φ_c = p·ω_c for queries and p·ω_c + δ_{h,c} for keys.
// QK width 2d, laid out (the CUDA kernels follow it):
//   y[c]     = μ_c cos φ_c     (real parts, c = 0..d−1)
//   y[d + c] = μ_c sin φ_c     (imaginary parts)
// so <q̃_t, k̃_s> = Σ_c μ_q μ_k cos((s−t)ω_c + δ_c).
// Parameter "delta" [n_head, d] (no weight decay) unless learn_delta is false. With
// delta_bound clamp (the default) δ outside [−2π, 0] acts as the nearest bound and gets zero
// gradient; on the bounds it gets the full gradient (δ starts at exactly 0). With none δ acts
// as stored and always gets its gradient; project does the same and gives δ the bounds
// [−2π, 0] (ParamSpec::bounds), into which the optimizer clamps it after every update.
class PopeEncoding final : public PositionEncodingImpl<PopeEncoding> {
 public:
  explicit PopeEncoding(PopeConfig config);  // throws ConfigError on bad options

  std::string kind() const override { return "pope"; }
  bool transforms_qk() const override { return true; }
  int qk_width(int head_dim) const override { return 2 * head_dim; }
  // inv_sqrt_d: 1/√d, inv_sqrt_2d: 1/√(2d), d the untransformed head dim.
  double softmax_scale(const PositionContext& ctx) const override;
  std::vector<ParamSpec> layer_parameters(int n_head, int head_dim) const override;
  TransformPlan transform_plan(const PositionContext& ctx) const override;

  // ω_c, c = 0..head_dim−1.
  std::vector<double> frequencies(int head_dim) const;
  // How a real channel becomes a non-negative magnitude μ = f(x) (Table 5 ablations).
  MagnitudeKind magnitude() const { return config_.magnitude; }

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;

 private:
  std::size_t param_count() const { return config_.learn_delta ? 1 : 0; }

  PopeConfig config_;
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
  BiasPlan bias_plan(const PositionContext& ctx) const override;

  template <class Real>
  void bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const;
  template <class Real>
  void bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real* diag_grad,
                     ParamGrads<Real> dparams) const;

 private:
  AlibiConfig config_;
};

// PJ-bias (spec 5.1): b_h(Δ) = g_FJ·FJ_h(Δ) + g_A·A_h(Δ) + g_LC·LC_h(Δ), gates a softmax over
// the enabled sectors (disabled ones exactly 0). No q/k transform: it is composed with one
// (ComposedEncoding). Every layer has all kPjParamCount parameters whatever the sectors, so
// checkpoints, the diagnostics and the CUDA kernels see one layout; parameters of disabled
// sectors receive zero gradient and keep their init. The bias is evaluated in double and
// stored in the table's precision.
class PjBiasEncoding final : public PositionEncodingImpl<PjBiasEncoding> {
 public:
  // train_length is L_train (the bias's L and the ω / ALiBi-slope init); throws ConfigError
  // naming model.position.pj.* for bad options.
  PjBiasEncoding(const PjConfig& config, PjSectorMask sectors, int train_length);

  std::string kind() const override { return "pj_bias"; }
  bool has_score_bias() const override { return true; }
  std::vector<ParamSpec> layer_parameters(int n_head, int head_dim) const override;
  void initialize_custom(std::size_t param_index, std::span<double> values, int n_head, int head_dim) const override;
  BiasPlan bias_plan(const PositionContext& ctx) const override;

  int order() const { return config_.order; }
  PjRho rho() const { return rho_; }
  const PjSectorMask& sectors() const { return sectors_; }
  int train_length() const { return train_length_; }
  // The initial gate logits γ of gate_init (the same for every head).
  std::array<double, kPjSectorCount> initial_gate_logits() const;

  template <class Real>
  void bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const;
  template <class Real>
  void bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real* diag_grad,
                     ParamGrads<Real> dparams) const;

 private:
  PjConfig config_;
  PjSectorMask sectors_;
  PjRho rho_;
  int train_length_;
};

// PJ-rotary (spec 5.2): each head's d dims form M = d/(2(K+1)) blocks of K+1 complex
// channels z_r = (x_{2r}, x_{2r+1}); block m turns with ω_m = base^(−m/M) and shears with
// c_p = η·p/L_train. Queries get G(t) = e^{iωt}·exp(c_t N), keys G(s)^{−H} = e^{iωs}·exp(−c_s Nᵀ),
// so <q̃_t, k̃_s> depends on t − s only. K = 0 is RoPE with adjacent pairs. No parameters;
// computed in double per row and stored in the row's precision (norms grow like c_p^K/K!,
// at most a few units at the lengths we train and evaluate).
class PjRotaryEncoding final : public PositionEncodingImpl<PjRotaryEncoding> {
 public:
  explicit PjRotaryEncoding(const PjConfig& config);  // throws ConfigError naming model.position.pj.*

  std::string kind() const override { return "pj_rotary"; }
  bool transforms_qk() const override { return true; }
  TransformPlan transform_plan(const PositionContext& ctx) const override;

  int order() const { return config_.rotary_order; }
  // M for this head_dim; throws ConfigError naming model.position.pj.rotary_order unless
  // 2(K+1) divides head_dim.
  int blocks(int head_dim) const;
  // ω_m, m = 0..M−1.
  std::vector<double> frequencies(int head_dim) const;
  // η / L_train, so that the shear at position p is c_p = shear_rate · p; throws
  // std::invalid_argument (naming `op`) when the context has no train_length.
  double shear_rate(const PositionContext& ctx, std::string_view op) const;

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;

 private:
  PjConfig config_;
};

// A method of spec 5.3 made of two encodings: the q/k transform and softmax scale of
// `transform`, the score bias of `bias`. Parameters are the transform's then the bias's;
// their names must differ. The backends see one encoding; a backend that needs the parts
// (the diagnostics) reaches them through transform_part() / bias_part().
class ComposedEncoding final : public PositionEncodingImpl<ComposedEncoding> {
 public:
  ComposedEncoding(std::string name, std::unique_ptr<PositionEncoding> transform,
                   std::unique_ptr<PositionEncoding> bias);

  std::string kind() const override { return name_; }
  bool transforms_qk() const override { return transform_->transforms_qk(); }
  int qk_width(int head_dim) const override { return transform_->qk_width(head_dim); }
  bool has_score_bias() const override { return bias_->has_score_bias(); }
  double softmax_scale(const PositionContext& ctx) const override { return transform_->softmax_scale(ctx); }
  bool extrapolates() const override { return transform_->extrapolates() && bias_->extrapolates(); }
  bool transform_varies_with_length() const override { return transform_->transform_varies_with_length(); }
  std::vector<ParamSpec> layer_parameters(int n_head, int head_dim) const override;
  // The transform part's plan, and the bias part's with its parameter indices moved past the
  // transform's parameters.
  TransformPlan transform_plan(const PositionContext& ctx) const override { return transform_->transform_plan(ctx); }
  BiasPlan bias_plan(const PositionContext& ctx) const override;
  void initialize_custom(std::size_t param_index, std::span<double> values, int n_head, int head_dim) const override;

  const PositionEncoding& transform_part() const { return *transform_; }
  const PositionEncoding& bias_part() const { return *bias_; }
  // How many of layer_parameters() belong to the transform (they come first).
  std::size_t transform_parameter_count(int n_head, int head_dim) const;

  template <class Real>
  void transform(const QkTransformArgs<Real>& args) const;
  template <class Real>
  void transform_backward(const QkTransformBackwardArgs<Real>& args) const;
  template <class Real>
  void bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const;
  template <class Real>
  void bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params, const Real* diag_grad,
                     ParamGrads<Real> dparams) const;

 private:
  std::string name_;
  std::unique_ptr<PositionEncoding> transform_;
  std::unique_ptr<PositionEncoding> bias_;
};

// The ALiBi paper's slopes for `n_head` heads: 2^(−8(h+1)/H) when H is a power of two;
// otherwise the n = 2^⌊log₂H⌋ slopes followed by every other slope of the 2n set, up to H.
std::vector<double> alibi_slopes(int n_head);

}  // namespace pope
