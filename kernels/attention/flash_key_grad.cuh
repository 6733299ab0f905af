// The fused attention backward's key kernel: dk̃ and dv of 64 keys per CTA (b·H + h, 64 keys),
// streaming 64-query tiles of q̃, dout, lse and D from the diagonal to the end through two shared
// stages and summing dk̃ and dv in registers (P recomputed from the saved lse, only the diagonal
// tile masked). With a bias gradient it also sums dS along lags into its own partial row of Ĝ (no
// atomics), which bias_grad_reduce_kernel adds up in a fixed order; in the non-deterministic mode
// it adds each tile's dS·k̃ to dq̃ with atomic adds instead of a query kernel. Generic over its
// main loop (flash_mainloop_sm80.cuh, flash_mainloop_sm90.cuh). Private to flash_attention.cu
// (its anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/flash_common.cuh"
#include "attention/score_bias.cuh"
#include "block_reduce.cuh"
#include "fast_divisor.cuh"
#include "log2_units.cuh"

namespace pope::kernels {

namespace {

// The diagonal sums of a 64 × 64 dS tile (keys × queries), the tile's part of Ĝ(Δ), go through
// a shared table of kLagSlots diagonals × 16 parts, diagonal-major (kDiagonalStride floats per
// diagonal: 16 parts and a pad that spreads a warp's writes over all 32 banks and keeps each
// diagonal 16-byte aligned). write_diagonal_parts fills it, diagonal_sum adds one diagonal up.
constexpr int kDiagonalParts = 16, kDiagonalStride = kDiagonalParts + 4;

// A lane's accumulator elements (nb, e) and (nb + 1, e + 2) lie on one diagonal (8 keys down,
// 8 queries right): query − key = 8nb + 2q + e − g − 16·warp. The lane adds those pairs (nb =
// −1 … 7), then takes in lane (g + 1, q)'s e = 1 sums, which lie on its own e = 0 diagonals
// (lane (0, q)'s at nb − 1: its rows come 8 after lane (7, q)'s). What is left, 8nb + 2q − g −
// 16·warp for nb = −1 … 8, differs between the 8 lanes of one q, so each lane writes part
// 4·warp + q of its diagonals, and every (diagonal, part) cell is written by at most one lane;
// cells no lane writes stay as zeroed before the first tile.
__device__ inline void write_diagonal_parts(const float (&ds)[kScoreBlocks][4], const Lane& lane, float* table) {
  // The pair of nb = slot − 1, e (zero for slots past the tile's blocks).
  auto pair = [&](int slot, int e) {
    const int nb = slot - 1;
    const bool upper = nb >= 0 && nb < kScoreBlocks, lower = nb + 1 >= 0 && nb + 1 < kScoreBlocks;
    return (upper ? ds[upper ? nb : 0][e] : 0.0f) + (lower ? ds[lower ? nb + 1 : 0][e + 2] : 0.0f);
  };
  const int from = (int(threadIdx.x) + 4) % kWarpSize;  // lane (g + 1 mod 8, q)
  const bool shifted = lane.g == 0;                      // sends its nb − 1 sums to lane (7, q)
  float* part = table + (lane.column(0, 0) - lane.row(0) + kTile - 1) * kDiagonalStride + 4 * lane.warp + lane.q;
#pragma unroll
  for (int slot = 0; slot <= kScoreBlocks + 1; ++slot) {  // slot = nb + 1, nb = −1 … 8
    const float received = __shfl_sync(0xffffffffu, shifted ? pair(slot - 1, 1) : pair(slot, 1), from);
    // nb = 8 holds a sum only in lanes (7, q), whose diagonals there are at most 63.
    if (slot <= kScoreBlocks || lane.g == 7) part[(slot - 1) * 8 * kDiagonalStride] = pair(slot, 0) + received;
  }
}

// Σ of the 16 parts of table diagonal i (a fixed order: deterministic).
__device__ inline float diagonal_sum(const float* table, int i) {
  const float4* parts = reinterpret_cast<const float4*>(table + i * kDiagonalStride);
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kDiagonalParts / 4; ++k) {
    const float4 v = parts[k];
    total += (v.x + v.y) + (v.z + v.w);
  }
  return total;
}

// The key kernel's dynamic shared memory (sizes in bf16 elements or floats, bytes in all), and on
// the device where each part starts: k̃ and v of the CTA's keys, two stages of q̃ and dout, dS
// (atomic mode), then floats: the main loop's dq̃ staging tile (MainLoop::KeyGrad::dq_stage),
// lse and D of two stages, bias slots of two stages, and (bias_grad) the diagonal parts of the
// lag sums.
template <int kW, int kDv, bool kAtomicDq, class MainLoop>
struct KeyGradTiles {
  static constexpr int k = kTile * MainLoop::stride(kW);  // bf16 elements
  static constexpr int v = kTile * MainLoop::stride(kDv);
  static constexpr int q = kTile * MainLoop::stride(kW);
  static constexpr int dout = kTile * MainLoop::stride(kDv);
  static constexpr int ds = kAtomicDq ? kTile * MainLoop::stride(kTile) : 0;  // dS, key-major, for dq̃
  static constexpr int tile_elements = k + v + 2 * q + 2 * dout + ds;
  static constexpr int dq_stage_floats = MainLoop::template KeyGrad<kW, kDv, kAtomicDq>::dq_stage;
  static constexpr int row_stage = tma::vector_slots(kTile), lag_stage = tma::vector_slots(kLagSlots);
  static constexpr int statistics = 2 * row_stage + 2 * row_stage + 2 * lag_stage;
  static constexpr std::size_t bytes(bool bias_grad) {
    return std::size_t(tile_elements) * sizeof(bf16) +
           (dq_stage_floats + statistics + (bias_grad ? kLagSlots * kDiagonalStride : 0)) * sizeof(float) +
           MainLoop::alignment_slack;  // tile_memory's alignment
  }

