// The sm80 main loops of the fused attention kernels: mma.sync m16n8k16 (bf16 in, f32 accumulate)
// with operands loaded by ldmatrix from padded shared tiles (mma_tiles.cuh), each warp
// multiplying its own rows, and every thread copying its part of each tile with cp.async into
// two stages (for_each_double_buffered). They run on every GPU from sm_80 on, and on Hopper for
// the widths the wgmma main loops (flash_mainloop_sm90.cuh) do not take.
//
// MainLoopSm80 and MainLoopSm90 have one interface, which the kernels (flash_forward.cuh,
// flash_key_grad.cuh, flash_query_grad.cuh) are generic over: the shared tiles' layout, the
// traits where the generations behave differently, and per kernel (Forward, KeyGrad, QueryGrad)
// its products and the pipeline that loads its tiles and calls its body. Private to
// flash_attention.cu (its anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/flash_common.cuh"

namespace pope::kernels {

namespace {

// slots[i] = b(lag0 + i − 63) for the kRows + 63 lags of a tile of kRows queries × 64 keys
// with i0 − j0 = lag0 (0 outside [0, T)); the slot of (row, column) is row − column + 63.
template <int kRows>
__device__ void stage_bias_async(float* slots, const float* bias, int lag0, int seq_len) {
  constexpr int kSlots = kRows + kTile;
  for (int i = int(threadIdx.x); i < kSlots; i += int(blockDim.x)) {
    const int lag = lag0 + i - (kTile - 1);
    const bool valid = i < kSlots - 1 && lag >= 0 && lag < seq_len;
    copy_async_4(slots + i, valid ? bias + lag : bias, valid);
  }
}

// Statistics of 64 rows into shared memory; rows ≥ T read as 0.
__device__ void stage_rows_async(float* slots, const float* source, int first, int seq_len) {
  for (int i = int(threadIdx.x); i < kTile; i += int(blockDim.x)) {
    const bool valid = first + i < seq_len;
    copy_async_4(slots + i, valid ? source + first + i : source, valid);
  }
}

// grads.dq[row t] += pair (values in columns col, col + 1), atomically.
__device__ inline void atomic_add_pair(float* address, float first, float second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(address), make_float2(first, second));
#else
  atomicAdd(address, first);
  atomicAdd(address + 1, second);
#endif
}

struct MainLoopSm80 {
  // Shared tiles of `width` bf16 per row, padded to width + 8 (no ldmatrix bank conflicts), need
  // no alignment beyond 16 bytes: the dynamic shared memory is used from its start.
  __host__ __device__ static constexpr int stride(int width) { return padded_stride(width); }
  static constexpr std::size_t alignment_slack = 0;
  __device__ static unsigned char* tile_memory(unsigned char* shared) { return shared; }
  // The slot of a stage where a run of floats starting at map element `first` begins: cp.async
  // stages it from slot 0.
  __host__ __device__ static constexpr int run_lead(int) { return 0; }
  // Every build holds these instructions.
  __device__ static void require_code() {}
  // No linear bias policy (score_bias.cuh's kLinearBias): in the mma.sync key kernel a linear copy
  // more than doubled the register spills. The accumulators start cleared, never from the bias
  // (kTableInAccumulators), and the tiles come without tensor maps.
  static constexpr bool linear_bias = false, starts_from_bias = false, tensor_maps = false;

  // ---------------------------------------------------------------- forward

  // 4 warps × 32 rows (two 16-row fragments), so every B fragment of k̃ and v loaded from shared
  // memory feeds two mma, half the shared-memory traffic per product of one 16-row warp, which is
  // what bounds mma.sync here.
  template <int kW, int kDv>
  struct Forward {
    static constexpr int fragments = 2;  // 16-row fragments per warp
    static constexpr int warps = kForwardRows / (16 * fragments);
    static constexpr int threads = warps * kWarpSize;
    // The rows that multiply together (one warp's): warp w's start at w / group_warps · group_rows.
    static constexpr int group_warps = 1, group_rows = 16 * fragments;
    // Key blocks visited in ascending order only; a table's heads go straight to the maxima.
    static constexpr bool descending_tables = false, optimistic_with_table = false;

    // s = q̃ · k̃ᵀ for the warp's rows from row0 (units of 1/scale), from cleared accumulators.
    template <bool kOnto>
    __device__ static __forceinline__ void scores(float (&s)[fragments][kScoreBlocks][4], const bf16* q_tile,
                                                  const bf16* k_tile, int row0, const float*, float) {
      static_assert(!kOnto, "the mma.sync products start from cleared accumulators");
#pragma unroll
      for (int f = 0; f < fragments; ++f) clear(s[f]);
#pragma unroll
      for (int k0 = 0; k0 < kW; k0 += 16) {
        std::uint32_t a[fragments][4];
#pragma unroll
        for (int f = 0; f < fragments; ++f) load_matrix_x4(a[f], a_operand<kW>(q_tile, row0 + 16 * f, k0));
#pragma unroll
        for (int n0 = 0; n0 < kTile; n0 += 16) {
          std::uint32_t b[4];
          load_matrix_x4(b, b_rows<kW>(k_tile, n0, k0));
#pragma unroll
          for (int f = 0; f < fragments; ++f) {
            mma_bf16(s[f][n0 / 8], a[f], b[0], b[1]);
            mma_bf16(s[f][n0 / 8 + 1], a[f], b[2], b[3]);
          }
        }
      }
    }

