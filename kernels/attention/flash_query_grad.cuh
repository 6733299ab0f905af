// The fused attention backward's query kernel (deterministic mode): dq̃ of 64 query rows per CTA
// (b·H + h, 64 query rows), streaming the key tiles up to the diagonal again through two shared
// stages: P recomputed from the saved lse, dS = P ∘ (dP − D), dq̃ += dS · k̃, summed in registers
// in a fixed order. Like the forward it keeps scores in units of 1/scale and folds the scale into
// the exponential's FFMA. Generic over its main loop (flash_mainloop_sm80.cuh,
// flash_mainloop_sm90.cuh). Private to flash_attention.cu (its anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/flash_common.cuh"
#include "attention/score_bias.cuh"
#include "log2_units.cuh"

namespace pope::kernels {

namespace {

// The query kernel's dynamic shared memory: q̃ and dout of the CTA's rows, two stages of a key
// block's k̃, v and bias slots (sizes in bf16 elements or floats, bytes in all), and on the device
// where each starts.
template <int kW, int kDv, class MainLoop>
struct QueryGradTiles {
  static constexpr int q = kTile * MainLoop::stride(kW);  // bf16 elements
  static constexpr int dout = kTile * MainLoop::stride(kDv);
  static constexpr int k = kTile * MainLoop::stride(kW);
  static constexpr int v = kTile * MainLoop::stride(kDv);
  static constexpr int lag_stage = tma::vector_slots(kLagSlots);
  static constexpr std::size_t bytes = std::size_t(q + dout + 2 * k + 2 * v) * sizeof(bf16) +
                                       2 * lag_stage * sizeof(float) + MainLoop::alignment_slack;

  bf16* q_tile;
  bf16* dout_tile;
  bf16* k_tiles;
  bf16* v_tiles;
  float* bias_slots;
  __device__ explicit QueryGradTiles(unsigned char* shared)
      : q_tile(reinterpret_cast<bf16*>(MainLoop::tile_memory(shared))),
        dout_tile(q_tile + q),
        k_tiles(dout_tile + dout),
        v_tiles(k_tiles + 2 * k),
        bias_slots(reinterpret_cast<float*>(v_tiles + 2 * v)) {}
};

template <int kW, int kDv, class MainLoop, class Bias>
__global__ void __launch_bounds__(kThreads, query_grad_ctas_per_sm<kW>())
    flash_query_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads,
                            const __grid_constant__ AttentionMaps maps) {
  MainLoop::require_code();
  using Loop = typename MainLoop::template QueryGrad<kW, kDv>;
  using Tiles = QueryGradTiles<kW, kDv, MainLoop>;
  extern __shared__ __align__(16) unsigned char shared[];
  const Tiles tiles(shared);

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);
  const int i0 = q_block * kTile;
  const Lane lane;
  const HeadBias<Bias, kLinearBias<kW, MainLoop>> bias_of_head(head);
  constexpr bool kOnto = kTableInAccumulators<MainLoop, Bias>;  // the table starts the scores
  const float scale_log2 = in.score.scale * kLog2e, inverse_scale = 1.0f / in.score.scale;

  // This lane's two rows: −lse in log2 units (−∞ past T, so that P is 0 there) and D.
  float minus_lse2[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = i0 + lane.row(2 * r);
    minus_lse2[r] = t < T ? grads.lse[head.statistic_index(t)] * -kLog2e : -INFINITY;
    row_dot[r] = t < T ? grads.row_dot[head.statistic_index(t)] : 0.0f;
  }

  float dq[kW / 8][4];
  clear(dq);
  const int key_blocks = q_block + 1;
  auto body = [&](int kb, int stage) {

    const bf16* k_tile = tiles.k_tiles + stage * Tiles::k;
    const bf16* v_tile = tiles.v_tiles + stage * Tiles::v;
    const float* slots = tiles.bias_slots + stage * Tiles::lag_stage +
                         MainLoop::run_lead(bias_run_first(maps, head.h * T + i0 - kb * kTile));
    // S (+ b/scale with kOnto) = q̃ · k̃ᵀ and dP = dout · vᵀ.
    float p[kScoreBlocks][4], ds[kScoreBlocks][4];
    Loop::template scores<kOnto>(p, ds, tiles.q_tile, tiles.dout_tile, k_tile, v_tile, lane, slots, inverse_scale);
    // Only the diagonal tile hides keys (columns past the row); a copy of the loop per case.
    const bool diagonal = kb == q_block;
    with_bias(bias_of_head, [&](auto bias) {
      // A linear bias: the lag of element e of block nb is lag_base + 8(e / 2) − 8nb − (e & 1).
      const LinearBias linear(bias, in.score, head.h, inverse_scale, i0 - kb * kTile + lane.warp * 16 + lane.g - 2 * lane.q);
      with_flag(diagonal, [&](auto mask) {
#pragma unroll
        for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = lane.row(e), col = lane.column(nb, e);
            // log2 P = scale·(s + b/scale)·log2 e − lse·log2 e
            float x = p[nb][e];
            if (bias.table && !kOnto) x = fmaf(slots[row - col + kTile - 1], inverse_scale, x);
            if (bias.linear) x = linear.add(x, (e / 2) * 8 - nb * 8 - (e & 1));
            const float prob = mask.value && col > row ? 0.0f : exp2_flush(fmaf(x, scale_log2, minus_lse2[e / 2]));
            ds[nb][e] = prob * (ds[nb][e] - row_dot[e / 2]);
          }
      });
    });
    Loop::accumulate(dq, ds, k_tile);  // dq̃ += dS · k̃ (scale at the end)
  };
  Loop::pipeline(tiles, head, dims, grads, maps, i0, key_blocks, bias_of_head.table, body);

  const float scale = in.score.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = i0 + lane.row(2 * r);
    if (t >= T) continue;
    if (grads.qk_backward_fused) {
      store_qk_gradient_row<kW>(dq, r, scale, grads.qk_transform, false, t, lane.q,
                                grads.dqkv + (std::int64_t(head.b) * T + t) * head.row_stride + std::int64_t(head.h) * d);
      continue;
    }
    store_encoded_gradient_row<kW, kDv>(dq, r, scale, lane, grads.dq, grads.dq_bf16, head.statistic_index(t));
  }
}

}  // namespace

}  // namespace pope::kernels
