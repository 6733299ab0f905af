// Where one (batch, head) of an attention call lives, for the simple and the fused kernels
// alike: its q̃, k̃ rows, its v columns inside qkv, its row of the bias table, and its rows
// in [B·T, C] activations (out, dout) and [B, H, T] statistics (lse, row sums).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/causal_attention.cuh"

namespace pope::kernels {

struct AttentionHead {
  int b, h, bh, seq_len;
  const __nv_bfloat16* q;  // q̃ row t at t·qk_width
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;   // v row s at s·row_stride
  std::int64_t row_stride;  // 3C
  std::int64_t channels;    // C
  const float* bias;        // b_h(Δ) [T], or null
  bool linear_bias;         // b_h(Δ) = slope_h · Δ (ScoreParams::bias_slopes)
  float scale;              // softmax scale of the dot products

  __device__ AttentionHead(const AttentionDims& dims, const EncodedAttention& in, int batch_head) {
    bh = batch_head;
    b = bh / dims.n_head;
    h = bh % dims.n_head;
    seq_len = dims.seq_len;
    const std::int64_t rows_before = std::int64_t(bh) * dims.seq_len;
    q = in.q + rows_before * dims.qk_width;
    k = in.k + rows_before * dims.qk_width;
    channels = std::int64_t(dims.n_head) * dims.head_dim;
    row_stride = 3 * channels;
    v = in.qkv + std::int64_t(b) * dims.seq_len * row_stride + 2 * channels + std::int64_t(h) * dims.head_dim;
    bias = in.score.bias ? in.score.bias + std::int64_t(h) * dims.seq_len : nullptr;
    linear_bias = bias != nullptr && in.score.bias_slopes != nullptr;
    scale = in.score.scale;
  }
  // Offset of row t of this head in a [B·T, C]-shaped activation (out, dout).
  __device__ std::int64_t activation_offset(int t, int head_dim) const {
    return (std::int64_t(b) * seq_len + t) * channels + std::int64_t(h) * head_dim;
  }
  // Index of row t of this head in [B, H, T] statistics.
  __device__ std::int64_t statistic_index(int t) const { return std::int64_t(bh) * seq_len + t; }
};

}  // namespace pope::kernels
