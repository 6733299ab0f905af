// The Hopper main loops of the fused attention kernels (sm_90a, head dim 64: v and dout one
// swizzled panel): wgmma products (wgmma.cuh) of a warpgroup's 64 rows, reading k̃, v, q̃ and dout
// straight from swizzled shared memory and P, dS from registers, with thread 0 loading every
// tile by TMA (tma.cuh) into two stages that the threads wait for on mbarriers
// (tma::for_each_loaded). The accumulators keep mma.sync's m16n8 layout per warp, so the kernels'
// softmax, bias, mask, lag-sum and epilogue code is the same for both main loops.
//
// Same interface as MainLoopSm80 (flash_mainloop_sm80.cuh says what it holds). The products are
// compiled in sm_90a code only (POPE_WGMMA) and the TMA pipelines from sm_90 on: elsewhere a
// kernel on this main loop stops at require_code (the dispatch never launches one there).
// Private to flash_attention.cu (its anonymous namespace).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/flash_common.cuh"
#include "attention/tma.cuh"
#include "attention/wgmma.cuh"

namespace pope::kernels {

namespace {

constexpr std::uint32_t kPanelBytes = kTile * 64 * sizeof(__nv_bfloat16);  // one 64 × 64 bf16 box

// A lane's score accumulators (rows lane.row(e) of 64 or 128, 64 columns) set to the tile's bias
// slots times `unit`, for a product that adds q̃·k̃ᵀ onto them: the loads and multiplies come
// before the tensor cores start, into registers the product needs anyway, and the per-score
// code after it adds nothing.
__device__ inline void start_from_bias(float (&acc)[kScoreBlocks][4], const float* slots, const Lane& lane,
                                       float unit) {
#pragma unroll
  for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nb][e] = slots[lane.row(e) - lane.column(nb, e) + kTile - 1] * unit;
}

// Whether `value` holds on all 128 threads of this thread's warpgroup, which all call it with the
// same named barrier (`barrier` ≥ 1: barrier 0 is __syncthreads').
__device__ inline bool warpgroup_all(bool value, int barrier) {
  std::uint32_t all;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, 128, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(all)
      : "r"(std::uint32_t(value)), "r"(barrier)
      : "memory");
  return all != 0;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The kWidth / 64 panels of 64 rows from (column0, row0, group) into rows starting at `tile` of
// a swizzled tile of tile_rows rows (its panels tile_rows · 64 elements apart).
template <int kWidth>
__device__ void load_panels(__nv_bfloat16* tile, const CUtensorMap* map, int column0, int row0, int group,
                            std::uint64_t* barrier, int tile_rows = kTile) {
#pragma unroll
  for (int panel = 0; panel < kWidth / 64; ++panel)
    tma::load_tile(tile + panel * tile_rows * 64, map, column0 + 64 * panel, row0, group, barrier);
}

// Bias slots of a tile with i0 − j0 = lag0 for the head whose table row starts at element
// `row_start`: slot run_lead + i holds b(lag0 + i − 63), kRows + 64 of them (kLagSlots or the
// forward's).
// Lags outside [0, T) land on masked scores only, and the masks are selects, so what they read
// there (the neighbouring heads' entries, zeros past the table, or up to three floats before its
// start) is never used.
template <int kRows = kTile>
__device__ void load_bias_slots(float* slots, const AttentionMaps& maps, int row_start_plus_lag0,
                                std::uint64_t* barrier) {
  const CUtensorMap* map = kRows == kTile ? &maps.bias_tile : &maps.bias_rows;
  tma::load_vector(slots, map, bias_run_first(maps, row_start_plus_lag0), barrier);
}
#endif

struct MainLoopSm90 {
  // Shared tiles of `width` bf16 per row in wgmma's 128-byte swizzle (panels of 64 columns), each
  // starting on a whole swizzle pattern: the layouts hold 1024 bytes of slack, and tile_memory
  // rounds the dynamic shared memory's start up to the pattern.
  __host__ __device__ static constexpr int stride(int width) { return width; }
  static constexpr std::size_t alignment_slack = 1024;
  __device__ static unsigned char* tile_memory(unsigned char* shared) {
    // Offset from the pointer, not rounded as an integer: a pointer rebuilt from an integer loses
    // its shared address space, and every access through it becomes a generic (slower) load/store.
    const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
    return shared + (1024u - address % 1024u) % 1024u;
  }
  // The slot of a stage where a run of floats starting at map element `first` begins: TMA puts it
  // tma::vector_lead slots in. Stages are tma::vector_slots(run) floats apart.
  __host__ __device__ static constexpr int run_lead(int first) { return tma::vector_lead(first); }
  __device__ static void require_code() { wgmma::require_wgmma_code(); }
  // The linear bias policy at W = 64 (score_bias.cuh's kLinearBias); the table policy's forward
  // and query kernels start their scores from the bias (kTableInAccumulators); TMA needs the
  // call's tensor maps.
  static constexpr bool linear_bias = true, starts_from_bias = true, tensor_maps = true;

