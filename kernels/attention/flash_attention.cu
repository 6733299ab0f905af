// Fused causal attention on tensor cores (see flash_attention.cuh and mma_tiles.cuh).
//   forward:    CTA = (b·H + h, 128 query rows), 4 warps × 32 rows; streams 64-key tiles of k̃
//               and v up to the diagonal through double-buffered shared memory (cp.async by all
//               threads; in the wgmma kernels TMA copies issued by thread 0, tma.cuh); ALiBi's
//               heads (a linear bias) visit the tiles from the diagonal down.
//   key grad:   CTA = (b·H + h, 64 keys); streams 64-query tiles of q̃, dout, lse and D from the
//               diagonal to the end, sums dk̃ and dv in registers; with a bias gradient it also
//               sums dS along lags into its own partial row (no atomics). Non-deterministic
//               mode: it also adds each tile's dS·k̃ to dq̃ with atomic adds (no query kernel).
//   query grad: CTA = (b·H + h, 64 query rows); streams key tiles again and sums dq̃
//               (deterministic mode).
// In the backward, query and key blocks are both 64 rows, so only the diagonal tile needs the
// causal mask; in the forward the last two key tiles of a 128-row block do. Tiles above the
// diagonal are never visited. Rows past T are zero-filled on load (by the copies) and never stored.
// Logits live in log2 units: x = (<q̃, k̃>·scale + b_h(t − s))·log2 e, softmax via exp2.
// The per-score code is branch-free: masks are selects after the exponential, and at W = 64 the
// bias is a policy type (score_bias.cuh) fixed at compile time wherever the kernel allows, so the
// unrolled loops stay straight-line code.
// Whether a tile needs the mask is a compile-time choice per tile too (with_flag): most tiles
// need none. Forward and query kernels keep scores in units of 1/scale (s + b/scale: one FFMA
// with a bias; the wgmma ones with a table start the product from b/scale instead) and fold the
// scale into the exponential's FFMA (exp2(s·c − max)).
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

#include "attention/attention_head.cuh"
#include "attention/encoding_math.cuh"
#include "attention/flash_attention.cuh"
#include "attention/kernel_launch.cuh"
#include "attention/mma_tiles.cuh"
#include "attention/score_bias.cuh"
#include "attention/tma.cuh"
#include "attention/wgmma.cuh"
#include "block_reduce.cuh"
#include "fast_divisor.cuh"
#include "grid.cuh"
#include "log2_units.cuh"

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

// Lane coordinates inside the mma fragments, and the tile row/column of accumulator element e
// of 8-column block nb for a warp owning tile rows [16·warp, 16·warp + 16).
struct Lane {
  int warp, g, q;
  __device__ Lane() : warp(int(threadIdx.x) / kWarpSize), g(int(threadIdx.x) % kWarpSize / 4), q(int(threadIdx.x) % 4) {}
  __device__ int row(int e) const { return warp * 16 + g + (e / 2) * 8; }
  __device__ int column(int nb, int e) const { return nb * 8 + 2 * q + (e & 1); }
};

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

// A lane's score accumulators (rows lane.row(e) of 64 or 128, 64 columns) set to the tile's bias
// slots times `unit`, for a product that adds q̃·k̃ᵀ onto them: the loads and multiplies come
// before the tensor cores start, into registers the product needs anyway, and the per-score
// code after it adds nothing. (wgmma builds only: the mma.sync kernels clear their accumulators.)
#if defined(POPE_WGMMA)
__device__ inline void start_from_bias(float (&acc)[kScoreBlocks][4], const float* slots, const Lane& lane,
                                       float unit) {
#pragma unroll
  for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nb][e] = slots[lane.row(e) - lane.column(nb, e) + kTile - 1] * unit;
}
#endif

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

// Sums of the four lanes of a quad (the lanes that share fragment rows).
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---------------------------------------------------------------- TMA loads (wgmma builds)

// Tensor maps of one call (zeroed and unused in builds without wgmma): q̃, k̃ [B·H, T, W], dout
// [B, T, C] and v inside qkv [B, T, 3C] as 64-column boxes of 64 rows; lse and D [B·H·T] as runs
// of 64 floats; the bias table [H·T] as runs of 128 (kLagSlots: a 64 × 64 tile's lags) and of
// 192 (kForwardRows + kTile: the forward's 128 × 64 tile) floats; in the atomic-dq mode dq̃
// [B·H, T, W] f32, added to in 32-column boxes of 64 rows.
struct AttentionMaps {
  CUtensorMap q, k, dout, v, lse, row_dot, bias_tile, bias_rows, dq;
  int lse_shift, row_dot_shift, bias_shift;  // tma::encode_f32_vector's coordinate shifts
};

// The bias map's element for slot 0 of a tile with i0 − j0 = lag0, for the head whose table row
// starts at element `row_start` (slot i holds b(lag0 + i − 63)).
__host__ __device__ inline int bias_run_first(const AttentionMaps& maps, int row_start_plus_lag0) {
  return row_start_plus_lag0 - (kTile - 1) + maps.bias_shift;
}

