#include "cuda/pj_bias_layer.hpp"

#include <stdexcept>
#include <string>

#include "core/position_encodings.hpp"

namespace pope::cuda {

static_assert(kernels::kPjBiasMaxOrder == kMaxPjOrder, "the CUDA PJ-bias order bound must match the CPU's");
static_assert(int(kernels::kPjSlotCount) == int(kPjParamCount) && int(kernels::kPjSlotOmega) == int(kPjOmega) &&
                  int(kernels::kPjSlotGateLogits) == int(kPjGateLogits) &&
                  int(kernels::kPjSlotFjOrderLogits) == int(kPjFjOrderLogits) &&
                  int(kernels::kPjSlotFjRe) == int(kPjFjRe) && int(kernels::kPjSlotFjIm) == int(kPjFjIm) &&
                  int(kernels::kPjSlotFjDamping) == int(kPjFjDamping) &&
                  int(kernels::kPjSlotAffineSlope) == int(kPjAffineSlope) &&
                  int(kernels::kPjSlotLcOrderLogits) == int(kPjLcOrderLogits) &&
                  int(kernels::kPjSlotLcRe) == int(kPjLcRe) && int(kernels::kPjSlotLcIm) == int(kPjLcIm),
              "the CUDA PJ-bias slots must follow PjParam");

namespace {

const PjBiasEncoding* pj_bias_part(const PositionEncoding& encoding) {
  const auto* composed = dynamic_cast<const ComposedEncoding*>(&encoding);
  return composed == nullptr ? nullptr : dynamic_cast<const PjBiasEncoding*>(&composed->bias_part());
}

}  // namespace

bool has_pj_bias(const PositionEncoding& encoding) { return pj_bias_part(encoding) != nullptr; }

std::optional<PjBiasLayer> pj_bias_layer(const PositionEncoding& encoding, const PositionContext& ctx,
                                         std::span<float* const> params, std::span<float* const> grads) {
  const PjBiasEncoding* bias = pj_bias_part(encoding);
  if (bias == nullptr) return std::nullopt;
  const auto& composed = static_cast<const ComposedEncoding&>(encoding);

  const std::size_t first = composed.transform_parameter_count(ctx.n_head, ctx.head_dim);
  const std::size_t expected = first + kPjParamCount;
  const auto check = [&](std::span<float* const> pointers, const char* what) {
    if (pointers.size() != expected)
      throw std::invalid_argument("pj_bias_layer: encoding '" + encoding.kind() + "' has " + std::to_string(expected) +
                                  " layer parameters, got " + std::to_string(pointers.size()) + " " + what);
  };
  check(params, "parameter pointers");
  if (!grads.empty()) check(grads, "gradient pointers");

  PjBiasLayer layer;
  layer.params.n_head = ctx.n_head;
  layer.params.order = bias->order();
  layer.params.train_length = bias->train_length();
  layer.params.lightcone_rho = bias->rho() == PjRho::lightcone;
  for (int k = 0; k < kPjSectorCount; ++k) layer.params.sector_enabled[k] = bias->sectors()[static_cast<std::size_t>(k)];
  for (std::size_t i = 0; i < kPjParamCount; ++i) {
    layer.params.values[i] = params[first + i];
    if (!grads.empty()) layer.gradients.values[i] = grads[first + i];
  }
  return layer;
}

}  // namespace pope::cuda
