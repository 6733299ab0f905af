// ComposedEncoding: one encoding's q/k transform and another's score bias (spec section 6:
// "combinations are (a) from one and (b) from another"). Each hook forwards to its part
// with that part's slice of the layer's parameters.
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "position/encodings.hpp"

namespace pope {

ComposedEncoding::ComposedEncoding(std::string name, std::unique_ptr<PositionEncoding> transform,
                                   std::unique_ptr<PositionEncoding> bias)
    : name_(std::move(name)), transform_(std::move(transform)), bias_(std::move(bias)) {
  if (!transform_ || !bias_) throw std::invalid_argument("ComposedEncoding '" + name_ + "': a part is null");
  if (!bias_->has_score_bias())
    throw std::invalid_argument("ComposedEncoding '" + name_ + "': the bias part '" + bias_->kind() + "' has no bias");
  if (bias_->transforms_qk())
    throw std::invalid_argument("ComposedEncoding '" + name_ + "': the bias part '" + bias_->kind() +
                                "' also transforms q/k");
}

std::vector<ParamSpec> ComposedEncoding::layer_parameters(int n_head, int head_dim) const {
  std::vector<ParamSpec> specs = transform_->layer_parameters(n_head, head_dim);
  for (ParamSpec& spec : bias_->layer_parameters(n_head, head_dim)) {
    const bool taken = std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == spec.name; });
    if (taken)
      throw std::logic_error("ComposedEncoding '" + name_ + "': both parts have a parameter '" + spec.name + "'");
    specs.push_back(std::move(spec));
  }
  return specs;
}

BiasPlan ComposedEncoding::bias_plan(const PositionContext& ctx) const {
  BiasPlan plan = bias_->bias_plan(ctx);
  const int shift = static_cast<int>(transform_parameter_count(ctx.n_head, ctx.head_dim));
  plan.pj.first_param += shift;
  plan.buckets.param += shift;
  return plan;
}

std::size_t ComposedEncoding::transform_parameter_count(int n_head, int head_dim) const {
  return transform_->layer_parameters(n_head, head_dim).size();
}

void ComposedEncoding::initialize_custom(std::size_t param_index, std::span<double> values, int n_head,
                                         int head_dim) const {
  const std::size_t split = transform_parameter_count(n_head, head_dim);
  if (param_index < split) transform_->initialize_custom(param_index, values, n_head, head_dim);
  else bias_->initialize_custom(param_index - split, values, n_head, head_dim);
}

template <class Real>
void ComposedEncoding::transform(const QkTransformArgs<Real>& args) const {
  QkTransformArgs<Real> part = args;
  if (args.ctx) part.params = args.params.first(std::min(args.params.size(), transform_parameter_count(args.ctx->n_head, args.ctx->head_dim)));
  transform_->transform_qk(part);
}

template <class Real>
void ComposedEncoding::transform_backward(const QkTransformBackwardArgs<Real>& args) const {
  QkTransformBackwardArgs<Real> part = args;
  if (args.ctx) {
    const std::size_t split = transform_parameter_count(args.ctx->n_head, args.ctx->head_dim);
    part.params = args.params.first(std::min(args.params.size(), split));
    part.dparams = args.dparams.first(std::min(args.dparams.size(), split));
  }
  transform_->transform_qk_backward(part);
}

template <class Real>
void ComposedEncoding::bias(const PositionContext& ctx, int head, ParamValues<Real> params, Real* table) const {
  const std::size_t split = std::min(params.size(), transform_parameter_count(ctx.n_head, ctx.head_dim));
  bias_->score_bias(ctx, head, params.subspan(split), table);
}

template <class Real>
void ComposedEncoding::bias_backward(const PositionContext& ctx, int head, ParamValues<Real> params,
                                     const Real* diag_grad, ParamGrads<Real> dparams) const {
  const std::size_t split = transform_parameter_count(ctx.n_head, ctx.head_dim);
  bias_->score_bias_backward(ctx, head, params.subspan(std::min(params.size(), split)), diag_grad,
                             dparams.subspan(std::min(dparams.size(), split)));
}

template void ComposedEncoding::transform<float>(const QkTransformArgs<float>&) const;
template void ComposedEncoding::transform<double>(const QkTransformArgs<double>&) const;
template void ComposedEncoding::transform_backward<float>(const QkTransformBackwardArgs<float>&) const;
template void ComposedEncoding::transform_backward<double>(const QkTransformBackwardArgs<double>&) const;
template void ComposedEncoding::bias<float>(const PositionContext&, int, ParamValues<float>, float*) const;
template void ComposedEncoding::bias<double>(const PositionContext&, int, ParamValues<double>, double*) const;
template void ComposedEncoding::bias_backward<float>(const PositionContext&, int, ParamValues<float>, const float*,
                                                     ParamGrads<float>) const;
template void ComposedEncoding::bias_backward<double>(const PositionContext&, int, ParamValues<double>,
                                                      const double*, ParamGrads<double>) const;

}  // namespace pope
