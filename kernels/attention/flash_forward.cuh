// The fused attention forward: out = softmax(q̃·k̃ᵀ·scale + b_h(t − s), causal) · v and the rows'
// lse, per CTA (b·H + h, 128 query rows), streaming 64-key tiles of k̃ and v up to the diagonal
// through two shared stages. Online softmax in f32 in log2 units with lazy rescaling; the last two
// key tiles of a block need the causal mask. Generic over its main loop (MainLoopSm80: mma.sync,
// 4 warps × 32 rows; MainLoopSm90: wgmma, 2 warpgroups × 64 rows): both keep a warp's rows in the
// m16n8 accumulator layout, so the softmax, bias, mask and epilogue code here is shared. Private
// to flash_attention.cu (its anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/flash_common.cuh"
#include "attention/score_bias.cuh"
#include "log2_units.cuh"

namespace pope::kernels {

namespace {

// The forward's dynamic shared memory: the 128 query rows, two stages of a key block's k̃, v and
// bias slots (sizes in bf16 elements or floats, bytes in all), and on the device where each
// starts.
template <int kW, int kDv, class MainLoop>
struct ForwardTiles {
  static constexpr int q = kForwardRows * MainLoop::stride(kW);  // bf16 elements
  static constexpr int k = kTile * MainLoop::stride(kW);
  static constexpr int v = kTile * MainLoop::stride(kDv);
  static constexpr int lag_slots = kForwardRows + kTile;
  static constexpr int lag_stage = tma::vector_slots(lag_slots);
  static constexpr std::size_t bytes =
      std::size_t(q + 2 * k + 2 * v) * sizeof(bf16) + 2 * lag_stage * sizeof(float) + MainLoop::alignment_slack;

  bf16* q_tile;
  bf16* k_tiles;
  bf16* v_tiles;
  float* bias_slots;
  __device__ explicit ForwardTiles(unsigned char* shared)
      : q_tile(reinterpret_cast<bf16*>(MainLoop::tile_memory(shared))),
        k_tiles(q_tile + q),
        v_tiles(k_tiles + 2 * k),
        bias_slots(reinterpret_cast<float*>(v_tiles + 2 * v)) {}
};

template <int kW, int kDv, class MainLoop, class Bias>
__global__ void __launch_bounds__(MainLoop::template Forward<kW, kDv>::threads, 2)
    flash_forward_kernel(AttentionDims dims, EncodedAttention in, bf16* out, float* lse,
                         const __grid_constant__ AttentionMaps maps) {
  MainLoop::require_code();
  using Loop = typename MainLoop::template Forward<kW, kDv>;
  using Tiles = ForwardTiles<kW, kDv, MainLoop>;
  constexpr int kFragments = Loop::fragments;
  extern __shared__ __align__(16) unsigned char shared[];
  const Tiles tiles(shared);

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);  // longest blocks start first
  const int i0 = q_block * kForwardRows;
  const int warp = int(threadIdx.x) / kWarpSize, g = int(threadIdx.x) % kWarpSize / 4, quad = int(threadIdx.x) % 4;
  const int warp_row0 = warp * 16 * kFragments;  // this warp's first row in the tile
  // The first row of the rows that multiply together (a warp's, or a warpgroup's).
  const int group_row0 = warp / Loop::group_warps * Loop::group_rows;
  // Tile row of accumulator element e of fragment f, and column of element e of 8-column block nb.
  auto row_of = [&](int f, int e) { return warp_row0 + 16 * f + g + (e / 2) * 8; };
  auto column_of = [&](int nb, int e) { return nb * 8 + 2 * quad + (e & 1); };
  const HeadBias<Bias, kLinearBias<kW, MainLoop>> bias_of_head(head);
  constexpr bool kOnto = kTableInAccumulators<MainLoop, Bias>;  // the table starts the scores
  const float scale_log2 = in.score.scale * kLog2e, inverse_scale = 1.0f / in.score.scale;

