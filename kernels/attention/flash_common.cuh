// What the fused attention kernels (flash_forward.cuh, flash_key_grad.cuh, flash_query_grad.cuh)
// and both main loops (flash_mainloop_sm80.cuh, flash_mainloop_sm90.cuh) share: the 64-row tile
// geometry, a lane's place in the m16n8 accumulator layout, the branch-free per-score helpers
// (exp2, compile-time flags, the linear bias, quad reductions), the tensor maps of a call, and the
// backward kernels' gradient-row stores. Private to flash_attention.cu, the one translation unit
// that includes it: everything lives in that unit's anonymous namespace.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_head.cuh"
#include "attention/attention_params.cuh"
#include "attention/encoding_math.cuh"
#include "attention/mma_tiles.cuh"
#include "attention/tma.cuh"
#include "block_reduce.cuh"

namespace pope::kernels {

namespace {

using namespace mma_tiles;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // rows of every block and streamed tile (queries and keys)
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kScoreBlocks = kTile / 8;  // 8-column accumulator fragments across one tile
constexpr int kScoreSteps = kTile / 16;  // 16-column A fragments across one tile
// The lags t − s of one 64×64 tile relative to i0 − j0 span −63..63: slot (t − i0) − (s − j0) + 63.
constexpr int kLagSlots = 2 * kTile;
// Query rows per forward CTA (the main loops split them over their warps differently).
constexpr int kForwardRows = 128;
// Columns of dq̃ summed at once in the non-deterministic mode (bounds its accumulators, and with
// wgmma its shared staging tile).
constexpr int kDqChunk = 64;

// Lane coordinates inside the mma fragments, and the tile row/column of accumulator element e
// of 8-column block nb for a warp owning tile rows [16·warp, 16·warp + 16).
struct Lane {
  int warp, g, q;
  __device__ Lane() : warp(int(threadIdx.x) / kWarpSize), g(int(threadIdx.x) % kWarpSize / 4), q(int(threadIdx.x) % 4) {}
  __device__ int row(int e) const { return warp * 16 + g + (e / 2) * 8; }
  __device__ int column(int nb, int e) const { return nb * 8 + 2 * q + (e & 1); }
};

// 2^x on the special-function unit; results below 2^−126 flush to zero (2^−inf = 0).
__device__ inline float exp2_flush(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// body(std::true_type{}) or body(std::false_type{}) as `flag` is set: one branch, and a
// straight-line copy of body for each value (the body tests flag.value).
template <class Body>
__device__ __forceinline__ void with_flag(bool flag, Body&& body) {
  if (flag)
    body(std::true_type{});
  else
    body(std::false_type{});
}

// A linear bias b(Δ) = slope · Δ of one tile, in the units the kernel adds it in (`unit`: 1/scale
// or log2 e): add(x, k) adds it for the lag lag_base + k, k a compile-time offset within the
// thread's fragments, with one exact integer FADD and one FFMA (no table read). Built inside the
// linear copy of the per-score code only (the slope is read per tile there), so the other copies
// keep no registers for it.
struct LinearBias {
  float unit_slope = 0.0f, lag_base = 0.0f;
  template <class Bias>
  __device__ LinearBias(Bias bias, const ScoreParams& score, int h, float unit, int lag_base_int) {
    if (bias.linear) {
      unit_slope = __ldg(score.bias_slopes + h) * unit;
      lag_base = float(lag_base_int);
    }
  }
  __device__ float add(float x, int k) const { return fmaf(unit_slope, lag_base + float(k), x); }
};

// Sums of the four lanes of a quad (the lanes that share fragment rows).
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Tensor maps of one call (zeroed and unused by the sm80 main loops, which copy with cp.async):
// q̃, k̃ [B·H, T, W], dout [B, T, C] and v inside qkv [B, T, 3C] as 64-column boxes of 64 rows;
// lse and D [B·H·T] as runs of 64 floats; the bias table [H·T] as runs of 128 (kLagSlots: a 64 ×
// 64 tile's lags) and of 192 (kForwardRows + kTile: the forward's 128 × 64 tile) floats; in the
// atomic-dq mode dq̃ [B·H, T, W] f32, added to in 32-column boxes of 64 rows.
struct AttentionMaps {
  CUtensorMap q, k, dout, v, lse, row_dot, bias_tile, bias_rows, dq;
  int lse_shift, row_dot_shift, bias_shift;  // tma::encode_f32_vector's coordinate shifts
};

// The bias map's element for slot 0 of a tile with i0 − j0 = lag0, for the head whose table row
// starts at element `row_start` (slot i holds b(lag0 + i − 63)).
__host__ __device__ inline int bias_run_first(const AttentionMaps& maps, int row_start_plus_lag0) {
  return row_start_plus_lag0 - (kTile - 1) + maps.bias_shift;
}

// Lags of Ĝ a call computes: AttentionGradients::bias_grad_lags when set, at most T; else T.
__host__ __device__ inline int gradient_lags(const AttentionDims& dims, int requested) {
  return requested > 0 && requested < dims.seq_len ? requested : dims.seq_len;
}

// ---------------------------------------------------------------- q/k gradients in the epilogue

// Row r (0: this lane's row g, 1: g + 8) of a dq̃ or dk̃ accumulator, times `scale` (the f32 row
// as it would be stored), through encode_qk_backward's per-element math into `row`, a row of
// dqkv's q or k block, in bf16 (AttentionGradients::qk_backward_fused). `is_key` picks the
// keys' phase table where it differs from the queries' (a scaled rotation, xPos). The lane holds columns
// 8nb + 2·quad + {0, 1} of every 8-column block, so RoPE's pair (c, c + W/2) (every channel
// rotating) is blocks nb and nb + W/16 of the same lane; t is the row's position in the call.
template <int kW>
__device__ void store_qk_gradient_row(const float (&acc)[kW / 8][4], int r, float scale,
                                      const QkTransformParams& transform, bool is_key, int t, int quad, bf16* row) {
  constexpr int kHalf = kW / 16;
  if (transform.kind == QkTransformKind::rope) {
    const float2* phases = is_key && transform.key_phases != nullptr ? transform.key_phases : transform.phases;
#pragma unroll
    for (int nb = 0; nb < kHalf; ++nb) {
      const int c = nb * 8 + 2 * quad;
      float first[2], second[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 phase = phases[std::int64_t(t) * (kW / 2) + c + e];
        unrotate_pair(acc[nb][2 * r + e] * scale, acc[nb + kHalf][2 * r + e] * scale, PhaseRotation{phase.x, phase.y},
                      first[e], second[e]);
      }
      *reinterpret_cast<__nv_bfloat162*>(row + c) = __floats2bfloat162_rn(first[0], first[1]);
      *reinterpret_cast<__nv_bfloat162*>(row + c + kW / 2) = __floats2bfloat162_rn(second[0], second[1]);
    }
  } else {
#pragma unroll
    for (int nb = 0; nb < kW / 8; ++nb)
      *reinterpret_cast<__nv_bfloat162*>(row + nb * 8 + 2 * quad) =
          __floats2bfloat162_rn(acc[nb][2 * r] * scale, acc[nb][2 * r + 1] * scale);
  }
}

// Row r of a dq̃ or dk̃ accumulator times `scale` into row `row` of the encoded gradient: f32
// (AttentionGradients::dq, dk), or bf16 (dq_bf16, dk_bf16) where the call asks for it. Only
// kernels whose features are wider than a head (kW > kDv: PoPE's 2d-wide ones) carry the bf16
// store; they are the ones whose gradients are large enough for it to pay, and carrying it in the
// W = 64 key kernel raised that kernel's spill stores from 20 to 100 bytes (`-Xptxas -v`).
template <int kW, int kDv>
__device__ void store_encoded_gradient_row(const float (&acc)[kW / 8][4], int r, float scale, const Lane& lane,
                                           float* f32_base, bf16* bf16_base, std::int64_t row) {
  if constexpr (kW > kDv) {
    if (bf16_base != nullptr) {
      bf16* out = bf16_base + row * kW;
#pragma unroll
      for (int nb = 0; nb < kW / 8; ++nb)
        *reinterpret_cast<__nv_bfloat162*>(out + lane.column(nb, 0)) =
            __floats2bfloat162_rn(acc[nb][2 * r] * scale, acc[nb][2 * r + 1] * scale);
      return;
    }
  }
  float* out = f32_base + row * kW;
#pragma unroll
  for (int nb = 0; nb < kW / 8; ++nb)
    *reinterpret_cast<float2*>(out + lane.column(nb, 0)) = make_float2(acc[nb][2 * r] * scale, acc[nb][2 * r + 1] * scale);
}

// CTAs per SM the backward kernels are built for (register limits: 65536 / (128 · CTAs)). With
// fewer CTAs than these the backward measured 15% slower (W = 64): three (key) and four (query)
// single-warpgroup CTAs hide each other's waits.
template <int kW, bool kAtomicDq>
constexpr int key_grad_ctas_per_sm() {
  return kW == 64 && !kAtomicDq ? 3 : 1;
}
template <int kW>
constexpr int query_grad_ctas_per_sm() {
  return kW == 64 ? 4 : 1;
}

}  // namespace

}  // namespace pope::kernels
