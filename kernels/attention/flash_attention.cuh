// Fused causal attention on tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulation;
// sm_80 and later): flash attention over rows that the encoding has already transformed (q̃, k̃
// bf16 [B, H, T, qk_width], see qk_transform.cuh), with the encoding's Toeplitz score bias
// b_h(t − s) read per tile. Online softmax in f32 (exp2 with the scale folded in), causal with
// fully masked tiles skipped, no T×T tensor anywhere; the backward recomputes P from the saved
// lse and is deterministic by default (no atomics: every output element is summed by one thread
// in a fixed order); with AttentionGradients::deterministic = false the key kernel adds dq̃
// atomically instead of a second pass over the tiles.
//
// Shapes: qk_width W ∈ {64, 128} and head_dim d ∈ {64, 128} with d ≤ W (RoPE/NoPE/ALiBi at
// d = 64 or 128, PoPE at d = 64); any B·H, any T (not only tile multiples). Other shapes use the
// simple kernels of causal_attention.cuh; flash_attention_supports says which path applies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "attention/attention_params.cuh"
#include "attention/causal_attention.cuh"

namespace pope::kernels {

// The (q/k width W, head dim d) pairs the fused kernels are built for: this list instantiates
// them (flash_attention.cu's with_widths), decides flash_attention_supports and drives the tests.
struct FlashWidths {
  int qk_width;
  int head_dim;
};
inline constexpr FlashWidths kFlashWidths[] = {{64, 64}, {128, 64}, {128, 128}};

// True when the fused kernels handle these sizes, the softmax scale is positive (it always is for
// the encodings here) and the tensors are 16-byte aligned.
bool flash_attention_supports(const AttentionDims& dims, const EncodedAttention& in);

// As causal_attention_forward: out bf16 [B·T, C] at head h, lse f32 [B, H, T].
cudaError_t flash_attention_forward(const AttentionDims& dims, const EncodedAttention& in, __nv_bfloat16* out,
                                    float* lse, cudaStream_t stream);

// True when flash_attention_backward can write dq̃ and dk̃ rounded to bf16
// (AttentionGradients::dq_bf16, dk_bf16): in the deterministic mode, for q̃ wider than a head
// (PoPE's 2d-wide features).
bool flash_attention_rounds_encoded_gradients(const AttentionDims& dims, bool deterministic);

// f32 scratch the bias gradient needs (grads.bias_grad_partials): one row of T lags per
// (b·H + h, 64-key block), or of `lags` (AttentionGradients::bias_grad_lags) when that is set.
std::size_t flash_bias_grad_partial_floats(const AttentionDims& dims, int lags = 0);

// True when flash_attention_backward can apply `transform`'s backward in its kernels'
// epilogues (AttentionGradients::qk_backward_fused): the fused kernels handle the sizes, the
// backward is deterministic, q̃ is as wide as a head (W = d), and the transform is the identity
// or RoPE rotating every channel with its phase table (QkTransformParams::phases).
bool flash_attention_fuses_qk_backward(const AttentionDims& dims, const EncodedAttention& in,
                                       const QkTransformParams& transform, bool deterministic);

// As causal_attention_backward (row_dot, dq̃, dk̃ f32, dv into dqkv), and when grads.bias_grad is
// set (in.score.bias must be too): Ĝ_h(Δ) += Σ_b Σ_{t−s=Δ} dS_ts into grads.bias_grad [H, T],
// using grads.bias_grad_partials as scratch.
cudaError_t flash_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                     const AttentionGradients& grads, cudaStream_t stream);

}  // namespace pope::kernels
