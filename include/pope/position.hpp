// Positional encodings behind one interface (spec: docs/encodings.md, section 8).
// Per layer an encoding is
//   (a) an optional transform of each head's q and k rows (may change the QK width:
//       PoPE makes them 2d wide), applied separately to queries and keys,
//   (b) an optional Toeplitz score bias b_h(Δ), Δ = t − s ≥ 0, added after scaling,
//   (c) a softmax scale,
// plus its parameters (per layer, leading dimension n_head, never weight-decayed),
// their initialisation and the backward of (a) and (b).
//
// The CPU hooks are the reference the CUDA kernels are tested against. They come in float
// and double (double for finite-difference gradient checks); encodings implement them once
// as templates through PositionEncodingImpl below.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pope/config.hpp"
#include "pope/position_plan.hpp"
#include "pope/tensor.hpp"

namespace pope {

class Rng;

// What every hook may depend on for one attention call.
struct PositionContext {
  int seq_len = 0;          // T of this call
  int train_length = 0;     // model.context_length (L_train)
  int n_head = 0;
  int head_dim = 0;         // d of the untransformed q, k, v
  int position_offset = 0;  // absolute position of row 0 (0 when training)
};

// This layer's position parameters: one pointer per entry of layer_parameters(), in order.
template <class Real> using ParamValues = std::span<const Real* const>;
template <class Real> using ParamGrads = std::span<Real* const>;

// Transform of one head's rows: x is [T, head_dim] with row stride x_stride (the q or k
// columns of the fused qkv activation), y is [T, qk_width] contiguous.
template <class Real> struct QkTransformArgs {
  const PositionContext* ctx = nullptr;
  int head = 0;
  bool is_key = false;
  const Real* x = nullptr;
  std::int64_t x_stride = 0;
  Real* y = nullptr;
  ParamValues<Real> params;
};

// Backward of the transform: given dy = dL/dy [T, qk_width], ACCUMULATES dx += dL/dx (row
// stride dx_stride) and the parameter gradients dparams += … (this head's rows only).
template <class Real> struct QkTransformBackwardArgs {
  const PositionContext* ctx = nullptr;
  int head = 0;
  bool is_key = false;
  const Real* x = nullptr;
  std::int64_t x_stride = 0;
  const Real* dy = nullptr;
  Real* dx = nullptr;
  std::int64_t dx_stride = 0;
  ParamValues<Real> params;
  ParamGrads<Real> dparams;
};

class PositionEncoding {
 public:
  virtual ~PositionEncoding() = default;

  virtual std::string kind() const = 0;
  virtual bool transforms_qk() const { return false; }
  virtual int qk_width(int head_dim) const { return head_dim; }
  virtual bool has_score_bias() const { return false; }
  virtual double softmax_scale(const PositionContext& ctx) const { return 1.0 / std::sqrt(double(ctx.head_dim)); }
  // False when the encoding is only defined up to the training length (RoPE without a
  // scaling): training windows and evaluation past it are refused.
  virtual bool extrapolates() const { return true; }
  // True when the q/k transform of a position depends on how many positions the call covers
  // (RoPE's dynamic NTK scaling): a key cache must then encode its keys again as it grows.
  virtual bool transform_varies_with_length() const { return false; }

  // The backend-neutral description of this call's transform and bias (pope/position_plan.hpp),
  // from which the CUDA backend runs the encoding. Defaults: identity without transforms_qk();
  // a host-tabulated bias for a parameter-free score_bias. An encoding with a transform or a
  // learned bias declares its own; the defaults throw for it, naming the encoding.
  virtual TransformPlan transform_plan(const PositionContext& ctx) const;
  virtual BiasPlan bias_plan(const PositionContext& ctx) const;
  EncodingPlan plan(const PositionContext& ctx) const { return {transform_plan(ctx), bias_plan(ctx)}; }

  // Parameters of one layer; names are relative ("delta"), the model prefixes
  // "layers.<i>.position.". Every shape starts with n_head and head h only touches row h,
  // which lets backends parallelise over heads without atomics.
  virtual std::vector<ParamSpec> layer_parameters(int /*n_head*/, int /*head_dim*/) const { return {}; }
  // Values for parameters whose spec says InitKind::custom (row-major, n_head leading).
  virtual void initialize_custom(std::size_t param_index, std::span<double> values, int n_head, int head_dim) const;

