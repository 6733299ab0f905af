// The encoding's q/k transform over a whole attention call, and its backward: q, k columns
// of qkv (bf16) → encoded rows q̃, k̃ (bf16 [B, H, T, qk_width], the math in f32 and rounded
// once at the end, where PyTorch rounds its rotated q/k too), and back from f32 gradients; the
// keys alone also between a key cache's rows (encode_keys).
// Test: pope_gpu_tests --gtest_filter='CudaQkTransform*' (the attention tests run it against the CPU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attention/attention_params.cuh"

namespace pope::kernels {

// q̃, k̃ of every (batch, head, position); one thread per (position, head, 8 input channels)
// (16-byte vectors) where head_dim, q/k width and RoPE's rotary pairs are multiples of 8, else
// per channel, each looping over the batch; PJ-rotary one thread per block of 2(K+1) channels.
// Returns cudaErrorInvalidValue for a PJ-rotary plan whose order is outside [0,
// kPjRotaryMaxOrder], whose block width does not divide head_dim, or without frequencies, and
// for calls with 2^32 or more (position, head, channel) sites.
cudaError_t encode_qk(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                      __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream);

// Where rows of one side lie, in elements from its first: row t of head h of sequence b starts at
// b·sequence + h·head + t·row.
struct RowLayout {
  std::int64_t sequence = 0, head = 0, row = 0;
};
// The q (or, from C = H·d elements further on, the k) columns of a call's qkv [B·T, 3C].
RowLayout qkv_rows(const AttentionDims& dims);
// The rows of a key/value cache [B, H, capacity, width] (pope/backend.hpp's KvCacheLayer).
RowLayout cache_rows(int n_head, int capacity, int width);

// The keys of encode_qk alone, between other layouts: rows [0, dims.seq_len) of x (x_rows) →
// k̃ (encoded_rows), with encode_qk's kernel and arithmetic, so that a key encoded here is bitwise
// the one encode_qk gives at its position. The decode of a transform that changes with the length
// (dynamic NTK) copies its new raw keys into the cache with it (identity) and encodes the cached
// ones again at each new length. 16-byte vectors where encode_qk takes them and every stride is a
// multiple of 8; the same refusals as encode_qk.
cudaError_t encode_keys(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* x,
                        const RowLayout& x_rows, __nv_bfloat16* k_encoded, const RowLayout& encoded_rows,
                        cudaStream_t stream);

// Backward of encode_qk: OVERWRITES the q and k column blocks of dqkv with dL/dq, dL/dk
// from the gradients of q̃ and k̃ (the v block is left alone). A null dq_encoded or dk_encoded
// leaves its block alone too (written elsewhere, e.g. PoPE's keys by pope_delta_gradient);
// PJ-rotary needs both, in f32. The gradients in f32 or, as the fused attention can leave them
// (AttentionGradients::dq_bf16), in bf16.
cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream);
cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const __nv_bfloat16* dq_encoded, const __nv_bfloat16* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream);

// Entries of a call's phase table (QkTransformParams::phases): seq_len × RoPE's rotary pairs;
// 0 for other transforms.
std::size_t phase_table_entries(const QkTransformParams& transform, int seq_len);
// Fills `table` (phase_table_entries of them) with the (cos, sin) of every row's angle for every
// frequency, bitwise as the encode kernels compute them: with transform.phases set to it,
// encode_qk and encode_qk_backward evaluate seq_len × pairs angles instead of H times as many,
// and the fused kernels' RoPE gradient epilogue reads it. Nothing to do for other transforms.
cudaError_t fill_phase_table(const QkTransformParams& transform, int seq_len, float2* table, cudaStream_t stream);

// f32 scratch pope_delta_gradient needs: one partial sum per (chunk of positions, head, channel).
std::size_t pope_delta_gradient_partial_floats(const AttentionDims& dims);

// PoPE: ACCUMULATES dL/dδ [n_head, head_dim] += Σ over batch and positions of the keys'
// phase gradients, for δ inside [−2π, 0] (zero gradient outside). Deterministic: one block
// per (chunk of positions, head) sums its positions over the batch into `partials`
// (pope_delta_gradient_partial_floats), then one thread per (head, channel) adds the chunks
// in chunk order. transform.delta must be set. With dqkv set, the same pass OVERWRITES its k
// block with dL/dk, as encode_qk_backward would (call that one for the queries only). dk̃ in
// f32 or bf16.
cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const float* dk_encoded, float* partials, float* delta_grad, __nv_bfloat16* dqkv,
                                cudaStream_t stream);
cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const __nv_bfloat16* dk_encoded, float* partials, float* delta_grad,
                                __nv_bfloat16* dqkv, cudaStream_t stream);

}  // namespace pope::kernels