// The slot of a stage where a run of floats starting at map element `first` begins: TMA puts it
// tma::vector_lead slots in, the cp.async loads of builds without wgmma at slot 0. Stages are
// tma::vector_slots(run) floats apart in both.
template <bool kWgmma>
__host__ __device__ constexpr int run_lead(int first) {
  return kWgmma ? tma::vector_lead(first) : 0;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr std::uint32_t kPanelBytes = kTile * 64 * sizeof(__nv_bfloat16);  // one 64 × 64 bf16 box

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

// ---------------------------------------------------------------- forward

// 128 query rows per CTA. mma.sync (sm_80 on): 4 warps × 32 rows (two 16-row fragments), so
// every B fragment of k̃ and v loaded from shared memory feeds two mma, half the shared-memory
// traffic per product of one 16-row warp, which is what bounds mma.sync here. wgmma (kWgmma,
// sm_90a, d = 64): 2 warpgroups × 64 rows, 8 warps × 16 rows; the tensor cores read
// k̃ and v straight from (swizzled) shared memory and P from registers. The softmax, bias and mask
// code is shared: both keep a warp's rows in the m16n8 accumulator layout.
constexpr int kForwardRows = 128;
template <bool kWgmma>
struct ForwardShape {
  static constexpr int fragments = kWgmma ? 1 : 2;  // 16-row fragments per warp
  static constexpr int warps = kForwardRows / (16 * fragments);
  static constexpr int threads = warps * kWarpSize;
};

template <int kW, int kDv, bool kWgmma>
struct ForwardLayout {
  static constexpr int q = kForwardRows * (kWgmma ? kW : padded_stride(kW));  // bf16 elements
  static constexpr int k = kTile * (kWgmma ? kW : padded_stride(kW));
  static constexpr int v = kTile * (kWgmma ? kDv : padded_stride(kDv));
  static constexpr int lag_slots = kForwardRows + kTile;
  static constexpr int lag_stage = tma::vector_slots(lag_slots);
  // wgmma: + 1024, the kernel rounds its shared memory's start up to a whole swizzle pattern.
  static constexpr std::size_t bytes =
      std::size_t(q + 2 * k + 2 * v) * sizeof(bf16) + 2 * lag_stage * sizeof(float) + (kWgmma ? 1024 : 0);
};

// The dynamic shared memory, aligned for swizzled tiles when kWgmma (ForwardLayout's slack).
template <bool kWgmma>
__device__ inline unsigned char* tile_memory(unsigned char* shared) {
  if constexpr (!kWgmma) return shared;
  // Offset from the pointer, not rounded as an integer: a pointer rebuilt from an integer loses
  // its shared address space, and every access through it becomes a generic (slower) load/store.
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  return shared + (1024u - address % 1024u) % 1024u;
}

// All threads of the block: rows [first, first + rows) of a kWidth-wide bf16 matrix into a
// shared tile, padded (mma.sync) or swizzled (wgmma, kWidth = 64); rows ≥ count become zeros.
template <int kWidth, bool kWgmma>
__device__ void load_operand_tile_async(bf16* tile, const bf16* source, std::int64_t source_stride, int first,
                                        int rows, int count) {
  if constexpr (!kWgmma) {
    load_tile_async<kWidth>(tile, source, source_stride, first, rows, count);
  } else {
    constexpr int kChunks = kWidth / 8;  // 16-byte pieces per row
    for (int i = int(threadIdx.x); i < rows * kChunks; i += int(blockDim.x)) {
      const int r = i / kChunks, chunk = i % kChunks, row = first + r;
      const bool valid = row < count;
      const bf16* from = valid ? source + std::int64_t(row) * source_stride + chunk * 8 : source;
      copy_async_16(tile + wgmma::swizzled_index(rows, r, chunk * 8), from, valid);
    }
  }
}

template <int kW, int kDv, bool kWgmma, class Bias>
__global__ void __launch_bounds__(ForwardShape<kWgmma>::threads, 2)
    flash_forward_kernel(AttentionDims dims, EncodedAttention in, bf16* out, float* lse,
                         const __grid_constant__ AttentionMaps maps) {
  if constexpr (kWgmma) wgmma::require_wgmma_code();
  using Layout = ForwardLayout<kW, kDv, kWgmma>;
  constexpr int kFragments = ForwardShape<kWgmma>::fragments;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(tile_memory<kWgmma>(shared));
  bf16* k_tiles = q_tile + Layout::q;
  bf16* v_tiles = k_tiles + 2 * Layout::k;
  float* bias_slots = reinterpret_cast<float*>(v_tiles + 2 * Layout::v);

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);  // longest blocks start first
  const int i0 = q_block * kForwardRows;
  const int warp = int(threadIdx.x) / kWarpSize, g = int(threadIdx.x) % kWarpSize / 4, quad = int(threadIdx.x) % 4;
  const int warp_row0 = warp * 16 * kFragments;  // this warp's first row in the tile
  // wgmma: the warpgroup's first row (its 4 warps multiply together).
  const int group_row0 = warp / 4 * 64;
  // Tile row of accumulator element e of fragment f, and column of element e of 8-column block nb.
  auto row_of = [&](int f, int e) { return warp_row0 + 16 * f + g + (e / 2) * 8; };
  auto column_of = [&](int nb, int e) { return nb * 8 + 2 * quad + (e & 1); };
  const HeadBias<Bias, kLinearBias<kW, kWgmma>> bias_of_head(head);
  constexpr bool kOnto = kTableInAccumulators<kWgmma, Bias>;  // the table starts the scores
  const float scale_log2 = in.score.scale * kLog2e, inverse_scale = 1.0f / in.score.scale;

  auto load_keys = [&](int kb, int stage) {
    const int j0 = kb * kTile;
    load_operand_tile_async<kW, kWgmma>(k_tiles + stage * Layout::k, head.k, kW, j0, kTile, T);
    load_operand_tile_async<kDv, kWgmma>(v_tiles + stage * Layout::v, head.v, head.row_stride, j0, kTile, T);
    if (bias_of_head.table)
      stage_bias_async<kForwardRows>(bias_slots + stage * Layout::lag_stage, head.bias, i0 - j0, T);
    copy_async_commit();
  };

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
  // table's heads (wgmma) start from the end of this block's lags where the table is larger:
  // the diagonal for PJ-bias's decaying sectors, the first keys for a table that grows with the
  // lag. Only the wgmma kernels have the linear kind, and only their loop has this order.
  const bool descending =
      bias_of_head.linear ||
      (kWgmma && bias_of_head.table && __ldg(head.bias) >= __ldg(head.bias + key_end - 1));
  bool started = false;  // this warp (wgmma: warpgroup) has seen a key block
  auto body = [&](int kb, int stage) {
    const int j0 = kb * kTile;

    // Tiles wholly above the rows that multiply together (a warp's, or a warpgroup's) add nothing.
    const int first_row = kWgmma ? group_row0 : warp_row0, rows = kWgmma ? 64 : 16 * kFragments;
    if (j0 > i0 + first_row + rows - 1) return;
    const bool first_block = !started;
    started = true;
    const bf16* k_tile = k_tiles + stage * Layout::k;
    const bf16* v_tile = v_tiles + stage * Layout::v;
    // This warp's scores of key block kb in units of 1/scale, the bias added and the causal mask
    // applied.
    const float* slots =
        bias_slots + stage * Layout::lag_stage + run_lead<kWgmma>(bias_run_first(maps, head.h * T + i0 - j0));
    auto scores = [&](float (&s)[kFragments][kScoreBlocks][4]) {
      if constexpr (kWgmma) {
#if defined(POPE_WGMMA)
        if constexpr (kOnto) start_from_bias(s[0], slots, Lane(), inverse_scale);
        wgmma::product_k_major<kW>(s[0], q_tile + group_row0 * 64, kForwardRows, k_tile, kTile, kOnto);
#endif
      } else {
#pragma unroll
        for (int f = 0; f < kFragments; ++f) clear(s[f]);
#pragma unroll
        for (int k0 = 0; k0 < kW; k0 += 16) {
          std::uint32_t a[kFragments][4];
#pragma unroll
          for (int f = 0; f < kFragments; ++f) load_matrix_x4(a[f], a_operand<kW>(q_tile, warp_row0 + 16 * f, k0));
#pragma unroll
          for (int n0 = 0; n0 < kTile; n0 += 16) {
            std::uint32_t b[4];
            load_matrix_x4(b, b_rows<kW>(k_tile, n0, k0));
#pragma unroll
            for (int f = 0; f < kFragments; ++f) {
              mma_bf16(s[f][n0 / 8], a[f], b[0], b[1]);
              mma_bf16(s[f][n0 / 8 + 1], a[f], b[2], b[3]);
            }
          }
        }
      }
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
    // table's visit from its larger end. The mma.sync kernels' table heads (ascending) go
    // straight to the maxima.
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
    if (!first_block && (kWgmma || !bias_of_head.table)) {
      float sums[kFragments][2];
      exponentials(s, sums);
      bool within = true;
#pragma unroll
      for (int f = 0; f < kFragments; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) within &= sums[f][r] <= kMaxSum;  // false for inf and NaN too
      // wgmma: the warpgroup's four warps multiply together, so they agree (named barrier 1 + its
      // index, a reduction over its 128 threads); mma.sync: the warp.
      if constexpr (kWgmma)
        optimistic_held = warpgroup_all(within, 1 + warp / 4);
      else
        optimistic_held = __all_sync(0xffffffffu, within);
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
    if constexpr (kWgmma) {
#if defined(POPE_WGMMA)
      wgmma::accumulate_registers<kScoreSteps>(o[0], p[0], v_tile);
#endif
    } else {
#pragma unroll
      for (int step = 0; step < kScoreSteps; ++step)
#pragma unroll
        for (int n0 = 0; n0 < kDv; n0 += 16) {
          std::uint32_t b[4];
          load_matrix_x4_transposed(b, b_columns<kDv>(v_tile, step * 16, n0));
#pragma unroll
          for (int f = 0; f < kFragments; ++f) {
            mma_bf16(o[f][n0 / 8], p[f][step], b[0], b[1]);
            mma_bf16(o[f][n0 / 8 + 1], p[f][step], b[2], b[3]);
          }
        }
    }
  };
  if constexpr (kWgmma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Thread 0 loads with TMA: the n-th key block's k̃, v and bias slots, and the 128 query rows
    // (two boxes of 64) with the first (tma::for_each_loaded).
    auto block_at = [&](int n) { return descending ? key_blocks - 1 - n : n; };
    auto issue = [&](int n, int stage, std::uint64_t* barrier) {
      const int j0 = block_at(n) * kTile;
      const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes + (n == 0 ? 2 * (kW / 64) * kPanelBytes : 0) +
                                  (bias_of_head.table ? tma::vector_box_bytes(Layout::lag_slots) : 0);
      tma::arrive_expecting(barrier, bytes);
      if (n == 0)
        for (int half = 0; half < 2; ++half)
          load_panels<kW>(q_tile + half * kTile * 64, &maps.q, 0, i0 + half * kTile, head.bh, barrier, kForwardRows);
      load_panels<kW>(k_tiles + stage * Layout::k, &maps.k, 0, j0, head.bh, barrier);
      load_panels<kDv>(v_tiles + stage * Layout::v, &maps.v, int(2 * head.channels) + head.h * dims.head_dim, j0,
                       head.b, barrier);
      if (bias_of_head.table)
        load_bias_slots<kForwardRows>(bias_slots + stage * Layout::lag_stage, maps, head.h * T + i0 - j0, barrier);
    };
    tma::for_each_loaded(0, key_blocks, issue, [&](int n, int stage) { body(block_at(n), stage); });
#endif
  } else {
    load_operand_tile_async<kW, kWgmma>(q_tile, head.q, kW, i0, kForwardRows, T);
    load_keys(0, 0);  // one group with the queries
    for_each_double_buffered<kWgmma>(0, key_blocks, load_keys, body);
  }

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

// ---------------------------------------------------------------- key gradients (dk̃, dv, Ĝ)

// Columns of dq̃ summed at once in the non-deterministic mode (bounds its accumulators, and with
// wgmma its shared staging tile).
constexpr int kDqChunk = 64;

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

// wgmma (kWgmma, sm_90a, d = 64): the same warps form one warpgroup; the tiles are
// swizzled (wgmma.cuh) and the five products run on wgmma — Sᵀ and dPᵀ with both operands in
// shared memory, dv and dk̃ with Pᵀ, dSᵀ from registers, dq̃ (atomic mode) from dS in shared memory.
template <int kW, int kDv, bool kAtomicDq, bool kWgmma>
struct KeyGradLayout {
  static constexpr int k = kTile * (kWgmma ? kW : padded_stride(kW));  // bf16 elements
  static constexpr int v = kTile * (kWgmma ? kDv : padded_stride(kDv));
  static constexpr int q = kTile * (kWgmma ? kW : padded_stride(kW));
  static constexpr int dout = kTile * (kWgmma ? kDv : padded_stride(kDv));
  // dS, key-major, for dq̃
  static constexpr int ds = kAtomicDq ? kTile * (kWgmma ? kTile : padded_stride(kTile)) : 0;
  static constexpr int tiles = k + v + 2 * q + 2 * dout + ds;
  // wgmma, atomic mode: floats after the tiles (1024-byte aligned) staging a chunk of dq̃ for
  // tma::reduce_add_tile
  static constexpr int dq_stage = kAtomicDq && kWgmma ? kTile * kDqChunk : 0;
  // floats after the tiles: lse and D of two stages, bias slots of two stages, then (bias_grad)
  // the diagonal parts of the lag sums
  static constexpr int row_stage = tma::vector_slots(kTile), lag_stage = tma::vector_slots(kLagSlots);
  static constexpr int statistics = 2 * row_stage + 2 * row_stage + 2 * lag_stage;
  static constexpr std::size_t bytes(bool bias_grad) {
    return std::size_t(tiles) * sizeof(bf16) +
           (dq_stage + statistics + (bias_grad ? kLagSlots * kDiagonalStride : 0)) * sizeof(float) +
           (kWgmma ? 1024 : 0);  // tile_memory's alignment
  }
};


// grads.dq[row t] += pair (values in columns col, col + 1), atomically.
__device__ inline void atomic_add_pair(float* address, float first, float second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(address), make_float2(first, second));
#else
  atomicAdd(address, first);
  atomicAdd(address + 1, second);
#endif
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

template <int kW, int kDv, bool kAtomicDq, bool kWgmma>
__global__ void __launch_bounds__(kThreads, key_grad_ctas_per_sm<kW, kAtomicDq>())
    flash_key_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads,
                          const __grid_constant__ AttentionMaps maps) {
  if constexpr (kWgmma) wgmma::require_wgmma_code();
  using Layout = KeyGradLayout<kW, kDv, kAtomicDq, kWgmma>;
  using Bias = BiasChoice<kW == 64 ? BiasDispatch::copies : BiasDispatch::runtime>;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(tile_memory<kWgmma>(shared));
  bf16* v_tile = k_tile + Layout::k;
  bf16* q_tiles = v_tile + Layout::v;
  bf16* dout_tiles = q_tiles + 2 * Layout::q;
  bf16* ds_tile = dout_tiles + 2 * Layout::dout;  // kAtomicDq only
  float* dq_stage = reinterpret_cast<float*>(k_tile + Layout::tiles);  // kAtomicDq with kWgmma only
  float* lse_slots = dq_stage + Layout::dq_stage;
  float* row_dot_slots = lse_slots + 2 * Layout::row_stage;
  float* bias_slots = row_dot_slots + 2 * Layout::row_stage;
  float* diagonal_parts = bias_slots + 2 * Layout::lag_stage;

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int key_block = int(blockIdx.y);  // low key blocks see the most queries and start first
  const int j0 = key_block * kTile;
  const int query_blocks = (T + kTile - 1) / kTile;
  const Lane lane;
  const HeadBias<Bias, kLinearBias<kW, kWgmma>> bias_of_head(head);
  const bool sums_lags = grads.bias_grad != nullptr;
  const float scale_log2 = in.score.scale * kLog2e;
  const bf16* dout = grads.dout + head.activation_offset(0, d);
  const float* lse = grads.lse + head.statistic_index(0);
  const float* row_dot = grads.row_dot + head.statistic_index(0);

  auto load_queries = [&](int qb, int stage) {
    const int i0 = qb * kTile;
    load_operand_tile_async<kW, kWgmma>(q_tiles + stage * Layout::q, head.q, kW, i0, kTile, T);
    load_operand_tile_async<kDv, kWgmma>(dout_tiles + stage * Layout::dout, dout, head.channels, i0, kTile, T);
    stage_rows_async(lse_slots + stage * Layout::row_stage, lse, i0, T);
    stage_rows_async(row_dot_slots + stage * Layout::row_stage, row_dot, i0, T);
    if (bias_of_head.table) stage_bias_async<kTile>(bias_slots + stage * Layout::lag_stage, head.bias, i0 - j0, T);
    copy_async_commit();
  };

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
    for (int x = int(threadIdx.x); x < kLagSlots * kDiagonalStride; x += kThreads) diagonal_parts[x] = 0.0f;

  auto body = [&](int qb, int stage) {
    const int step = qb - key_block, i0 = qb * kTile;

    const bf16* q_tile = q_tiles + stage * Layout::q;
    const bf16* dout_tile = dout_tiles + stage * Layout::dout;
    const int row0 = int(head.statistic_index(i0));
    const float* lse_tile = lse_slots + stage * Layout::row_stage + run_lead<kWgmma>(row0 + maps.lse_shift);
    const float* row_dot_tile =
        row_dot_slots + stage * Layout::row_stage + run_lead<kWgmma>(row0 + maps.row_dot_shift);
    const float* slots =
        bias_slots + stage * Layout::lag_stage + run_lead<kWgmma>(bias_run_first(maps, head.h * T + i0 - j0));
    // Sᵀ (rows: this warp's 16 keys, columns: 64 queries) and dPᵀ = V · doutᵀ.
    float p[kScoreBlocks][4], ds[kScoreBlocks][4];
    if constexpr (kWgmma) {
#if defined(POPE_WGMMA)
      wgmma::begin();  // both products in one batch
      wgmma::issue_k_major<kW>(p, k_tile, kTile, q_tile, kTile);
      wgmma::issue_k_major<kDv>(ds, v_tile, kTile, dout_tile, kTile);
      wgmma::complete(p, ds);
#endif
    } else {
      clear(p);
      clear(ds);
      mma_a_tile_b_rows<kW, kTile, kW, kW>(p, k_tile, lane.warp * 16, q_tile);
      mma_a_tile_b_rows<kDv, kTile, kDv, kDv>(ds, v_tile, lane.warp * 16, dout_tile);
    }
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
      write_diagonal_parts(ds, lane, diagonal_parts);
      __syncthreads();  // (the loop's barrier after the tile orders these reads before the next writes)
      const int i = int(threadIdx.x);
      if (i < kTile) {
        if (step > 0) {  // lag 64·(step − 1) + i is complete: its part from this tile is diagonal i − 64
          const int lag = kTile * (step - 1) + i;
          const float total = carried_lag_sum + (i >= 1 ? diagonal_sum(diagonal_parts, i - 1) : 0.0f);
          if (lag < lags_owned) partial_row[lag] = total;
        }
        carried_lag_sum = diagonal_sum(diagonal_parts, i + kTile - 1);
      }
    };
    std::uint32_t a[kScoreSteps][4];
    accumulators_to_operand(a, p);
    if constexpr (kWgmma) {
#if defined(POPE_WGMMA)
      // One batch: dv += Pᵀ · dout and dk̃ += dSᵀ · q̃ (scale at the end), one 64-column panel of
      // q̃ at a time; both A fragments exist before it starts.
      std::uint32_t a_ds[kScoreSteps][4];
      accumulators_to_operand(a_ds, ds);
      wgmma::begin();
      wgmma::issue_registers<kScoreSteps>(dv, a, dout_tile);
#pragma unroll
      for (int panel = 0; panel < kW / 64; ++panel)
        wgmma::issue_registers<kScoreSteps>(reinterpret_cast<float(&)[8][4]>(dk[8 * panel]), a_ds,
                                            q_tile + panel * kTile * 64);
      if (sums_lags && kTile * (step - 1) < lags_owned) add_lag_sums();  // while the tensor cores run
      wgmma::complete(dv, dk, a, a_ds);
#endif
    } else {
      // (before the products: after them the d = 128 kernel spilled 40 bytes)
      if (sums_lags && kTile * (step - 1) < lags_owned) add_lag_sums();
      mma_a_registers_b_columns<kScoreSteps, kDv, kDv>(dv, a, dout_tile);  // dv += Pᵀ · dout
      accumulators_to_operand(a, ds);
      mma_a_registers_b_columns<kScoreSteps, kW, kW>(dk, a, q_tile);  // dk̃ += dSᵀ · q̃ (scale at the end)
    }

    if constexpr (kAtomicDq) {
      // dq̃ of this tile's 64 queries from its 64 keys: dS (rounded to bf16 as for dk̃) into
      // shared memory key-major, then warp w takes queries 16w..16w+15 over all 64 keys and adds
      // scale · dS·k̃ to dq̃ (zeroed before the launch; every key block adds its part, in an order
      // that may change from run to run). wgmma: a chunk of 64 columns at a time goes through
      // the staging tile, and thread 0 adds it to dq̃ with TMA reduce-adds (one request per 128
      // bytes instead of one per 8 from every thread); else atomics from registers.
#pragma unroll
      for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = lane.row(2 * r), query = lane.column(nb, 0);
          const int at = kWgmma ? wgmma::swizzled_index(kTile, key, query) : key * padded_stride(kTile) + query;
          *reinterpret_cast<std::uint32_t*>(ds_tile + at) = pack_bf16(ds[nb][2 * r], ds[nb][2 * r + 1]);
        }
#if defined(POPE_WGMMA)
      if constexpr (kWgmma) {
        wgmma::fence_shared_for_async();
        if (threadIdx.x == 0) tma::wait_bulk_reads();  // the last tile's dq̃ chunk has left the staging tile
      }
#endif
      __syncthreads();
      const int query0 = lane.warp * 16;
#pragma unroll
      for (int c0 = 0; c0 < kW; c0 += kDqChunk) {
        float dq[kDqChunk / 8][4];
        if constexpr (kWgmma) {  // dS as the M-major A (rows: keys), k̃ as the N-major B
#if defined(POPE_WGMMA)
          static_assert(kDqChunk == 64, "a chunk is one panel of k̃");
          wgmma::product_mn_major<kTile>(dq, ds_tile, k_tile + c0 / 64 * kTile * 64);
          if (c0 > 0) {  // the previous chunk has left the staging tile
            if (threadIdx.x == 0) tma::wait_bulk_reads();
            __syncthreads();
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nb = 0; nb < kDqChunk / 8; ++nb)
              *reinterpret_cast<float2*>(dq_stage + tma::f32_swizzled_index(kTile, query0 + lane.g + 8 * r,
                                                                            lane.column(nb, 0))) =
                  make_float2(dq[nb][2 * r] * in.score.scale, dq[nb][2 * r + 1] * in.score.scale);
          wgmma::fence_shared_for_async();
          __syncthreads();
          if (threadIdx.x == 0) {  // rows past T lie outside the map and are skipped
#pragma unroll
            for (int panel = 0; panel < kDqChunk / tma::kF32BoxColumns; ++panel)
              tma::reduce_add_tile(&maps.dq, dq_stage + panel * kTile * tma::kF32BoxColumns,
                                   c0 + panel * tma::kF32BoxColumns, i0, head.bh);
            tma::commit_bulk_group();
          }
#endif
        } else {
          clear(dq);
          mma_a_columns_b_columns<kTile, kDqChunk, kTile, kW>(dq, ds_tile, query0, k_tile + c0);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int t = i0 + query0 + lane.g + 8 * r;
            if (t >= T) continue;
            float* dq_row = grads.dq + head.statistic_index(t) * kW + c0;
#pragma unroll
            for (int nb = 0; nb < kDqChunk / 8; ++nb)
              atomic_add_pair(dq_row + lane.column(nb, 0), dq[nb][2 * r] * in.score.scale,
                              dq[nb][2 * r + 1] * in.score.scale);
          }
        }
      }
    }
  };

  if constexpr (kWgmma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Thread 0 loads every tile with TMA: query block qb (q̃, dout, lse, D, bias slots), and k̃
    // and v with the first block (tma::for_each_loaded).
    auto issue = [&](int qb, int stage, std::uint64_t* barrier) {
      const int i0 = qb * kTile;
      const bool first = qb == key_block;
      const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes * (first ? 2 : 1) +
                                  2 * tma::vector_box_bytes(kTile) +
                                  (bias_of_head.table ? tma::vector_box_bytes(kLagSlots) : 0);
      tma::arrive_expecting(barrier, bytes);
      if (first) {
        load_panels<kW>(k_tile, &maps.k, 0, j0, head.bh, barrier);
        load_panels<kDv>(v_tile, &maps.v, int(2 * head.channels) + head.h * d, j0, head.b, barrier);
      }
      load_panels<kW>(q_tiles + stage * Layout::q, &maps.q, 0, i0, head.bh, barrier);
      load_panels<kDv>(dout_tiles + stage * Layout::dout, &maps.dout, head.h * d, i0, head.b, barrier);
      // Rows past T read the next head's lse and D (or zeros past the end): their P is masked to 0.
      const int row0 = int(head.statistic_index(i0));
      tma::load_vector(lse_slots + stage * Layout::row_stage, &maps.lse, row0 + maps.lse_shift, barrier);
      tma::load_vector(row_dot_slots + stage * Layout::row_stage, &maps.row_dot, row0 + maps.row_dot_shift, barrier);
      if (bias_of_head.table)
        load_bias_slots(bias_slots + stage * Layout::lag_stage, maps, head.h * T + i0 - j0, barrier);
    };
    tma::for_each_loaded(key_block, query_blocks, issue, body);
    if (kAtomicDq && threadIdx.x == 0) tma::wait_bulk_writes();  // dq̃'s last chunk read and added
#endif
  } else {
    load_operand_tile_async<kW, kWgmma>(k_tile, head.k, kW, j0, kTile, T);
    load_operand_tile_async<kDv, kWgmma>(v_tile, head.v, head.row_stride, j0, kTile, T);
    load_queries(key_block, 0);
    for_each_double_buffered<kWgmma>(key_block, query_blocks, load_queries, body);
  }
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

