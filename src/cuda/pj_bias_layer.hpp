// The bridge from a layer's PositionEncoding to the PJ-bias kernels (kernels/attention/
// pj_bias.cuh): finds the PJ-bias inside a composed method and fills the kernels' plain
// parameter blocks with the layer's device pointers, so AttentionRunner needs no knowledge
// of the PJ-bias's options or parameter order.
#pragma once

#include <optional>
#include <span>

#include "attention/pj_bias.cuh"
#include "pope/position.hpp"

namespace pope::cuda {

struct PjBiasLayer {
  kernels::PjBiasParams params;        // for pj_bias_table and pj_bias_backward
  kernels::PjBiasGradients gradients;  // all null when no gradients were given
};

// Whether `encoding` is a ComposedEncoding whose bias part is a PjBiasEncoding.
bool has_pj_bias(const PositionEncoding& encoding);

// nullopt unless has_pj_bias(encoding).
// `params` (and `grads`, if not empty) are the layer's device f32 pointers in
// layer_parameters() order: the transform part's first, then the PJ-bias's. Throws
// std::invalid_argument when their number does not match the encoding's.
std::optional<PjBiasLayer> pj_bias_layer(const PositionEncoding& encoding, const PositionContext& ctx,
                                         std::span<float* const> params, std::span<float* const> grads = {});

}  // namespace pope::cuda
