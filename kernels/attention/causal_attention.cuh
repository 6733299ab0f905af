// Causal attention over rows that the encoding has already transformed (q̃, k̃ in f32; see
// qk_transform.cuh), forward and backward, flash-attention style: online softmax in f32,
// the backward recomputes P from lse, memory O(B·H·T·qk_width), never a T×T matrix.
// Deterministic: every output element is summed by one warp in a fixed order, no atomics.
//
// Not here yet: the diagonal sums Ĝ_h(Δ) = Σ_batch Σ_{t−s=Δ} dS_ts that a learnable score bias
// (PJ-bias) needs. They fit the key-gradient kernel, which holds dS for 16 keys × 32 queries
// per step: sum dS along lags into a per-(b·H + h, key block) partial row, then reduce the
// partial rows in a fixed order, as pope_delta_gradient does for δ.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention/attention_params.cuh"

namespace pope::kernels {

// Largest qk_width (and head_dim) and sequence length the kernels support.
constexpr int kMaxAttentionWidth = 512;
constexpr int kMaxAttentionSeqLen = 16 * 65535;  // grid y: one 16-row block per index

// What the score kernels read.
struct EncodedAttention {
  const float* q = nullptr;            // q̃ [B, H, T, qk_width]
  const float* k = nullptr;            // k̃ [B, H, T, qk_width]
  const __nv_bfloat16* qkv = nullptr;  // v from its column block
  ScoreParams score;
};

// out_t = Σ_{s≤t} softmax_s(a_ts) v_s (bf16 [B·T, C]);  lse_t = log Σ_{s≤t} exp(a_ts) (f32 [B, H, T]).
cudaError_t causal_attention_forward(const AttentionDims& dims, const EncodedAttention& in, __nv_bfloat16* out,
                                     float* lse, cudaStream_t stream);

struct AttentionGradients {
  const __nv_bfloat16* out = nullptr;  // as written by the forward
  const float* lse = nullptr;
  const __nv_bfloat16* dout = nullptr;  // [B·T, C]
  float* row_dot = nullptr;             // scratch [B, H, T]: D_t = <dout_t, out_t>
  float* dq = nullptr;                  // written: dL/dq̃ [B, H, T, qk_width]
  float* dk = nullptr;                  // written: dL/dk̃
  __nv_bfloat16* dqkv = nullptr;        // v column block written with dL/dv
};

// With dS_ts = P_ts (<dout_t, v_s> − D_t): dq̃_t = scale Σ_s dS_ts k̃_s, dk̃_s = scale Σ_t dS_ts q̃_t,
// dv_s = Σ_t P_ts dout_t.
cudaError_t causal_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                      const AttentionGradients& grads, cudaStream_t stream);

}  // namespace pope::kernels
