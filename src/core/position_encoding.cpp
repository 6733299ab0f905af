// Defaults of the PositionEncoding interface: an encoding without a transform or a bias
// must never be asked for one, so these throw instead of silently doing nothing.
#include <stdexcept>

#include "pope/position.hpp"

namespace pope {

namespace {
[[noreturn]] void not_provided(const PositionEncoding& e, const char* hook) {
  throw std::logic_error("position encoding '" + e.kind() + "' has no " + hook);
}
}  // namespace

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