// ---------------------------------------------------------------- query gradients (dq̃)

template <int kW, int kDv, bool kWgmma>
struct QueryGradLayout {
  static constexpr int q = kTile * (kWgmma ? kW : padded_stride(kW));  // bf16 elements
  static constexpr int dout = kTile * (kWgmma ? kDv : padded_stride(kDv));
  static constexpr int k = kTile * (kWgmma ? kW : padded_stride(kW));
  static constexpr int v = kTile * (kWgmma ? kDv : padded_stride(kDv));
  static constexpr int lag_stage = tma::vector_slots(kLagSlots);
  static constexpr std::size_t bytes = std::size_t(q + dout + 2 * k + 2 * v) * sizeof(bf16) +
                                       2 * lag_stage * sizeof(float) + (kWgmma ? 1024 : 0);  // tile_memory's alignment
};

// wgmma (kWgmma, sm_90a, d = 64): one warpgroup; S and dP with both operands in shared memory,
// dq̃ from dS in registers and k̃ as the N-major operand.
template <int kW, int kDv, bool kWgmma, class Bias>
__global__ void __launch_bounds__(kThreads, query_grad_ctas_per_sm<kW>())
    flash_query_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads,
                            const __grid_constant__ AttentionMaps maps) {
  if constexpr (kWgmma) wgmma::require_wgmma_code();
  using Layout = QueryGradLayout<kW, kDv, kWgmma>;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(tile_memory<kWgmma>(shared));
  bf16* dout_tile = q_tile + Layout::q;
  bf16* k_tiles = dout_tile + Layout::dout;
  bf16* v_tiles = k_tiles + 2 * Layout::k;
  float* bias_slots = reinterpret_cast<float*>(v_tiles + 2 * Layout::v);

  const AttentionHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);
  const int i0 = q_block * kTile;
  const Lane lane;
  const HeadBias<Bias, kLinearBias<kW, kWgmma>> bias_of_head(head);
  constexpr bool kOnto = kTableInAccumulators<kWgmma, Bias>;  // the table starts the scores
  const float scale_log2 = in.score.scale * kLog2e, inverse_scale = 1.0f / in.score.scale;

  auto load_keys = [&](int kb, int stage) {
    const int j0 = kb * kTile;
    load_operand_tile_async<kW, kWgmma>(k_tiles + stage * Layout::k, head.k, kW, j0, kTile, T);
    load_operand_tile_async<kDv, kWgmma>(v_tiles + stage * Layout::v, head.v, head.row_stride, j0, kTile, T);
    if (bias_of_head.table) stage_bias_async<kTile>(bias_slots + stage * Layout::lag_stage, head.bias, i0 - j0, T);
    copy_async_commit();
  };

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

    const bf16* k_tile = k_tiles + stage * Layout::k;
    const bf16* v_tile = v_tiles + stage * Layout::v;
    const float* slots =
        bias_slots + stage * Layout::lag_stage + run_lead<kWgmma>(bias_run_first(maps, head.h * T + i0 - kb * kTile));
    float p[kScoreBlocks][4], ds[kScoreBlocks][4];
    if constexpr (kWgmma) {
#if defined(POPE_WGMMA)
      if constexpr (kOnto) start_from_bias(p, slots, lane, inverse_scale);
      wgmma::begin();  // both products in one batch
      wgmma::issue_k_major<kW>(p, q_tile, kTile, k_tile, kTile, kOnto);  // S (+ b/scale) = q̃ · k̃ᵀ
      wgmma::issue_k_major<kDv>(ds, dout_tile, kTile, v_tile, kTile);  // dP = dout · vᵀ
      wgmma::complete(p, ds);
#endif
    } else {
      clear(p);
      clear(ds);
      mma_a_tile_b_rows<kW, kTile, kW, kW>(p, q_tile, lane.warp * 16, k_tile);        // S = q̃ · k̃ᵀ
      mma_a_tile_b_rows<kDv, kTile, kDv, kDv>(ds, dout_tile, lane.warp * 16, v_tile);  // dP = dout · vᵀ
    }
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
    std::uint32_t a[kScoreSteps][4];
    accumulators_to_operand(a, ds);
    if constexpr (kWgmma) {  // dq̃ += dS · k̃ (scale at the end), one 64-column panel of k̃ at a time, one batch
#if defined(POPE_WGMMA)
      wgmma::begin();
#pragma unroll
      for (int panel = 0; panel < kW / 64; ++panel)
        wgmma::issue_registers<kScoreSteps>(reinterpret_cast<float(&)[8][4]>(dq[8 * panel]), a,
                                            k_tile + panel * kTile * 64);
      wgmma::complete(dq, a);
#endif
    } else {
      mma_a_registers_b_columns<kScoreSteps, kW, kW>(dq, a, k_tile);
    }
  };
  if constexpr (kWgmma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Thread 0 loads with TMA: key block kb's k̃, v and bias slots, and q̃, dout with the first
    // (tma::for_each_loaded).
    auto issue = [&](int kb, int stage, std::uint64_t* barrier) {
      const int j0 = kb * kTile;
      const std::uint32_t bytes = (kW / 64 + kDv / 64) * kPanelBytes * (kb == 0 ? 2 : 1) +
                                  (bias_of_head.table ? tma::vector_box_bytes(kLagSlots) : 0);
      tma::arrive_expecting(barrier, bytes);
      if (kb == 0) {
        load_panels<kW>(q_tile, &maps.q, 0, i0, head.bh, barrier);
        load_panels<kDv>(dout_tile, &maps.dout, head.h * d, i0, head.b, barrier);
      }
      load_panels<kW>(k_tiles + stage * Layout::k, &maps.k, 0, j0, head.bh, barrier);
      load_panels<kDv>(v_tiles + stage * Layout::v, &maps.v, int(2 * head.channels) + head.h * d, j0, head.b, barrier);
      if (bias_of_head.table)
        load_bias_slots(bias_slots + stage * Layout::lag_stage, maps, head.h * T + i0 - j0, barrier);
    };
    tma::for_each_loaded(0, key_blocks, issue, body);
#endif
  } else {
    load_operand_tile_async<kW, kWgmma>(q_tile, head.q, kW, i0, kTile, T);
    load_operand_tile_async<kDv, kWgmma>(dout_tile, grads.dout + head.activation_offset(0, d), head.channels, i0,
                                         kTile, T);
    load_keys(0, 0);
    for_each_double_buffered<kWgmma>(0, key_blocks, load_keys, body);
  }

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