  // ---------------------------------------------------------------- forward

  // 2 warpgroups × 64 rows, 8 warps × 16 rows; the tensor cores read k̃ and v straight from
  // (swizzled) shared memory and P from registers.
  template <int kW, int kDv>
  struct Forward {
    static constexpr int fragments = 1;  // 16-row fragments per warp
    static constexpr int warps = kForwardRows / (16 * fragments);
    static constexpr int threads = warps * kWarpSize;
    // The rows that multiply together (a warpgroup's 4 warps): warp w's start at
    // w / group_warps · group_rows.
    static constexpr int group_warps = 4, group_rows = 64;
    // A table's heads may visit the key blocks from the diagonal down, and take the optimistic
    // pass (flash_forward.cuh).
    static constexpr bool descending_tables = true, optimistic_with_table = true;

    // s = q̃ · k̃ᵀ for the warpgroup's 64 rows from row0 (units of 1/scale), onto the bias slots
    // times inverse_scale with kOnto.
    template <bool kOnto>
    __device__ static __forceinline__ void scores(float (&s)[fragments][kScoreBlocks][4], const bf16* q_tile,
                                                  const bf16* k_tile, int row0, const float* slots,
                                                  float inverse_scale) {
#if defined(POPE_WGMMA)
      if constexpr (kOnto) start_from_bias(s[0], slots, Lane(), inverse_scale);
      wgmma::product_k_major<kW>(s[0], q_tile + row0 * 64, kForwardRows, k_tile, kTile, kOnto);
#endif
    }

    // Whether `value` holds on every thread of the warpgroup (its four warps multiply together):
    // named barrier 1 + its index, a reduction over its 128 threads.
    __device__ static __forceinline__ bool all_agree(bool value, int warp) {
      return warpgroup_all(value, 1 + warp / 4);
    }

    // o += P · v, P from registers.
    __device__ static __forceinline__ void accumulate(float (&o)[fragments][kDv / 8][4],
                                                      std::uint32_t (&p)[fragments][kScoreSteps][4],
                                                      const bf16* v_tile) {
#if defined(POPE_WGMMA)
      wgmma::accumulate_registers<kScoreSteps>(o[0], p[0], v_tile);
#endif
    }

