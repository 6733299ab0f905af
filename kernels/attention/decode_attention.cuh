// Incremental decoding's attention (Backend::attention_decode on the GPU): n new query rows per
// sequence at positions p0 … p0 + n − 1 against the key/value cache, in one kernel:
//   out_t = Σ_{s ≤ t} softmax_s(<q̃_t, k̃_s> · scale + b_h(t − s)) v_s
// Keys s < p0 come from the cache; the new rows' keys s ≥ p0 from this call's encoded keys
// (encode_qk) and the v columns of qkv, which the kernel also appends to the cache rows
// [p0, p0 + n). The keys are split into `splits` equal ranges, one block each
// (flash-decoding), so that a single query row still spreads over many SMs; the last block of
// a (row, head) to finish merges the ranges' partial softmax sums in a fixed order
// (deterministic). p0 is read from device memory, and the grid depends on the cache's capacity
// only, so that one recorded step (a CUDA graph) serves every position. f32 arithmetic, bf16
// in and out.
// Test: pope_gpu_tests --gtest_filter='*CudaDecode*' (against the CPU reference of every encoding).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "attention/attention_params.cuh"

namespace pope::kernels {

struct DecodeDims {
  int batch = 0, n_head = 0;
  int new_rows = 0;      // n per sequence
  int head_dim = 0;      // d of v and out
  int qk_width = 0;      // W of q̃, k̃
  int capacity = 0;      // rows per (sequence, head) of the cache
  int splits = 0;        // key ranges per (row, head): decode_splits
  const int* past = nullptr;  // device int p0, the cached rows before the call; p0 + n ≤ capacity
};

// Key ranges per (row, head) for a call of `rows` = B·n query rows: enough blocks to fill the GPU,
// at least kMinDecodeKeysPerSplit keys each at full capacity.
constexpr int kMinDecodeKeysPerSplit = 32;
int decode_splits(int rows, int n_head, int capacity);

// Scratch decode_attention needs: f32 partial sums, and one int counter per (row, head) that
// must hold zero before a call (each merge resets its own counter, so they stay zero).
std::size_t decode_attention_partial_floats(const DecodeDims& dims);
std::size_t decode_attention_counters(const DecodeDims& dims);

// out [B·n, C] from q̃ [B, H, n, W], the new rows' k̃ [B, H, n, W] and qkv [B·n, 3C] (C = H·d)
// and the cache: keys [B, H, capacity, W], values [B, H, capacity, d], rows [0, p0) read and
// rows [p0, p0 + n) written. score.bias is the [H, capacity] table b_h(Δ) (or null); with
// score.bias_slopes the bias is slope_h · Δ instead. W and d up to 256 and multiples of 2.
cudaError_t decode_attention(const DecodeDims& dims, const ScoreParams& score, const __nv_bfloat16* q_encoded,
                             const __nv_bfloat16* k_encoded, const __nv_bfloat16* qkv, __nv_bfloat16* keys,
                             __nv_bfloat16* values, float* partials, int* counters, __nv_bfloat16* out,
                             cudaStream_t stream);

}  // namespace pope::kernels