  bf16* k_tile;
  bf16* v_tile;
  bf16* q_tiles;
  bf16* dout_tiles;
  bf16* ds_tile;    // kAtomicDq only
  float* dq_stage;  // kAtomicDq on a main loop that stages dq̃ only
  float* lse_slots;
  float* row_dot_slots;
  float* bias_slots;
  float* diagonal_parts;
  __device__ explicit KeyGradTiles(unsigned char* shared)
      : k_tile(reinterpret_cast<bf16*>(MainLoop::tile_memory(shared))),
        v_tile(k_tile + k),
        q_tiles(v_tile + v),
        dout_tiles(q_tiles + 2 * q),
        ds_tile(dout_tiles + 2 * dout),
        dq_stage(reinterpret_cast<float*>(k_tile + tile_elements)),
        lse_slots(dq_stage + dq_stage_floats),
        row_dot_slots(lse_slots + 2 * row_stage),
        bias_slots(row_dot_slots + 2 * row_stage),
        diagonal_parts(bias_slots + 2 * lag_stage) {}
};

template <int kW, int kDv, bool kAtomicDq, class MainLoop>
__global__ void __launch_bounds__(kThreads, key_grad_ctas_per_sm<kW, kAtomicDq>())
    flash_key_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads,
                          const __grid_constant__ AttentionMaps maps) {
  MainLoop::require_code();
  using Loop = typename MainLoop::template KeyGrad<kW, kDv, kAtomicDq>;
  using Tiles = KeyGradTiles<kW, kDv, kAtomicDq, MainLoop>;
  using Bias = BiasChoice<kW == 64 ? BiasDispatch::copies : BiasDispatch::runtime>;
  extern __shared__ __align__(16) unsigned char shared[];
  const Tiles tiles(shared);

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int key_block = int(blockIdx.y);  // low key blocks see the most queries and start first
  const int j0 = key_block * kTile;
  const int query_blocks = (T + kTile - 1) / kTile;
  const Lane lane;
  const HeadBias<Bias, kLinearBias<kW, MainLoop>> bias_of_head(head);
  const bool sums_lags = grads.bias_grad != nullptr;
  const float scale_log2 = in.score.scale * kLog2e;
  // This head's rows of dout, lse and D, for the main loops that copy from them (cp.async).
  const bf16* dout = grads.dout + head.activation_offset(0, d);
  const float* lse = grads.lse + head.statistic_index(0);
  const float* row_dot = grads.row_dot + head.statistic_index(0);

  float dk[kW / 8][4], dv[kDv / 8][4];
  clear(dk);
  clear(dv);
  // Lag sums: thread r < 64 carries lag 64·n + r of step n into step n + 1, which adds the
  // tile's lags below i0 − j0 to it; this CTA's partial row holds lags 0 .. T − j0 − 1.
  float carried_lag_sum = 0.0f;
  const int lags = gradient_lags(dims, grads.bias_grad_lags);
  float* partial_row =
      sums_lags ? grads.bias_grad_partials + (std::int64_t(head.bh) * query_blocks + key_block) * lags : nullptr;
  const int lags_owned = min(T - j0, lags);
  // Cells of the diagonal parts that no lane writes stay zero; the loop's first barrier orders
  // this before the first tile's writes.
  if (sums_lags)
    for (int x = int(threadIdx.x); x < kLagSlots * kDiagonalStride; x += kThreads) tiles.diagonal_parts[x] = 0.0f;

  auto body = [&](int qb, int stage) {
    const int step = qb - key_block, i0 = qb * kTile;

    const bf16* q_tile = tiles.q_tiles + stage * Tiles::q;
    const bf16* dout_tile = tiles.dout_tiles + stage * Tiles::dout;
    const int row0 = int(head.statistic_index(i0));
    const float* lse_tile = tiles.lse_slots + stage * Tiles::row_stage + MainLoop::run_lead(row0 + maps.lse_shift);
    const float* row_dot_tile =
        tiles.row_dot_slots + stage * Tiles::row_stage + MainLoop::run_lead(row0 + maps.row_dot_shift);
    const float* slots =
        tiles.bias_slots + stage * Tiles::lag_stage + MainLoop::run_lead(bias_run_first(maps, head.h * T + i0 - j0));
    // Sᵀ (rows: this warp's 16 keys, columns: 64 queries) and dPᵀ = V · doutᵀ.
    float p[kScoreBlocks][4], ds[kScoreBlocks][4];
    Loop::scores(p, ds, tiles.k_tile, tiles.v_tile, q_tile, dout_tile, lane);
    // Query `query` of key `key` is visible when first_query ≤ query < query_end (the diagonal
    // tile hides queries before the key; queries past T are zero rows); other tiles need no mask
    // (a copy of the loop per case).
    const bool diagonal = qb == key_block;
    const int query_end = T - i0;
    with_bias(bias_of_head, [&](auto bias) {
      // A linear bias: the lag of element e of block nb is lag_base + 8nb + (e & 1) − 8(e / 2).
      const LinearBias linear(bias, in.score, head.h, kLog2e, i0 - j0 + 2 * lane.q - lane.warp * 16 - lane.g);
      with_flag(diagonal || query_end < kTile, [&](auto mask) {
#pragma unroll
        for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = lane.row(e), query = lane.column(nb, e);
            // Here the scale stays a multiply: folding it into the exponential's FFMA as in the
            // other kernels needs lse·log2 e per query in registers (ptxas then spilled 64 bytes).
            float x = p[nb][e] * scale_log2;
            if (bias.table) x = fmaf(slots[query - key + kTile - 1], kLog2e, x);
            if (bias.linear) x = linear.add(x, nb * 8 + (e & 1) - (e / 2) * 8);
            const float prob = exp2_flush(fmaf(lse_tile[query], -kLog2e, x));
            const int first_query = diagonal ? key : 0;
            p[nb][e] = !mask.value || (query >= first_query && query < query_end) ? prob : 0.0f;
            ds[nb][e] = p[nb][e] * (ds[nb][e] - row_dot_tile[query]);
          }
      });
    });
    // This tile's dS summed along lags into the partial row (bias gradients only).
    auto add_lag_sums = [&] {
      write_diagonal_parts(ds, lane, tiles.diagonal_parts);
      __syncthreads();  // (the loop's barrier after the tile orders these reads before the next writes)
      const int i = int(threadIdx.x);
      if (i < kTile) {
        if (step > 0) {  // lag 64·(step − 1) + i is complete: its part from this tile is diagonal i − 64
          const int lag = kTile * (step - 1) + i;
          const float total = carried_lag_sum + (i >= 1 ? diagonal_sum(tiles.diagonal_parts, i - 1) : 0.0f);
          if (lag < lags_owned) partial_row[lag] = total;
        }
        carried_lag_sum = diagonal_sum(tiles.diagonal_parts, i + kTile - 1);
      }
    };
    // dv += Pᵀ · dout and dk̃ += dSᵀ · q̃, the lag sums beside the products (where the main loop
    // puts them).
    Loop::gradients(dv, dk, p, ds, dout_tile, q_tile, [&] {
      if (sums_lags && kTile * (step - 1) < lags_owned) add_lag_sums();
    });

    if constexpr (kAtomicDq) {
      // dq̃ of this tile's 64 queries from its 64 keys: dS (rounded to bf16 as for dk̃) into
      // shared memory key-major, then Loop::add_dq adds scale · dS·k̃ to dq̃ (zeroed before the
      // launch; every key block adds its part, in an order that may change from run to run).
#pragma unroll
      for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = lane.row(2 * r), query = lane.column(nb, 0);
          *reinterpret_cast<std::uint32_t*>(tiles.ds_tile + Loop::ds_index(key, query)) =
              pack_bf16(ds[nb][2 * r], ds[nb][2 * r + 1]);
        }
      Loop::add_dq(tiles, lane, head, grads, maps, i0, T, in.score.scale);
    }
  };
  Loop::pipeline(tiles, head, dims, dout, lse, row_dot, maps, key_block, query_blocks, bias_of_head.table, body);
  if (sums_lags && int(threadIdx.x) < kTile) {
    const int lag = kTile * (query_blocks - 1 - key_block) + int(threadIdx.x);
    if (lag < lags_owned) partial_row[lag] = carried_lag_sum;
  }

  const float scale = in.score.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = j0 + lane.row(2 * r);
    if (s >= T) continue;
    bf16* dqkv_row = grads.dqkv + (std::int64_t(head.b) * T + s) * head.row_stride + std::int64_t(head.h) * d;
    if (grads.qk_backward_fused) {
      store_qk_gradient_row<kW>(dk, r, scale, grads.qk_transform, true, s, lane.q, dqkv_row + head.channels);
    } else {
      store_encoded_gradient_row<kW, kDv>(dk, r, scale, lane, grads.dk, grads.dk_bf16, head.statistic_index(s));
    }
    bf16* dv_row = dqkv_row + 2 * head.channels;