    // Thread 0 loads with TMA: the n-th key block's k̃, v and bias slots, and the 128 query rows
    // (two boxes of 64) with the first (tma::for_each_loaded); from the diagonal down when
    // `descending`.
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const AttentionMaps& maps, int i0,
                                                    int key_blocks, bool descending, bool table, Body&& body) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int T = dims.seq_len;
      auto block_at = [&](int n) { return descending ? key_blocks - 1 - n : n; };
      auto issue = [&](int n, int stage, std::uint64_t* barrier) {
        const int j0 = block_at(n) * kTile;
        const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes + (n == 0 ? 2 * (kW / 64) * kPanelBytes : 0) +
                                    (table ? tma::vector_box_bytes(Tiles::lag_slots) : 0);
        tma::arrive_expecting(barrier, bytes);
        if (n == 0)
          for (int half = 0; half < 2; ++half)
            load_panels<kW>(tiles.q_tile + half * kTile * 64, &maps.q, 0, i0 + half * kTile, head.bh, barrier,
                            kForwardRows);
        load_panels<kW>(tiles.k_tiles + stage * Tiles::k, &maps.k, 0, j0, head.bh, barrier);
        load_panels<kDv>(tiles.v_tiles + stage * Tiles::v, &maps.v, int(2 * head.channels) + head.h * dims.head_dim,
                         j0, head.b, barrier);
        if (table)
          load_bias_slots<kForwardRows>(tiles.bias_slots + stage * Tiles::lag_stage, maps, head.h * T + i0 - j0,
                                        barrier);
      };
      tma::for_each_loaded(0, key_blocks, issue, [&](int n, int stage) { body(block_at(n), stage); });
#endif
    }
  };

  // ---------------------------------------------------------------- key gradients

  // The key kernel's 4 warps form one warpgroup; the five products run on wgmma — Sᵀ and dPᵀ
  // with both operands in shared memory, dv and dk̃ with Pᵀ, dSᵀ from registers, dq̃ (atomic
  // mode) from dS in shared memory.
  template <int kW, int kDv, bool kAtomicDq>
  struct KeyGrad {
    // Atomic mode: floats after the tiles (1024-byte aligned) staging a chunk of dq̃ for
    // tma::reduce_add_tile.
    static constexpr int dq_stage = kAtomicDq ? kTile * kDqChunk : 0;

    // Sᵀ (rows: this warp's 16 keys, columns: 64 queries) and dPᵀ = V · doutᵀ, in one batch.
    __device__ static __forceinline__ void scores(float (&p)[kScoreBlocks][4], float (&ds)[kScoreBlocks][4],
                                                  const bf16* k_tile, const bf16* v_tile, const bf16* q_tile,
                                                  const bf16* dout_tile, const Lane&) {
#if defined(POPE_WGMMA)
      wgmma::begin();  // both products in one batch
      wgmma::issue_k_major<kW>(p, k_tile, kTile, q_tile, kTile);
      wgmma::issue_k_major<kDv>(ds, v_tile, kTile, dout_tile, kTile);
      wgmma::complete(p, ds);
#endif
    }

    // One batch: dv += Pᵀ · dout and dk̃ += dSᵀ · q̃ (scale at the end), one 64-column panel of
    // q̃ at a time; both A fragments exist before it starts, and beside() runs while the tensor
    // cores do.
    template <class Beside>
    __device__ static __forceinline__ void gradients(float (&dv)[kDv / 8][4], float (&dk)[kW / 8][4],
                                                     const float (&p)[kScoreBlocks][4],
                                                     const float (&ds)[kScoreBlocks][4], const bf16* dout_tile,
                                                     const bf16* q_tile, Beside&& beside) {
      std::uint32_t a[kScoreSteps][4];
      accumulators_to_operand(a, p);
#if defined(POPE_WGMMA)
      std::uint32_t a_ds[kScoreSteps][4];
      accumulators_to_operand(a_ds, ds);
      wgmma::begin();
      wgmma::issue_registers<kScoreSteps>(dv, a, dout_tile);
#pragma unroll
      for (int panel = 0; panel < kW / 64; ++panel)
        wgmma::issue_registers<kScoreSteps>(reinterpret_cast<float(&)[8][4]>(dk[8 * panel]), a_ds,
                                            q_tile + panel * kTile * 64);
      beside();
      wgmma::complete(dv, dk, a, a_ds);
#endif
    }

    // Element of (key, query) in the key-major dS tile (swizzled: the M-major A of dq̃'s product).
    __device__ static __forceinline__ int ds_index(int key, int query) {
      return wgmma::swizzled_index(kTile, key, query);
    }

    // Atomic-dq mode, once every thread has written its dS into the tile: dq̃ of the tile's
    // queries i0.. += scale · dS · k̃, dS as the M-major A (rows: keys) and k̃ as the N-major B. A
    // chunk of 64 columns at a time goes through the staging tile, and thread 0 adds it to dq̃
    // with TMA reduce-adds (one request per 128 bytes instead of one per 8 from every thread).
    template <class Tiles>
    __device__ static __forceinline__ void add_dq(const Tiles& tiles, const Lane& lane, const AttentionHead& head,
                                                  const AttentionGradients&, const AttentionMaps& maps, int i0,
                                                  int, float scale) {
#if defined(POPE_WGMMA)
      wgmma::fence_shared_for_async();
      if (threadIdx.x == 0) tma::wait_bulk_reads();  // the last tile's dq̃ chunk has left the staging tile
      __syncthreads();
      const int query0 = lane.warp * 16;
#pragma unroll
      for (int c0 = 0; c0 < kW; c0 += kDqChunk) {
        float dq[kDqChunk / 8][4];
        static_assert(kDqChunk == 64, "a chunk is one panel of k̃");
        wgmma::product_mn_major<kTile>(dq, tiles.ds_tile, tiles.k_tile + c0 / 64 * kTile * 64);
        if (c0 > 0) {  // the previous chunk has left the staging tile
          if (threadIdx.x == 0) tma::wait_bulk_reads();
          __syncthreads();
        }
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int nb = 0; nb < kDqChunk / 8; ++nb)
            *reinterpret_cast<float2*>(
                tiles.dq_stage + tma::f32_swizzled_index(kTile, query0 + lane.g + 8 * r, lane.column(nb, 0))) =
                make_float2(dq[nb][2 * r] * scale, dq[nb][2 * r + 1] * scale);
        wgmma::fence_shared_for_async();
        __syncthreads();
        if (threadIdx.x == 0) {  // rows past T lie outside the map and are skipped
#pragma unroll
          for (int panel = 0; panel < kDqChunk / tma::kF32BoxColumns; ++panel)
            tma::reduce_add_tile(&maps.dq, tiles.dq_stage + panel * kTile * tma::kF32BoxColumns,
                                 c0 + panel * tma::kF32BoxColumns, i0, head.bh);
          tma::commit_bulk_group();
        }
      }
#endif
    }

    // Thread 0 loads every tile with TMA (the maps, not the head's dout, lse and D rows): query
    // block qb (q̃, dout, lse, D, bias slots), and k̃ and v with the first block
    // (tma::for_each_loaded).
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const bf16*, const float*,
                                                    const float*, const AttentionMaps& maps, int key_block,
                                                    int query_blocks, bool table, Body&& body) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int T = dims.seq_len, d = dims.head_dim, j0 = key_block * kTile;
      auto issue = [&](int qb, int stage, std::uint64_t* barrier) {
        const int i0 = qb * kTile;
        const bool first = qb == key_block;
        const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes * (first ? 2 : 1) +
                                    2 * tma::vector_box_bytes(kTile) + (table ? tma::vector_box_bytes(kLagSlots) : 0);
        tma::arrive_expecting(barrier, bytes);
        if (first) {
          load_panels<kW>(tiles.k_tile, &maps.k, 0, j0, head.bh, barrier);
          load_panels<kDv>(tiles.v_tile, &maps.v, int(2 * head.channels) + head.h * d, j0, head.b, barrier);
        }
        load_panels<kW>(tiles.q_tiles + stage * Tiles::q, &maps.q, 0, i0, head.bh, barrier);
        load_panels<kDv>(tiles.dout_tiles + stage * Tiles::dout, &maps.dout, head.h * d, i0, head.b, barrier);
        // Rows past T read the next head's lse and D (or zeros past the end): their P is masked to 0.
        const int row0 = int(head.statistic_index(i0));
        tma::load_vector(tiles.lse_slots + stage * Tiles::row_stage, &maps.lse, row0 + maps.lse_shift, barrier);
        tma::load_vector(tiles.row_dot_slots + stage * Tiles::row_stage, &maps.row_dot, row0 + maps.row_dot_shift,
                         barrier);
        if (table) load_bias_slots(tiles.bias_slots + stage * Tiles::lag_stage, maps, head.h * T + i0 - j0, barrier);
      };
      tma::for_each_loaded(key_block, query_blocks, issue, body);
      if (kAtomicDq && threadIdx.x == 0) tma::wait_bulk_writes();  // dq̃'s last chunk read and added