// ---------------------------------------------------------------- dispatch

int blocks_of(int seq_len) { return (seq_len + kTile - 1) / kTile; }

dim3 tile_grid(const AttentionDims& dims, int rows_per_block = kTile) {
  return dim3(unsigned(dims.batch * dims.n_head), unsigned((dims.seq_len + rows_per_block - 1) / rows_per_block));
}

// launch(W, d) as integral constants for the entry of kFlashWidths that matches the call.
template <class Launch, std::size_t... I>
cudaError_t with_widths_of(const AttentionDims& dims, Launch& launch, std::index_sequence<I...>) {
  cudaError_t status = cudaErrorInvalidValue;
  const bool found = ((dims.qk_width == kFlashWidths[I].qk_width && dims.head_dim == kFlashWidths[I].head_dim &&
                       (status = launch(std::integral_constant<int, kFlashWidths[I].qk_width>{},
                                        std::integral_constant<int, kFlashWidths[I].head_dim>{}),
                        true)) ||
                      ...);
  return found ? status : cudaErrorInvalidValue;
}

// Calls launch(std::integral_constant<int, W>, std::integral_constant<int, Dv>) for the
// instantiated (qk_width, head_dim) pair.
template <class Launch>
cudaError_t with_widths(const AttentionDims& dims, Launch&& launch) {
  return with_widths_of(dims, launch, std::make_index_sequence<std::size(kFlashWidths)>{});
}

