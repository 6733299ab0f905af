// The encoding's q/k transform over a whole attention call, and its backward: q, k columns
// of qkv (bf16) → encoded rows q̃, k̃ (bf16 [B, H, T, qk_width], the math in f32 and rounded
// once at the end, where PyTorch rounds its rotated q/k too), and back from f32 gradients.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention/attention_params.cuh"

namespace pope::kernels {

// q̃, k̃ of every (batch, head, position); one thread per input channel.
cudaError_t encode_qk(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                      __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream);

// Backward of encode_qk: OVERWRITES the q and k column blocks of dqkv with dL/dq, dL/dk
// from the gradients of q̃ and k̃ (the v block is left alone).
cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream);

// PoPE: ACCUMULATES dL/dδ [n_head, head_dim] += Σ over batch and positions of the keys'
// phase gradients, for δ inside [−2π, 0] (zero gradient outside). Deterministic: one block
// per (head, 32 channels) sums the rows in a fixed order. transform.delta must be set.
cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const float* dk_encoded, float* delta_grad, cudaStream_t stream);

}  // namespace pope::kernels