#pragma unroll
    for (int nb = 0; nb < kDv / 8; ++nb)
      *reinterpret_cast<__nv_bfloat162*>(dv_row + lane.column(nb, 0)) =
          __floats2bfloat162_rn(dv[nb][2 * r], dv[nb][2 * r + 1]);
  }
}

// Ĝ_h(Δ) += Σ over the partial rows (b, kb) with 64·kb < T − Δ, in a fixed order: a block takes 32
// lags of head blockIdx.y, the terms n = kb·B + b (kb: the key blocks that reach lag Δ) in
// kLagSumSlices slices (sliced_column_sum; one thread per lag adding every term alone waited on
// memory: up to B·T/64 loads one after another, with few threads in flight at short T). The
// batch is the divisor that splits n, the same for every lag (a multiply and a shift, where the
// lag's own count of key blocks took a division per term).
constexpr int kLagSumSlices = 16;
__global__ void bias_grad_reduce_kernel(AttentionDims dims, int requested_lags, FastDivisor batch,
                                        const float* partials, float* bias_grad) {
  const int T = dims.seq_len, H = dims.n_head, h = int(blockIdx.y), key_blocks = (T + kTile - 1) / kTile;
  const int lags = gradient_lags(dims, requested_lags);
  const int lag = int(blockIdx.x) * kWarpSize + int(threadIdx.x);
  const int blocks = lag < lags ? (T - lag + kTile - 1) / kTile : 0;  // key blocks kb with 64·kb < T − lag
  const float* column = partials + std::int64_t(h) * key_blocks * lags + lag;
  const std::int64_t batch_stride = std::int64_t(H) * key_blocks * lags;
  const float total = sliced_column_sum<kLagSumSlices>(dims.batch * blocks, [&](int n) {
    const int kb = batch.quotient(n), b = n - kb * dims.batch;
    return column[b * batch_stride + std::int64_t(kb) * lags];
  });
  if (threadIdx.y == 0 && lag < lags) bias_grad[std::int64_t(h) * T + lag] += total;
}

}  // namespace

}  // namespace pope::kernels
