// Defaults of the PositionEncoding interface: an encoding without a transform or a bias
// must never be asked for one, so these throw instead of silently doing nothing.
#include <stdexcept>
#include <vector>

#include "pope/position.hpp"

namespace pope {

namespace {
[[noreturn]] void not_provided(const PositionEncoding& e, const char* hook) {
  throw std::logic_error("position encoding '" + e.kind() + "' has no " + hook);
}
// A plan the backend cannot derive: it would otherwise run the encoding as something else.
[[noreturn]] void no_plan(const PositionEncoding& e, const char* part) {
  throw std::runtime_error("position encoding '" + e.kind() + "' declares no device plan for its " + part +
                           " (PositionEncoding::" + (part[0] == 'q' ? "transform_plan" : "bias_plan") +
                           "), so the fused backends cannot run it; docs/adding-an-encoding.md says how");
}
}  // namespace

TransformPlan PositionEncoding::transform_plan(const PositionContext&) const {
  if (transforms_qk()) no_plan(*this, "q/k transform");
  return {};
}

BiasPlan PositionEncoding::bias_plan(const PositionContext& ctx) const {
  BiasPlan plan;
  if (!has_score_bias()) return plan;
  if (!layer_parameters(ctx.n_head, ctx.head_dim).empty()) no_plan(*this, "learned score bias");
  plan.kind = BiasKind::host_table;
  return plan;
}

void PositionEncoding::initialize_custom(std::size_t, std::span<double>, int, int) const {
  not_provided(*this, "custom parameter initialiser");
}
void PositionEncoding::transform_qk(const QkTransformArgs<float>&) const { not_provided(*this, "q/k transform"); }
void PositionEncoding::transform_qk(const QkTransformArgs<double>&) const { not_provided(*this, "q/k transform"); }
void PositionEncoding::transform_qk_backward(const QkTransformBackwardArgs<float>&) const {
  not_provided(*this, "q/k transform");
}
void PositionEncoding::transform_qk_backward(const QkTransformBackwardArgs<double>&) const {
  not_provided(*this, "q/k transform");
}
void PositionEncoding::score_bias(const PositionContext&, int, ParamValues<float>, float*) const {
  not_provided(*this, "score bias");
}
void PositionEncoding::score_bias(const PositionContext&, int, ParamValues<double>, double*) const {
  not_provided(*this, "score bias");
}
void PositionEncoding::score_bias_backward(const PositionContext&, int, ParamValues<float>, const float*,
                                           ParamGrads<float>) const {
  not_provided(*this, "score bias");
}
void PositionEncoding::score_bias_backward(const PositionContext&, int, ParamValues<double>, const double*,
                                           ParamGrads<double>) const {
  not_provided(*this, "score bias");
}

}  // namespace pope