// Calls launch(BiasChoice<…>{}) with the bias choice of the call's forward and query kernels of
// q/k width kW: a kernel per policy at W = 64, the runtime table flag at W = 128.
template <int kW, bool kWgmma, class Launch>
cudaError_t with_bias_kind(const ScoreParams& score, Launch&& launch) {
  using D = BiasDispatch;
  if constexpr (kW != 64) {
    return launch(BiasChoice<D::runtime>{});
  } else {
    if (score.bias == nullptr) return launch(BiasChoice<D::per_kernel, ScoreBias::none>{});
    if constexpr (kLinearBias<kW, kWgmma>)
      if (score.bias_slopes != nullptr) return launch(BiasChoice<D::per_kernel, ScoreBias::linear>{});
    return launch(BiasChoice<D::per_kernel, ScoreBias::table>{});
  }
}

// Whether the kernels for (W, d) run on wgmma: in sm_90a-only builds (POPE_CUDA_WGMMA, set by
// CMake), for the widths the wgmma kernels take (d = 64: v and dout one swizzled panel).
constexpr bool use_wgmma(int qk_width, int head_dim) {
#ifdef POPE_CUDA_WGMMA
  return head_dim == 64 && (qk_width == 64 || qk_width == 128);
#else
  static_cast<void>(qk_width);
  static_cast<void>(head_dim);
  return false;
#endif
}

