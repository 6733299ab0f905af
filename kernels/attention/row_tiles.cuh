// Building blocks of the simple causal attention kernels (causal_attention_*.cu). A block of
// kRowsPerBlock warps owns kRowsPerBlock rows of one (batch, head), one row per warp, kept
// in shared memory; the other side of the score matrix streams through shared memory in
// chunks of kChunkRows rows, one row per lane. Each lane computes full dot products of the
// warp's row with its chunk row, so no cross-lane reduction is needed per score; sums over
// the chunk (Σ_j coef_j · chunk_j) then broadcast coef_j by shuffle, each lane owning the
// channels lane, lane + 32, … of the result. Memory is O(rows · width); no T×T matrix.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_reduce.cuh"  // kWarpSize

namespace pope::kernels::row_tiles {

constexpr int kChunkRows = kWarpSize;
constexpr int kRowsPerBlock = 16;
constexpr int kThreads = kRowsPerBlock * kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;

// Chunk tiles are stored with row stride width + 1 (odd for the even widths we use, and any
// odd stride works): lane j reading word c of row j then hits bank (j·stride + c) mod 32,
// distinct across lanes.
__host__ __device__ constexpr int tile_stride(int width) { return width + 1; }
__host__ __device__ constexpr int tile_floats(int width) { return kChunkRows * tile_stride(width); }

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store_as(float* dst, float x) { *dst = x; }
__device__ inline void store_as(__nv_bfloat16* dst, float x) { *dst = __float2bfloat16(x); }

__device__ inline int lane_id() { return int(threadIdx.x % kWarpSize); }
__device__ inline int warp_id() { return int(threadIdx.x / kWarpSize); }

// All threads of the block: rows [first, first + kChunkRows) of a matrix whose row r starts at
// src + r·src_stride, `width` columns, into `tile`. Rows at or past `count` become zeros.
template <class T>
__device__ void load_chunk(float* tile, const T* src, std::int64_t src_stride, int first, int count, int width) {
  for (int i = int(threadIdx.x); i < kChunkRows * width; i += int(blockDim.x)) {
    const int r = i / width, c = i % width, row = first + r;
    tile[r * tile_stride(width) + c] = row < count ? to_float(src[std::int64_t(row) * src_stride + c]) : 0.0f;
  }
}

// One warp: `width` values of one row into shared `dst` (contiguous); follow with __syncwarp.
template <class T>
__device__ void load_row(float* dst, const T* src, int width) {
  for (int c = lane_id(); c < width; c += kWarpSize) dst[c] = to_float(src[c]);
}

// Σ_c row[c] · tile row `lane`[c]: every lane reads the same word of `row` (a broadcast).
__device__ inline float dot_with_lane_row(const float* row, const float* tile, int width) {
  const float* mine = tile + lane_id() * tile_stride(width);
  float sum = 0.0f;
  for (int c = 0; c < width; ++c) sum = fmaf(row[c], mine[c], sum);
  return sum;
}

__device__ inline float warp_max(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

__device__ inline float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Channels lane + 32·i (i < kPerLane) of one row of width ≤ 32·kPerLane, in registers
// (kPerLane is a compile-time constant so the array stays in registers).
template <int kPerLane>
struct LaneRow {
  float value[kPerLane];

  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) value[i] = 0.0f;
  }
  __device__ void scale(float factor) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) value[i] *= factor;
  }
  // value += Σ_j coef(lane j) · tile row j; coef is this lane's own coefficient.
  __device__ void add_weighted_rows(float coef, const float* tile, int width) {
    const int lane = lane_id();
    for (int j = 0; j < kChunkRows; ++j) {
      const float weight = __shfl_sync(kFullMask, coef, j);
      if (weight == 0.0f) continue;  // masked or negligible rows; warp-uniform branch
      const float* row = tile + j * tile_stride(width);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane + kWarpSize * i;
        if (c < width) value[i] = fmaf(weight, row[c], value[i]);
      }
    }
  }
  // dst[c] = value · factor for the lane's channels c < width.
  template <class T>
  __device__ void store(T* dst, int width, float factor) const {
    const int lane = lane_id();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + kWarpSize * i;
      if (c < width) store_as(dst + c, value[i] * factor);
    }
  }
};

// Widths up to 32·kMaxPerLane are supported; the launchers pick the smallest instantiation.
constexpr int kMaxPerLane = 16;
__host__ __device__ constexpr int lanes_needed(int width) { return (width + kWarpSize - 1) / kWarpSize; }

}  // namespace pope::kernels::row_tiles
