// The simple causal attention kernels (CUDA cores, f32 arithmetic, one row per warp) over rows
// that the encoding has already transformed (q̃, k̃ bf16; see qk_transform.cuh), forward and
// backward, flash-attention style: online softmax in f32, the backward recomputes P from lse,
// memory O(B·H·T·qk_width), never a T×T matrix. Deterministic: every output element is summed
// by one warp in a fixed order, no atomics. They serve every width up to kMaxAttentionWidth;
// the common widths take the tensor-core kernels of flash_attention.cuh instead (the runner
// dispatches). The diagonal sums of a learnable bias are computed by the fused path only.
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
  const __nv_bfloat16* q = nullptr;    // q̃ [B, H, T, qk_width]
  const __nv_bfloat16* k = nullptr;    // k̃ [B, H, T, qk_width]
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
  // Fused path where flash_attention_rounds_encoded_gradients allows, set both or neither: dq̃,
  // dk̃ written rounded to bf16 here instead of dq, dk. PoPE's 2d-wide gradients are the largest
  // tensors of its backward (written once, read back by the q/k transform's backward and the δ
  // pass); in bf16 they move half the bytes, as PyTorch's attention hands bf16 gradients on too.
  __nv_bfloat16* dq_bf16 = nullptr;
  __nv_bfloat16* dk_bf16 = nullptr;
  __nv_bfloat16* dqkv = nullptr;        // v column block written with dL/dv
  // Optional (fused path only): Ĝ_h(Δ) = Σ_b Σ_{t−s=Δ} dS_ts ACCUMULATED into f32 [H, T], the
  // gradient of the bias table b_h(Δ); scratch of flash_bias_grad_partial_floats(dims) floats.
  float* bias_grad = nullptr;
  float* bias_grad_partials = nullptr;
  // With bias_grad, > 0: Ĝ only for lags below this (entries past it are left alone), all that a
  // bias constant beyond it needs (LearnedBias::gradient_lags); the key kernel then stops
  // summing lags past it and the scratch shrinks to flash_bias_grad_partial_floats(dims, lags).
  int bias_grad_lags = 0;
  // Optional (fused path, with bias_grad; set both or neither): Ĝ's reduction from the partial
  // rows runs on bias_grad_stream once the key kernel is done (the call records keys_done on its
  // stream after that kernel, and bias_grad_stream waits for it), beside the query kernel. The
  // caller makes its stream wait for bias_grad_stream before reading Ĝ there.
  cudaStream_t bias_grad_stream = nullptr;
  cudaEvent_t keys_done = nullptr;
  // Fused path: true sums every output in a fixed order (bitwise repeatable); false lets the
  // key kernel add dq̃ with atomic adds instead of running the query kernel (one pass over the
  // tiles fewer; dq̃'s last bits may change between runs). The simple kernels ignore it.
  bool deterministic = true;
  // Fused deterministic path only (flash_attention_fuses_qk_backward): the q/k transform whose
  // backward the key and query kernels apply to dk̃ and dq̃ in their epilogues, writing dL/dk
  // and dL/dq straight into dqkv's k and q blocks (bf16) as encode_qk_backward would (the same
  // numbers); dq and dk are then not written (nor needed).
  bool qk_backward_fused = false;
  QkTransformParams qk_transform{};
};

// D_t = <dout_t, out_t> into grads.row_dot (the first step of either backward).
cudaError_t attention_row_dot(const AttentionDims& dims, const AttentionGradients& grads, cudaStream_t stream);

// With dS_ts = P_ts (<dout_t, v_s> − D_t): dq̃_t = scale Σ_s dS_ts k̃_s, dk̃_s = scale Σ_t dS_ts q̃_t,
// dv_s = Σ_t P_ts dout_t.
cudaError_t causal_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                      const AttentionGradients& grads, cudaStream_t stream);

}  // namespace pope::kernels