// The tensor maps of one call (AttentionMaps), lse, D and dq̃ only with `grads`;
// cudaErrorInvalidValue where a tensor does not meet TMA's alignment (flash_attention_supports
// checks the bf16 bases, the atomic-dq mode needs a 16-byte aligned dq̃).
cudaError_t encode_attention_maps(AttentionMaps& maps, const AttentionDims& dims, const EncodedAttention& in,
                                  const AttentionGradients* grads) {
  const std::int64_t T = dims.seq_len, W = dims.qk_width, d = dims.head_dim, heads = std::int64_t(dims.batch) * dims.n_head;
  const std::int64_t C = std::int64_t(dims.n_head) * d;
  cudaError_t status = cudaSuccess;
  auto keep = [&](cudaError_t result) {
    if (status == cudaSuccess) status = result;
  };
  keep(tma::encode_bf16_tiles(&maps.q, in.q, W, T, heads, W, T * W, kTile));
  keep(tma::encode_bf16_tiles(&maps.k, in.k, W, T, heads, W, T * W, kTile));
  keep(tma::encode_bf16_tiles(&maps.v, in.qkv, 3 * C, T, dims.batch, 3 * C, T * 3 * C, kTile));
  if (in.score.bias != nullptr) {
    int same_shift = 0;  // one base, so the same shift as bias_tile's
    keep(tma::encode_f32_vector(&maps.bias_tile, in.score.bias, dims.n_head * T, kLagSlots, &maps.bias_shift));
    keep(tma::encode_f32_vector(&maps.bias_rows, in.score.bias, dims.n_head * T, kForwardRows + kTile, &same_shift));
  }
  if (grads != nullptr) {
    keep(tma::encode_bf16_tiles(&maps.dout, grads->dout, C, T, dims.batch, C, T * C, kTile));
    keep(tma::encode_f32_vector(&maps.lse, grads->lse, heads * T, kTile, &maps.lse_shift));
    keep(tma::encode_f32_vector(&maps.row_dot, grads->row_dot, heads * T, kTile, &maps.row_dot_shift));
    if (!grads->deterministic) keep(tma::encode_f32_tiles(&maps.dq, grads->dq, W, T, heads, W, T * W, kTile));
  }
  return status;
}

}  // namespace

