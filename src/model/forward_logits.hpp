// The dtype of logits computed without a backward (evaluation, decoding): at least fp32. On a
// bf16 backend the classifier GEMM then stores its fp32-accumulated product unrounded and the
// log-softmax or the sampler reads that. Passes with a backward keep the activation dtype
// (dlogits are written in place and the backward GEMMs read them as a bf16 operand).
#pragma once

#include "pope/tensor.hpp"

namespace pope {

inline DType forward_only_logits_dtype(DType activation) {
  return dtype_size(activation) < dtype_size(DType::f32) ? DType::f32 : activation;
}

}  // namespace pope