#endif
    }
  };

  // ---------------------------------------------------------------- query gradients

  // One warpgroup; S and dP with both operands in shared memory, dq̃ from dS in registers and k̃
  // as the N-major operand.
  template <int kW, int kDv>
  struct QueryGrad {
    // S = q̃ · k̃ᵀ (units of 1/scale; onto the bias slots times inverse_scale with kOnto) and
    // dP = dout · vᵀ, in one batch.
    template <bool kOnto>
    __device__ static __forceinline__ void scores(float (&p)[kScoreBlocks][4], float (&ds)[kScoreBlocks][4],
                                                  const bf16* q_tile, const bf16* dout_tile, const bf16* k_tile,
                                                  const bf16* v_tile, const Lane& lane, const float* slots,
                                                  float inverse_scale) {
#if defined(POPE_WGMMA)
      if constexpr (kOnto) start_from_bias(p, slots, lane, inverse_scale);
      wgmma::begin();  // both products in one batch
      wgmma::issue_k_major<kW>(p, q_tile, kTile, k_tile, kTile, kOnto);  // S (+ b/scale) = q̃ · k̃ᵀ
      wgmma::issue_k_major<kDv>(ds, dout_tile, kTile, v_tile, kTile);    // dP = dout · vᵀ
      wgmma::complete(p, ds);
#endif
    }

    // dq̃ += dS · k̃ (scale at the end), one 64-column panel of k̃ at a time, one batch.
    __device__ static __forceinline__ void accumulate(float (&dq)[kW / 8][4], const float (&ds)[kScoreBlocks][4],
                                                      const bf16* k_tile) {
      std::uint32_t a[kScoreSteps][4];
      accumulators_to_operand(a, ds);
#if defined(POPE_WGMMA)
      wgmma::begin();
#pragma unroll
      for (int panel = 0; panel < kW / 64; ++panel)
        wgmma::issue_registers<kScoreSteps>(reinterpret_cast<float(&)[8][4]>(dq[8 * panel]), a,
                                            k_tile + panel * kTile * 64);
      wgmma::complete(dq, a);
#endif
    }

    // Thread 0 loads with TMA: key block kb's k̃, v and bias slots, and q̃, dout with the first
    // (tma::for_each_loaded).
    template <class Tiles, class Body>
    __device__ static __forceinline__ void pipeline(const Tiles& tiles, const AttentionHead& head,
                                                    const AttentionDims& dims, const AttentionGradients&,
                                                    const AttentionMaps& maps, int i0, int key_blocks, bool table,
                                                    Body&& body) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int T = dims.seq_len, d = dims.head_dim;
      auto issue = [&](int kb, int stage, std::uint64_t* barrier) {
        const int j0 = kb * kTile;
        const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes * (kb == 0 ? 2 : 1) +
                                    (table ? tma::vector_box_bytes(kLagSlots) : 0);
        tma::arrive_expecting(barrier, bytes);
        if (kb == 0) {
          load_panels<kW>(tiles.q_tile, &maps.q, 0, i0, head.bh, barrier);
          load_panels<kDv>(tiles.dout_tile, &maps.dout, head.h * d, i0, head.b, barrier);
        }
        load_panels<kW>(tiles.k_tiles + stage * Tiles::k, &maps.k, 0, j0, head.bh, barrier);
        load_panels<kDv>(tiles.v_tiles + stage * Tiles::v, &maps.v, int(2 * head.channels) + head.h * d, j0, head.b,
                         barrier);
        if (table) load_bias_slots(tiles.bias_slots + stage * Tiles::lag_stage, maps, head.h * T + i0 - j0, barrier);
      };
      tma::for_each_loaded(0, key_blocks, issue, body);
#endif
    }
  };
};

}  // namespace

}  // namespace pope::kernels