  // (a) q/k transform, float and double.
  virtual void transform_qk(const QkTransformArgs<float>& args) const;
  virtual void transform_qk(const QkTransformArgs<double>& args) const;
  virtual void transform_qk_backward(const QkTransformBackwardArgs<float>& args) const;
  virtual void transform_qk_backward(const QkTransformBackwardArgs<double>& args) const;

  // (b) bias table b_h(Δ) for Δ = 0..T−1 of head `head` into table[T].
  virtual void score_bias(const PositionContext& ctx, int head, ParamValues<float> params, float* table) const;
  virtual void score_bias(const PositionContext& ctx, int head, ParamValues<double> params, double* table) const;
  // Given diag_grad[Δ] = Σ_batch Σ_{t−s=Δ} dL/dscore(t,s), ACCUMULATES this head's dparams.
  virtual void score_bias_backward(const PositionContext& ctx, int head, ParamValues<float> params,
                                   const float* diag_grad, ParamGrads<float> dparams) const;
  virtual void score_bias_backward(const PositionContext& ctx, int head, ParamValues<double> params,
                                   const double* diag_grad, ParamGrads<double> dparams) const;
};

// Implements the float/double virtual pairs by forwarding to whichever of these templates
// Derived defines (a missing one keeps the base's throwing default):
//   template <class Real> void transform(const QkTransformArgs<Real>&) const;
//   template <class Real> void transform_backward(const QkTransformBackwardArgs<Real>&) const;
//   template <class Real> void bias(const PositionContext&, int head, ParamValues<Real>, Real* table) const;
//   template <class Real> void bias_backward(const PositionContext&, int head, ParamValues<Real>,
//                                            const Real* diag_grad, ParamGrads<Real>) const;
template <class Derived> class PositionEncodingImpl : public PositionEncoding {
 public:
  void transform_qk(const QkTransformArgs<float>& a) const override { forward_transform(a); }
  void transform_qk(const QkTransformArgs<double>& a) const override { forward_transform(a); }
  void transform_qk_backward(const QkTransformBackwardArgs<float>& a) const override { backward_transform(a); }
  void transform_qk_backward(const QkTransformBackwardArgs<double>& a) const override { backward_transform(a); }
  void score_bias(const PositionContext& c, int h, ParamValues<float> p, float* t) const override { forward_bias(c, h, p, t); }
  void score_bias(const PositionContext& c, int h, ParamValues<double> p, double* t) const override { forward_bias(c, h, p, t); }
  void score_bias_backward(const PositionContext& c, int h, ParamValues<float> p, const float* g,
                           ParamGrads<float> d) const override {
    backward_bias(c, h, p, g, d);
  }
  void score_bias_backward(const PositionContext& c, int h, ParamValues<double> p, const double* g,
                           ParamGrads<double> d) const override {
    backward_bias(c, h, p, g, d);
  }

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }

  template <class Real> void forward_transform(const QkTransformArgs<Real>& a) const {
    if constexpr (requires { self().template transform<Real>(a); }) self().template transform<Real>(a);
    else PositionEncoding::transform_qk(a);
  }
  template <class Real> void backward_transform(const QkTransformBackwardArgs<Real>& a) const {
    if constexpr (requires { self().template transform_backward<Real>(a); }) self().template transform_backward<Real>(a);
    else PositionEncoding::transform_qk_backward(a);
  }
  template <class Real> void forward_bias(const PositionContext& c, int h, ParamValues<Real> p, Real* t) const {
    if constexpr (requires { self().template bias<Real>(c, h, p, t); }) self().template bias<Real>(c, h, p, t);
    else PositionEncoding::score_bias(c, h, p, t);
  }
  template <class Real>
  void backward_bias(const PositionContext& c, int h, ParamValues<Real> p, const Real* g, ParamGrads<Real> d) const {
    if constexpr (requires { self().template bias_backward<Real>(c, h, p, g, d); })
      self().template bias_backward<Real>(c, h, p, g, d);
    else PositionEncoding::score_bias_backward(c, h, p, g, d);
  }
};

// Every value of model.position.kind once (aliases such as none = nope left out), from the
// registry of encodings (position/registry.hpp): what the generic suites and the benches run.
std::vector<std::string> position_kinds();
// One line on what `kind` is (for listings), or "" for a name that is no kind.
std::string position_kind_summary(const std::string& kind);

// Builds the encoding named by config.position.kind; throws ConfigError naming
// "model.position.kind" for an unknown kind.
std::unique_ptr<PositionEncoding> make_position_encoding(const ModelConfig& config);

}  // namespace pope