bool flash_attention_supports(const AttentionDims& dims, const EncodedAttention& in) {
  bool widths = false;
  for (const FlashWidths& w : kFlashWidths) widths = widths || (dims.qk_width == w.qk_width && dims.head_dim == w.head_dim);
  // in.score.scale > 0: the forward takes row maxima of unscaled scores. Grid y: a head's row
  // blocks, and the heads in the reduction of Ĝ's partial rows.
  return widths && in.score.scale > 0.0f && dims.batch > 0 && dims.n_head > 0 && dims.seq_len > 0 &&
         blocks_of(dims.seq_len) <= 65535 && dims.n_head <= 65535 &&
         std::int64_t(dims.batch) * dims.n_head <= 0x7fffffff && aligned16(in.q) && aligned16(in.k) &&
         aligned16(in.qkv);
}

bool flash_attention_fuses_qk_backward(const AttentionDims& dims, const EncodedAttention& in,
                                       const QkTransformParams& transform, bool deterministic) {
  const bool transform_fits =
      transform.kind == QkTransformKind::identity ||
      (transform.kind == QkTransformKind::rope && 2 * transform.rotary_pairs == dims.head_dim && transform.phases != nullptr &&
       (transform.scale_rates == nullptr || transform.key_phases != nullptr));
  return flash_attention_supports(dims, in) && deterministic && dims.qk_width == dims.head_dim && transform_fits;
}