    // Whether `value` holds on every thread of the warp (the rows that multiply together).
    __device__ static __forceinline__ bool all_agree(bool value, int) { return __all_sync(0xffffffffu, value); }

    // o += P · v for the warp's fragments.
    __device__ static __forceinline__ void accumulate(float (&o)[fragments][kDv / 8][4],
                                                      std::uint32_t (&p)[fragments][kScoreSteps][4],
                                                      const bf16* v_tile) {
#pragma unroll
      for (int step = 0; step < kScoreSteps; ++step)
#pragma unroll
        for (int n0 = 0; n0 < kDv; n0 += 16) {
          std::uint32_t b[4];
          load_matrix_x4_transposed(b, b_columns<kDv>(v_tile, step * 16, n0));
#pragma unroll
          for (int f = 0; f < fragments; ++f) {
            mma_bf16(o[f][n0 / 8], p[f][step], b[0], b[1]);
            mma_bf16(o[f][n0 / 8 + 1], p[f][step], b[2], b[3]);
          }
        }
    }

    // All threads copy: the 128 query rows with the first key block (one group), then key block
    // kb's k̃, v and bias slots into stage (kb & 1) while body(kb − 1) runs on the other. The
    // blocks go in ascending order (descending is never set for this loop: descending_tables is
    // false and it has no linear kind).
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const AttentionMaps&, int i0,
                                                    int key_blocks, bool, bool table, Body&& body) {
      const int T = dims.seq_len;
      auto load_keys = [&](int kb, int stage) {
        const int j0 = kb * kTile;
        load_tile_async<kW>(tiles.k_tiles + stage * Tiles::k, head.k, kW, j0, kTile, T);
        load_tile_async<kDv>(tiles.v_tiles + stage * Tiles::v, head.v, head.row_stride, j0, kTile, T);
        if (table) stage_bias_async<kForwardRows>(tiles.bias_slots + stage * Tiles::lag_stage, head.bias, i0 - j0, T);
        copy_async_commit();
      };
      load_tile_async<kW>(tiles.q_tile, head.q, kW, i0, kForwardRows, T);
      load_keys(0, 0);  // one group with the queries
      for_each_double_buffered(0, key_blocks, load_keys, body);
    }
  };

  // ---------------------------------------------------------------- key gradients

  template <int kW, int kDv, bool kAtomicDq>
  struct KeyGrad {
    static constexpr int dq_stage = 0;  // floats staging dq̃ (none: the atomics add from registers)

    // Sᵀ (rows: this warp's 16 keys, columns: 64 queries) and dPᵀ = V · doutᵀ.
    __device__ static __forceinline__ void scores(float (&p)[kScoreBlocks][4], float (&ds)[kScoreBlocks][4],
                                                  const bf16* k_tile, const bf16* v_tile, const bf16* q_tile,
                                                  const bf16* dout_tile, const Lane& lane) {
      clear(p);
      clear(ds);
      mma_a_tile_b_rows<kW, kTile, kW, kW>(p, k_tile, lane.warp * 16, q_tile);
      mma_a_tile_b_rows<kDv, kTile, kDv, kDv>(ds, v_tile, lane.warp * 16, dout_tile);
    }

    // dv += Pᵀ · dout and dk̃ += dSᵀ · q̃ (scale at the end); beside() runs before the products
    // (after them the d = 128 kernel spilled 40 bytes).
    template <class Beside>
    __device__ static __forceinline__ void gradients(float (&dv)[kDv / 8][4], float (&dk)[kW / 8][4],
                                                     const float (&p)[kScoreBlocks][4],
                                                     const float (&ds)[kScoreBlocks][4], const bf16* dout_tile,
                                                     const bf16* q_tile, Beside&& beside) {
      std::uint32_t a[kScoreSteps][4];
      accumulators_to_operand(a, p);
      beside();
      mma_a_registers_b_columns<kScoreSteps, kDv, kDv>(dv, a, dout_tile);  // dv += Pᵀ · dout
      accumulators_to_operand(a, ds);
      mma_a_registers_b_columns<kScoreSteps, kW, kW>(dk, a, q_tile);  // dk̃ += dSᵀ · q̃ (scale at the end)
    }

    // Element of (key, query) in the key-major dS tile.
    __device__ static __forceinline__ int ds_index(int key, int query) { return key * padded_stride(kTile) + query; }

