// Fused softmax cross-entropy over bf16 or fp32 logits rows [rows, padded_width], of which the
// first vocab_size columns are real (the rest is padding and takes no part):
//   loss[n] = log Σ_j exp(z_j − m) + m − z_target,   m = max_j z_j   (fp32)
// With compute_grad the row is overwritten in place by (softmax(z) − onehot) · grad_scale in
// the logits' dtype, padded columns 0; fp32 probabilities are never stored. A negative target masks the
// row (loss 0, zero gradient). A target ≥ vocab_size is recorded in `error`, loss NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_error.cuh"

namespace pope::kernels {

cudaError_t cross_entropy(float* losses, __nv_bfloat16* logits, const int* targets, int rows, int padded_width,
                          int vocab_size, bool compute_grad, float grad_scale, DeviceErrorRecord* error,
                          cudaStream_t stream);
cudaError_t cross_entropy(float* losses, float* logits, const int* targets, int rows, int padded_width, int vocab_size,
                          bool compute_grad, float grad_scale, DeviceErrorRecord* error, cudaStream_t stream);

}  // namespace pope::kernels