bool flash_attention_rounds_encoded_gradients(const AttentionDims& dims, bool deterministic) {
  return deterministic && dims.qk_width > dims.head_dim;
}

std::size_t flash_bias_grad_partial_floats(const AttentionDims& dims, int lags) {
  return std::size_t(dims.batch) * dims.n_head * blocks_of(dims.seq_len) * std::size_t(gradient_lags(dims, lags));
}

cudaError_t flash_attention_forward(const AttentionDims& dims, const EncodedAttention& in, __nv_bfloat16* out,
                                    float* lse, cudaStream_t stream) {
  if (!flash_attention_supports(dims, in)) return cudaErrorInvalidValue;
  return with_widths(dims, [&](auto w, auto dv) {
    constexpr int kW = decltype(w)::value, kDv = decltype(dv)::value;
    constexpr bool kWgmma = use_wgmma(kW, kDv);
    AttentionMaps maps{};  // the wgmma kernels load with TMA
    if constexpr (kWgmma) {
      const cudaError_t encoded = encode_attention_maps(maps, dims, in, nullptr);
      if (encoded != cudaSuccess) return encoded;
    }
    return with_bias_kind<kW, kWgmma>(in.score, [&](auto bias) {
      return launch_with_shared<flash_forward_kernel<kW, kDv, kWgmma, decltype(bias)>>(
          tile_grid(dims, kForwardRows), ForwardShape<kWgmma>::threads, ForwardLayout<kW, kDv, kWgmma>::bytes, stream,
          dims, in, out, lse, maps);
    });
  });
}

cudaError_t flash_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                     const AttentionGradients& grads, cudaStream_t stream) {
  if (!flash_attention_supports(dims, in) || !aligned16(grads.dout)) return cudaErrorInvalidValue;
  const bool bias_grad = grads.bias_grad != nullptr;
  if (bias_grad && (in.score.bias == nullptr || grads.bias_grad_partials == nullptr)) return cudaErrorInvalidValue;
  const bool rounded = grads.dq_bf16 != nullptr || grads.dk_bf16 != nullptr;
  if (rounded && (grads.dq_bf16 == nullptr || grads.dk_bf16 == nullptr || grads.qk_backward_fused ||
                  !flash_attention_rounds_encoded_gradients(dims, grads.deterministic)))
    return cudaErrorInvalidValue;
  if ((grads.bias_grad_stream == nullptr) != (grads.keys_done == nullptr)) return cudaErrorInvalidValue;
  // Ĝ from the key kernel's partial rows, on grads.bias_grad_stream (after the key kernel,
  // beside the query kernel) when the caller gave one, else after everything on `stream`.
  auto reduce_bias_grad = [&](cudaStream_t on) {
    const int lags = gradient_lags(dims, grads.bias_grad_lags);
    const dim3 strips(unsigned((lags + kWarpSize - 1) / kWarpSize), unsigned(dims.n_head));
    bias_grad_reduce_kernel<<<strips, dim3(kWarpSize, kLagSumSlices), 0, on>>>(
        dims, grads.bias_grad_lags, FastDivisor(dims.batch), grads.bias_grad_partials, grads.bias_grad);
    return cudaGetLastError();
  };
  const bool reduce_beside = bias_grad && grads.bias_grad_stream != nullptr;
  auto after_keys = [&]() {
    if (!reduce_beside) return cudaSuccess;
    cudaError_t forked = cudaEventRecord(grads.keys_done, stream);
    if (forked == cudaSuccess) forked = cudaStreamWaitEvent(grads.bias_grad_stream, grads.keys_done, 0);
    return forked == cudaSuccess ? reduce_bias_grad(grads.bias_grad_stream) : forked;
  };
  cudaError_t status = attention_row_dot(dims, grads, stream);
  if (status != cudaSuccess) return status;
  status = with_widths(dims, [&](auto w, auto dv) {
    constexpr int kW = decltype(w)::value, kDv = decltype(dv)::value;
    constexpr bool kWgmma = use_wgmma(kW, kDv);
    AttentionMaps maps{};  // the wgmma kernels load with TMA
    if constexpr (kWgmma) {
      const cudaError_t encoded = encode_attention_maps(maps, dims, in, &grads);
      if (encoded != cudaSuccess) return encoded;
    }
    if (!grads.deterministic) {  // dq̃ summed by atomic adds in the key kernel
      const std::size_t dq_bytes = std::size_t(dims.batch) * dims.n_head * dims.seq_len * kW * sizeof(float);
      const cudaError_t zeroed = cudaMemsetAsync(grads.dq, 0, dq_bytes, stream);
      if (zeroed != cudaSuccess) return zeroed;
      const cudaError_t keys = launch_with_shared<flash_key_grad_kernel<kW, kDv, true, kWgmma>>(
          tile_grid(dims), kThreads, KeyGradLayout<kW, kDv, true, kWgmma>::bytes(bias_grad), stream, dims, in, grads,
          maps);
      return keys == cudaSuccess ? after_keys() : keys;
    }
    cudaError_t keys = launch_with_shared<flash_key_grad_kernel<kW, kDv, false, kWgmma>>(
        tile_grid(dims), kThreads, KeyGradLayout<kW, kDv, false, kWgmma>::bytes(bias_grad), stream, dims, in, grads,
        maps);
    if (keys == cudaSuccess) keys = after_keys();
    if (keys != cudaSuccess) return keys;
    return with_bias_kind<kW, kWgmma>(in.score, [&](auto bias) {
      return launch_with_shared<flash_query_grad_kernel<kW, kDv, kWgmma, decltype(bias)>>(
          tile_grid(dims), kThreads, QueryGradLayout<kW, kDv, kWgmma>::bytes, stream, dims, in, grads, maps);
    });
  });
  if (status != cudaSuccess || !bias_grad || reduce_beside) return status;
  return reduce_bias_grad(stream);
}

}  // namespace pope::kernels