    // Atomic-dq mode, once every thread has written its dS into the tile: dq̃ of the tile's
    // queries i0.. += scale · dS · k̃, warp w's queries 16w..16w+15 over all 64 keys, with float
    // atomics from registers (pairs on sm_90).
    template <class Tiles>
    __device__ static __forceinline__ void add_dq(const Tiles& tiles, const Lane& lane, const AttentionHead& head,
                                                  const AttentionGradients& grads, const AttentionMaps&, int i0,
                                                  int T, float scale) {
      __syncthreads();
      const int query0 = lane.warp * 16;
#pragma unroll
      for (int c0 = 0; c0 < kW; c0 += kDqChunk) {
        float dq[kDqChunk / 8][4];
        clear(dq);
        mma_a_columns_b_columns<kTile, kDqChunk, kTile, kW>(dq, tiles.ds_tile, query0, tiles.k_tile + c0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = i0 + query0 + lane.g + 8 * r;
          if (t >= T) continue;
          float* dq_row = grads.dq + head.statistic_index(t) * kW + c0;
#pragma unroll
          for (int nb = 0; nb < kDqChunk / 8; ++nb)
            atomic_add_pair(dq_row + lane.column(nb, 0), dq[nb][2 * r] * scale, dq[nb][2 * r + 1] * scale);
        }
      }
    }

    // All threads copy: k̃ and v with the first query block (one group), then query block qb's
    // q̃, dout, lse, D (from the head's rows `dout`, `lse`, `row_dot`) and bias slots into stage
    // (qb − key_block) & 1 while the body runs on the other.
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const bf16* dout, const float* lse,
                                                    const float* row_dot, const AttentionMaps&, int key_block,
                                                    int query_blocks, bool table, Body&& body) {
      const int T = dims.seq_len, j0 = key_block * kTile;
      auto load_queries = [&](int qb, int stage) {
        const int i0 = qb * kTile;
        load_tile_async<kW>(tiles.q_tiles + stage * Tiles::q, head.q, kW, i0, kTile, T);
        load_tile_async<kDv>(tiles.dout_tiles + stage * Tiles::dout, dout, head.channels, i0, kTile, T);
        stage_rows_async(tiles.lse_slots + stage * Tiles::row_stage, lse, i0, T);
        stage_rows_async(tiles.row_dot_slots + stage * Tiles::row_stage, row_dot, i0, T);
        if (table) stage_bias_async<kTile>(tiles.bias_slots + stage * Tiles::lag_stage, head.bias, i0 - j0, T);
        copy_async_commit();
      };
      load_tile_async<kW>(tiles.k_tile, head.k, kW, j0, kTile, T);
      load_tile_async<kDv>(tiles.v_tile, head.v, head.row_stride, j0, kTile, T);
      load_queries(key_block, 0);
      for_each_double_buffered(key_block, query_blocks, load_queries, body);
    }
  };

  // ---------------------------------------------------------------- query gradients

  template <int kW, int kDv>
  struct QueryGrad {
    // S = q̃ · k̃ᵀ (units of 1/scale) and dP = dout · vᵀ, from cleared accumulators.
    template <bool kOnto>
    __device__ static __forceinline__ void scores(float (&p)[kScoreBlocks][4], float (&ds)[kScoreBlocks][4],
                                                  const bf16* q_tile, const bf16* dout_tile, const bf16* k_tile,
                                                  const bf16* v_tile, const Lane& lane, const float*, float) {
      static_assert(!kOnto, "the mma.sync products start from cleared accumulators");
      clear(p);
      clear(ds);
      mma_a_tile_b_rows<kW, kTile, kW, kW>(p, q_tile, lane.warp * 16, k_tile);        // S = q̃ · k̃ᵀ
      mma_a_tile_b_rows<kDv, kTile, kDv, kDv>(ds, dout_tile, lane.warp * 16, v_tile);  // dP = dout · vᵀ
    }

    // dq̃ += dS · k̃ (scale at the end).
    __device__ static __forceinline__ void accumulate(float (&dq)[kW / 8][4], const float (&ds)[kScoreBlocks][4],
                                                      const bf16* k_tile) {
      std::uint32_t a[kScoreSteps][4];
      accumulators_to_operand(a, ds);
      mma_a_registers_b_columns<kScoreSteps, kW, kW>(dq, a, k_tile);
    }

    // All threads copy: q̃ and dout with the first key block (one group), then key block kb's k̃,
    // v and bias slots into stage kb & 1 while the body runs on the other.
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const AttentionGradients& grads,
                                                    const AttentionMaps&, int i0, int key_blocks, bool table,
                                                    Body&& body) {
      const int T = dims.seq_len, d = dims.head_dim;
      auto load_keys = [&](int kb, int stage) {
        const int j0 = kb * kTile;
        load_tile_async<kW>(tiles.k_tiles + stage * Tiles::k, head.k, kW, j0, kTile, T);
        load_tile_async<kDv>(tiles.v_tiles + stage * Tiles::v, head.v, head.row_stride, j0, kTile, T);
        if (table) stage_bias_async<kTile>(tiles.bias_slots + stage * Tiles::lag_stage, head.bias, i0 - j0, T);
        copy_async_commit();
      };
      load_tile_async<kW>(tiles.q_tile, head.q, kW, i0, kTile, T);
      load_tile_async<kDv>(tiles.dout_tile, grads.dout + head.activation_offset(0, d), head.channels, i0, kTile, T);
      load_keys(0, 0);
      for_each_double_buffered(0, key_blocks, load_keys, body);
    }
  };
};

}  // namespace

}  // namespace pope::kernels