  float o[kFragments][kDv / 8][4];
  float row_max[kFragments][2], row_sum[kFragments][2];
#pragma unroll
  for (int f = 0; f < kFragments; ++f) {
    clear(o[f]);
    row_max[f][0] = row_max[f][1] = -INFINITY;
    row_sum[f][0] = row_sum[f][1] = 0.0f;
  }
  const int key_end = i0 + kForwardRows < T ? i0 + kForwardRows : T;
  const int key_blocks = (key_end + kTile - 1) / kTile;
  // A linear bias (ALiBi: slopes < 0) is largest at the diagonal: its heads visit the key blocks
  // from the diagonal down, so that the running maximum is found first and the tiles after it
  // take the optimistic pass below (ascending, the bias moved the maximum in most tiles). A
  // table's heads (Loop::descending_tables: the wgmma loop) start from the end of this block's
  // lags where the table is larger: the diagonal for PJ-bias's decaying sectors, the first keys
  // for a table that grows with the lag. Only the wgmma kernels have the linear kind, and only
  // their loop has this order.
  const bool descending =
      bias_of_head.linear ||
      (Loop::descending_tables && bias_of_head.table && __ldg(head.bias) >= __ldg(head.bias + key_end - 1));
  bool started = false;  // the rows that multiply together have seen a key block
  auto body = [&](int kb, int stage) {
    const int j0 = kb * kTile;

    // Tiles wholly above the rows that multiply together (a warp's, or a warpgroup's) add nothing.
    if (j0 > i0 + group_row0 + Loop::group_rows - 1) return;
    const bool first_block = !started;
    started = true;
    const bf16* k_tile = tiles.k_tiles + stage * Tiles::k;
    const bf16* v_tile = tiles.v_tiles + stage * Tiles::v;
    // This warp's scores of key block kb in units of 1/scale, the bias added and the causal mask
    // applied.
    const float* slots =
        tiles.bias_slots + stage * Tiles::lag_stage + MainLoop::run_lead(bias_run_first(maps, head.h * T + i0 - j0));
    auto scores = [&](float (&s)[kFragments][kScoreBlocks][4]) {
      Loop::template scores<kOnto>(s, tiles.q_tile, k_tile, group_row0, slots, inverse_scale);
      // Only tiles reaching past this warp's first row need the causal mask (a copy of the loop
      // per case): column col of row `row` is hidden when col > i0 + row − j0.
      const bool masked = j0 + kTile - 1 > i0 + warp_row0;
      // Scores stay in units of 1/scale (s + b/scale, one FFMA with a bias) and the scale rides in
      // the exponential's FFMA below: maxima taken in these units are the right ones, the scale
      // being positive.
      with_bias(bias_of_head, [&](auto bias) {
        // A linear bias: the lag of this thread's element (f, e) of block nb is
        // lag_base + 16f + 8(e / 2) − 8nb − (e & 1), integers that fp32 holds exactly.
        const LinearBias linear(bias, in.score, head.h, inverse_scale, i0 - j0 + warp_row0 + g - 2 * quad);
        with_flag(masked, [&](auto mask) {
#pragma unroll
          for (int f = 0; f < kFragments; ++f)
#pragma unroll
            for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int row = row_of(f, e), col = column_of(nb, e);
                float x = s[f][nb][e];
                if (bias.table && !kOnto) x = fmaf(slots[row - col + kTile - 1], inverse_scale, x);
                if (bias.linear) x = linear.add(x, 16 * f + (e / 2) * 8 - nb * 8 - (e & 1));
                if (mask.value) x = col > i0 + row - j0 ? -INFINITY : x;
                s[f][nb][e] = x;
              }
        });
      });
    };
    // Online softmax per fragment row (r = 0: row g, r = 1: row g + 8). row_sum stays a
    // per-lane partial sum until the end: the correction factor is the same on all four lanes.
    // The running maximum only moves when some row of the warp would otherwise see
    // exponentials above 2^kMaxLead (FlashAttention-4's lazy rescaling): o and row_sum are
    // rescaled in those tiles only (a warp-uniform branch), and otherwise both keep summing
    // relative to the older maximum, which the final o / row_sum and the LSE
    // (row_max + log2 row_sum) cancel exactly. Probabilities stay ≤ 2^kMaxLead: bf16 and the
    // fp32 sums hold them with room to spare.
    //
    // Without a bias table, after the warp's first key block, the exponentials are first taken
    // relative to the running maximum without looking for the tile's own: if every lane's
    // partial row sums stay ≤ 2^kMaxLead (so does every probability), that was the lazy
    // rescaling's outcome anyway and the tile's maxima (32 FMNMX and two shuffles per row pair)
    // were not needed. Otherwise (the maximum had to move, or an exponential overflowed) the
    // scores are computed again and take the path with maxima. A bias that grows towards the
    // diagonal moves the maximum in most tiles of an ascending visit: with the optimistic pass
    // ALiBi's forward took 1.5× as long (T = 16,384), hence its descending visit (above), and a
    // table's visit from its larger end. The mma.sync kernels' table heads (ascending,
    // Loop::optimistic_with_table false) go straight to the maxima.
    constexpr int kMaxLeadExponent = 8;
    constexpr float kMaxLead = float(kMaxLeadExponent), kMaxSum = float(1 << kMaxLeadExponent);  // 2^kMaxLead
    // s ← exp2(s·scale·log2 e − m) for the running maximum m of each row (0 while it is −∞), and
    // sums[f][r] this lane's part of the row's sum.
    auto exponentials = [&](float (&s)[kFragments][kScoreBlocks][4], float (&sums)[kFragments][2]) {
#pragma unroll
      for (int f = 0; f < kFragments; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float base = row_max[f][r] == -INFINITY ? 0.0f : row_max[f][r];
          float sum = 0.0f;
#pragma unroll
          for (int nb = 0; nb < kScoreBlocks; ++nb) {
            s[f][nb][2 * r] = exp2_flush(fmaf(s[f][nb][2 * r], scale_log2, -base));
            s[f][nb][2 * r + 1] = exp2_flush(fmaf(s[f][nb][2 * r + 1], scale_log2, -base));
            sum += s[f][nb][2 * r] + s[f][nb][2 * r + 1];
          }
          sums[f][r] = sum;
        }
    };
    auto add_sums = [&](const float (&sums)[kFragments][2]) {
#pragma unroll
      for (int f = 0; f < kFragments; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) row_sum[f][r] += sums[f][r];
    };
    float s[kFragments][kScoreBlocks][4];
    scores(s);
    bool optimistic_held = false;
    if (!first_block && (Loop::optimistic_with_table || !bias_of_head.table)) {
      float sums[kFragments][2];
      exponentials(s, sums);
      bool within = true;
#pragma unroll
      for (int f = 0; f < kFragments; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) within &= sums[f][r] <= kMaxSum;  // false for inf and NaN too
      // The threads that multiply together agree (the warp, or the warpgroup).
      optimistic_held = Loop::all_agree(within, warp);
      if (optimistic_held)
        add_sums(sums);
      else
        scores(s);
    }
    if (!optimistic_held) {
      float tile_max[kFragments][2];
      bool behind = false;  // some row's maximum is more than kMaxLead below the tile's
#pragma unroll
      for (int f = 0; f < kFragments; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tile = -INFINITY;
#pragma unroll
          for (int nb = 0; nb < kScoreBlocks; ++nb) tile = fmaxf(tile, fmaxf(s[f][nb][2 * r], s[f][nb][2 * r + 1]));
          tile_max[f][r] = quad_max(tile) * scale_log2;  // log2 units
          behind |= tile_max[f][r] > row_max[f][r] + kMaxLead;
        }
      if (__any_sync(0xffffffffu, behind)) {
#pragma unroll
        for (int f = 0; f < kFragments; ++f)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float new_max = fmaxf(row_max[f][r], tile_max[f][r]);
            const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with nothing visible yet
            const float correction = exp2_flush(row_max[f][r] - base);
            row_max[f][r] = new_max;
            row_sum[f][r] *= correction;
#pragma unroll
            for (int nb = 0; nb < kDv / 8; ++nb) {
              o[f][nb][2 * r] *= correction;
              o[f][nb][2 * r + 1] *= correction;
            }
          }
      }
      float sums[kFragments][2];
      exponentials(s, sums);
      add_sums(sums);
    }
    std::uint32_t p[kFragments][kScoreSteps][4];
#pragma unroll
    for (int f = 0; f < kFragments; ++f) accumulators_to_operand(p[f], s[f]);
    Loop::accumulate(o, p, v_tile);
  };
  Loop::pipeline(tiles, head, dims, maps, i0, key_blocks, descending, bias_of_head.table, body);

#pragma unroll
  for (int f = 0; f < kFragments; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = quad_sum(row_sum[f][r]);
      const int t = i0 + row_of(f, 2 * r);
      if (t >= T) continue;
      const float inverse = 1.0f / total;
      bf16* row = out + head.activation_offset(t, dims.head_dim);
#pragma unroll
      for (int nb = 0; nb < kDv / 8; ++nb)
        *reinterpret_cast<__nv_bfloat162*>(row + column_of(nb, 0)) =
            __floats2bfloat162_rn(o[f][nb][2 * r] * inverse, o[f][nb][2 * r + 1] * inverse);
      if (quad == 0) lse[head.statistic_index(t)] = (row_max[f][r] + log2f(total)) * kLn2;
    }
}

}  // namespace

}  // namespace pope::kernels
