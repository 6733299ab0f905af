// The tensors one layer's forward reads and writes (Model::layer_forward), for the N rows of a
// call: the full forward's per-layer activations, or a decode call's shared buffers.
#pragma once

#include "pope/model.hpp"

namespace pope {

struct Model::LayerTensors {
  Tensor residual;                 // [N, C] the layer's input
  Tensor norm1, rstd1, qkv, attn;  // [N, C], [N], [N, 3C], [N, C]
  Tensor residual_mid;             // [N, C] after the attention branch
  Tensor norm2, rstd2;             // [N, C], [N]
  Tensor fc_pre, fc_act;           // [N, 4C]
  Tensor residual_out;             // [N, C] the layer's output (may share `residual`'s storage)
  bool fp8 = false;                // the products through the model's Fp8Linears, when it has them (not decoding)
};

}  // namespace pope
