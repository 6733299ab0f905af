// Fused causal attention on tensor cores (see flash_attention.cuh and mma_tiles.cuh).
//   forward:    CTA = (b·H + h, 128 query rows), 4 warps × 32 rows; streams 64-key tiles of k̃
//               and v up to the diagonal through double-buffered shared memory (cp.async).
//   key grad:   CTA = (b·H + h, 64 keys); streams 64-query tiles of q̃, dout, lse and D from the
//               diagonal to the end, sums dk̃ and dv in registers; with a bias gradient it also
//               sums dS along lags into its own partial row (no atomics).
//   query grad: CTA = (b·H + h, 64 query rows), 4 warps × 16 rows; streams key tiles again and
//               sums dq̃.
// Key tiles are 64 rows; a 128-row query block meets the diagonal in its last two key tiles,
// which alone need the causal mask. Tiles above the diagonal are never visited. Rows past T are zero-filled on load and never stored.
// Logits live in log2 units: x = (<q̃, k̃>·scale + b_h(t − s))·log2 e, softmax via exp2f.
#include <cstdint>
#include <type_traits>

#include "attention/flash_attention.cuh"
#include "attention/kernel_launch.cuh"
#include "attention/mma_tiles.cuh"

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
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;

// Pointers of one (batch, head).
struct FlashHead {
  int b, h, bh, seq_len;
  const bf16* q;  // q̃ row t at t·qk_stride
  const bf16* k;
  const bf16* v;            // v row s at s·row_stride
  int qk_stride;            // W, or 3C when q̃, k̃ are read from qkv in place
  std::int64_t row_stride;  // 3C
  std::int64_t channels;    // C
  const float* bias;        // b_h(Δ) [T], or null

  __device__ FlashHead(const AttentionDims& dims, const EncodedAttention& in, int batch_head) {
    bh = batch_head;
    b = bh / dims.n_head;
    h = bh % dims.n_head;
    seq_len = dims.seq_len;
    channels = std::int64_t(dims.n_head) * dims.head_dim;
    row_stride = 3 * channels;
    const bf16* head_columns = in.qkv + std::int64_t(b) * dims.seq_len * row_stride + std::int64_t(h) * dims.head_dim;
    if (in.qk_in_qkv) {
      q = head_columns;
      k = head_columns + channels;
      qk_stride = int(row_stride);
    } else {
      const std::int64_t rows_before = std::int64_t(bh) * dims.seq_len;
      q = in.q + rows_before * dims.qk_width;
      k = in.k + rows_before * dims.qk_width;
      qk_stride = dims.qk_width;
    }
    v = head_columns + 2 * channels;
    bias = in.score.bias ? in.score.bias + std::int64_t(h) * dims.seq_len : nullptr;
  }
  // Row t of this head in a [B·T, C] activation (out, dout), and in [B, H, T] statistics.
  __device__ std::int64_t activation_offset(int t, int head_dim) const {
    return (std::int64_t(b) * seq_len + t) * channels + std::int64_t(h) * head_dim;
  }
  __device__ std::int64_t statistic_index(int t) const { return std::int64_t(bh) * seq_len + t; }
};

// A CTA of kWarps warps over a block of 16·kFragments·kWarps rows, warp w owning the kFragments
// 16-row mma fragments from tile row first = 16·kFragments·w: lane coordinates, the tile
// row/column of accumulator element e of fragment f and 8-column block nb, and where the
// causal mask meets a 64-key tile for a block starting at row i0 (block rows are queries).
template <int kFragments>
struct WarpRows {
  static constexpr int kRows = kWarps * 16 * kFragments;  // rows of the block
  int warp, g, q, first;
  __device__ WarpRows()
      : warp(int(threadIdx.x) / kWarpSize),
        g(int(threadIdx.x) % kWarpSize / 4),
        q(int(threadIdx.x) % 4),
        first(warp * 16 * kFragments) {}
  __device__ int row(int f, int e) const { return first + 16 * f + g + (e / 2) * 8; }
  __device__ int column(int nb, int e) const { return nb * 8 + 2 * q + (e & 1); }
  // Some key of tile j0 is visible to some row of this warp.
  __device__ bool sees(int i0, int j0) const { return j0 <= i0 + first + 16 * kFragments - 1; }
  // Some key of tile j0 lies past some row of this warp.
  __device__ bool needs_mask(int i0, int j0) const { return j0 + kTile - 1 > i0 + first; }
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

// Sums of the four lanes of a quad (the lanes that share fragment rows).
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ---------------------------------------------------------------- forward

// 128 query rows per CTA, 4 warps × 32 rows (two 16-row fragments): every B fragment of k̃ and
// v loaded from shared memory feeds two mma, half the shared-memory traffic per product of
// one 16-row warp, which is what bounds mma.sync here.
constexpr int kForwardFragments = 2;
using ForwardRows = WarpRows<kForwardFragments>;

template <int kW, int kDv>
struct ForwardLayout {
  static constexpr int q = ForwardRows::kRows * padded_stride(kW);  // bf16 elements
  static constexpr int k = kTile * padded_stride(kW);
  static constexpr int v = kTile * padded_stride(kDv);
  static constexpr int lag_slots = ForwardRows::kRows + kTile;
  static constexpr std::size_t bytes = std::size_t(q + 2 * k + 2 * v) * sizeof(bf16) + 2 * lag_slots * sizeof(float);
};

template <int kW, int kDv>
__global__ void __launch_bounds__(kThreads, 2)
    flash_forward_kernel(AttentionDims dims, EncodedAttention in, bf16* out, float* lse) {
  using Layout = ForwardLayout<kW, kDv>;
  constexpr int kF = kForwardFragments, kRows = ForwardRows::kRows;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* k_tiles = q_tile + Layout::q;
  bf16* v_tiles = k_tiles + 2 * Layout::k;
  float* bias_slots = reinterpret_cast<float*>(v_tiles + 2 * Layout::v);

  const FlashHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);  // longest blocks start first
  const int i0 = q_block * kRows;
  const ForwardRows lane;
  const bool has_bias = head.bias != nullptr;
  const float scale_log2 = in.score.scale * kLog2e;

  auto load_keys = [&](int kb, int stage) {
    const int j0 = kb * kTile;
    load_tile_async<kW>(k_tiles + stage * Layout::k, head.k, head.qk_stride, j0, kTile, T);
    load_tile_async<kDv>(v_tiles + stage * Layout::v, head.v, head.row_stride, j0, kTile, T);
    if (has_bias) stage_bias_async<kRows>(bias_slots + stage * Layout::lag_slots, head.bias, i0 - j0, T);
    copy_async_commit();
  };
  load_tile_async<kW>(q_tile, head.q, head.qk_stride, i0, kRows, T);
  load_keys(0, 0);  // one group with the queries

  float o[kF][kDv / 8][4];
  float row_max[kF][2], row_sum[kF][2];
#pragma unroll
  for (int f = 0; f < kF; ++f) {
    clear(o[f]);
    row_max[f][0] = row_max[f][1] = -INFINITY;
    row_sum[f][0] = row_sum[f][1] = 0.0f;
  }
  const int key_end = i0 + kRows < T ? i0 + kRows : T;
  const int key_blocks = (key_end + kTile - 1) / kTile;
  for (int kb = 0; kb < key_blocks; ++kb) {
    const int stage = kb & 1, j0 = kb * kTile;
    if (kb + 1 < key_blocks) {
      load_keys(kb + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();

    if (lane.sees(i0, j0)) {  // the last tile lies wholly above the first warps' rows
      float s[kF][kScoreBlocks][4];
#pragma unroll
      for (int f = 0; f < kF; ++f) clear(s[f]);
      mma_a_tile_b_rows<kF, kW, kTile, kW, kW>(s, q_tile, lane.first, k_tiles + stage * Layout::k);
      const bool masked = lane.needs_mask(i0, j0);
      const float* slots = bias_slots + stage * Layout::lag_slots;
#pragma unroll
      for (int f = 0; f < kF; ++f)
#pragma unroll
        for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = lane.row(f, e), col = lane.column(nb, e);
            float x = s[f][nb][e] * scale_log2;
            if (has_bias) x = fmaf(slots[row - col + kTile - 1], kLog2e, x);
            s[f][nb][e] = masked && j0 + col > i0 + row ? -INFINITY : x;
          }

      // Online softmax per fragment row (r = 0: row g, r = 1: row g + 8). row_sum stays a
      // per-lane partial sum until the end: the correction factor is the same on all four lanes.
#pragma unroll
      for (int f = 0; f < kF; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tile_max = -INFINITY;
#pragma unroll
          for (int nb = 0; nb < kScoreBlocks; ++nb)
            tile_max = fmaxf(tile_max, fmaxf(s[f][nb][2 * r], s[f][nb][2 * r + 1]));
          const float new_max = fmaxf(row_max[f][r], quad_max(tile_max));
          const float base = new_max == -INFINITY ? 0.0f : new_max;  // a row with nothing visible yet
          const float correction = exp2f(row_max[f][r] - base);
          row_max[f][r] = new_max;
          float sum = 0.0f;
#pragma unroll
          for (int nb = 0; nb < kScoreBlocks; ++nb) {
            s[f][nb][2 * r] = exp2f(s[f][nb][2 * r] - base);
            s[f][nb][2 * r + 1] = exp2f(s[f][nb][2 * r + 1] - base);
            sum += s[f][nb][2 * r] + s[f][nb][2 * r + 1];
          }
          row_sum[f][r] = row_sum[f][r] * correction + sum;
#pragma unroll
          for (int nb = 0; nb < kDv / 8; ++nb) {
            o[f][nb][2 * r] *= correction;
            o[f][nb][2 * r + 1] *= correction;
          }
        }
      std::uint32_t p[kF][kScoreSteps][4];
#pragma unroll
      for (int f = 0; f < kF; ++f) accumulators_to_operand(p[f], s[f]);
      mma_a_registers_b_columns<kF, kScoreSteps, kDv, kDv>(o, p, v_tiles + stage * Layout::v);
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

#pragma unroll
  for (int f = 0; f < kF; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = quad_sum(row_sum[f][r]);
      const int t = i0 + lane.row(f, 2 * r);
      if (t >= T) continue;
      const float inverse = 1.0f / total;
      bf16* row = out + head.activation_offset(t, dims.head_dim);
#pragma unroll
      for (int nb = 0; nb < kDv / 8; ++nb)
        *reinterpret_cast<__nv_bfloat162*>(row + lane.column(nb, 0)) =
            __floats2bfloat162_rn(o[f][nb][2 * r] * inverse, o[f][nb][2 * r + 1] * inverse);
      if (lane.q == 0) lse[head.statistic_index(t)] = (row_max[f][r] + log2f(total)) * kLn2;
    }
}

// ---------------------------------------------------------------- key gradients (dk̃, dv, Ĝ)

template <int kW, int kDv>
struct KeyGradLayout {
  static constexpr int k = kTile * padded_stride(kW);  // bf16 elements
  static constexpr int v = kTile * padded_stride(kDv);
  static constexpr int q = kTile * padded_stride(kW);
  static constexpr int dout = kTile * padded_stride(kDv);
  static constexpr int tiles = k + v + 2 * q + 2 * dout;
  // floats after the tiles: lse and D of two stages, bias slots of two stages, lag sums
  static constexpr int statistics = 2 * kTile + 2 * kTile + 2 * kLagSlots + kLagSlots;
  static constexpr int ds_stride = kTile + 1;  // dS tile for the lag sums: odd stride, no bank conflicts
  static constexpr std::size_t bytes(bool bias_grad) {
    return std::size_t(tiles) * sizeof(bf16) + (statistics + (bias_grad ? kTile * ds_stride : 0)) * sizeof(float);
  }
};

template <int kW, int kDv>
__global__ void __launch_bounds__(kThreads)
    flash_key_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads) {
  using Layout = KeyGradLayout<kW, kDv>;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);
  bf16* v_tile = k_tile + Layout::k;
  bf16* q_tiles = v_tile + Layout::v;
  bf16* dout_tiles = q_tiles + 2 * Layout::q;
  float* lse_slots = reinterpret_cast<float*>(k_tile + Layout::tiles);
  float* row_dot_slots = lse_slots + 2 * kTile;
  float* bias_slots = row_dot_slots + 2 * kTile;
  float* lag_sums = bias_slots + 2 * kLagSlots;
  float* ds_tile = lag_sums + kLagSlots;

  const FlashHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int key_block = int(blockIdx.y);  // low key blocks see the most queries and start first
  const int j0 = key_block * kTile;
  const int query_blocks = (T + kTile - 1) / kTile;
  const WarpRows<1> lane;
  const bool has_bias = head.bias != nullptr;
  const bool sums_lags = grads.bias_grad != nullptr;
  const float scale_log2 = in.score.scale * kLog2e;
  const bf16* dout = grads.dout + head.activation_offset(0, d);
  const float* lse = grads.lse + head.statistic_index(0);
  const float* row_dot = grads.row_dot + head.statistic_index(0);

  auto load_queries = [&](int qb, int stage) {
    const int i0 = qb * kTile;
    load_tile_async<kW>(q_tiles + stage * Layout::q, head.q, head.qk_stride, i0, kTile, T);
    load_tile_async<kDv>(dout_tiles + stage * Layout::dout, dout, head.channels, i0, kTile, T);
    stage_rows_async(lse_slots + stage * kTile, lse, i0, T);
    stage_rows_async(row_dot_slots + stage * kTile, row_dot, i0, T);
    if (has_bias) stage_bias_async<kTile>(bias_slots + stage * kLagSlots, head.bias, i0 - j0, T);
    copy_async_commit();
  };
  load_tile_async<kW>(k_tile, head.k, head.qk_stride, j0, kTile, T);
  load_tile_async<kDv>(v_tile, head.v, head.row_stride, j0, kTile, T);
  load_queries(key_block, 0);

  float dk[1][kW / 8][4], dv[1][kDv / 8][4];
  clear(dk[0]);
  clear(dv[0]);
  // Lag sums: thread r < 64 carries lag 64·n + r of step n into step n + 1, which adds the
  // tile's lags below i0 − j0 to it; this CTA's partial row holds lags 0 .. T − j0 − 1.
  float carried_lag_sum = 0.0f;
  float* partial_row = sums_lags ? grads.bias_grad_partials + (std::int64_t(head.bh) * query_blocks + key_block) * T
                                 : nullptr;
  const int lags_owned = T - j0;

  for (int qb = key_block; qb < query_blocks; ++qb) {
    const int step = qb - key_block, stage = step & 1, i0 = qb * kTile;
    if (qb + 1 < query_blocks) {
      load_queries(qb + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();

    const bf16* q_tile = q_tiles + stage * Layout::q;
    const bf16* dout_tile = dout_tiles + stage * Layout::dout;
    const float* lse_tile = lse_slots + stage * kTile;
    const float* row_dot_tile = row_dot_slots + stage * kTile;
    const float* slots = bias_slots + stage * kLagSlots;
    // Sᵀ (rows: this warp's 16 keys, columns: 64 queries) and dPᵀ = V · doutᵀ.
    float p[1][kScoreBlocks][4], ds[1][kScoreBlocks][4];
    clear(p[0]);
    clear(ds[0]);
    mma_a_tile_b_rows<1, kW, kTile, kW, kW>(p, k_tile, lane.first, q_tile);
    mma_a_tile_b_rows<1, kDv, kTile, kDv, kDv>(ds, v_tile, lane.first, dout_tile);
    const bool diagonal = qb == key_block;
#pragma unroll
    for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = lane.row(0, e), query = lane.column(nb, e);
        const bool visible = !(diagonal && query < key) && i0 + query < T;
        float x = p[0][nb][e] * scale_log2;
        if (has_bias) x = fmaf(slots[query - key + kTile - 1], kLog2e, x);
        const float prob = visible ? exp2f(x - lse_tile[query] * kLog2e) : 0.0f;
        p[0][nb][e] = prob;
        ds[0][nb][e] = prob * (ds[0][nb][e] - row_dot_tile[query]);
      }
    std::uint32_t a[1][kScoreSteps][4];
    accumulators_to_operand(a[0], p[0]);
    mma_a_registers_b_columns<1, kScoreSteps, kDv, kDv>(dv, a, dout_tile);  // dv += Pᵀ · dout
    accumulators_to_operand(a[0], ds[0]);
    mma_a_registers_b_columns<1, kScoreSteps, kW, kW>(dk, a, q_tile);  // dk̃ += dSᵀ · q̃ (scale at the end)

    if (sums_lags) {
#pragma unroll
      for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds_tile[lane.row(0, e) * Layout::ds_stride + lane.column(nb, e)] = ds[0][nb][e];
      __syncthreads();
      // Thread i < 127 sums the tile's diagonal query − key = i − 63, keys in increasing order.
      const int i = int(threadIdx.x);
      if (i < kLagSlots - 1) {
        const int offset = i - (kTile - 1);
        const int first_key = offset < 0 ? -offset : 0, last_key = offset < 0 ? kTile - 1 : kTile - 1 - offset;
        float sum = 0.0f;
        for (int key = first_key; key <= last_key; ++key) sum += ds_tile[key * Layout::ds_stride + key + offset];
        lag_sums[i] = sum;
      }
      __syncthreads();
      if (i < kTile) {
        if (step > 0) {  // lag 64·(step − 1) + i is complete: its part from this tile is diagonal i − 64
          const int lag = kTile * (step - 1) + i;
          const float total = carried_lag_sum + (i >= 1 ? lag_sums[i - 1] : 0.0f);
          if (lag < lags_owned) partial_row[lag] = total;
        }
        carried_lag_sum = lag_sums[i + kTile - 1];
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }
  if (sums_lags && int(threadIdx.x) < kTile) {
    const int lag = kTile * (query_blocks - 1 - key_block) + int(threadIdx.x);
    if (lag < lags_owned) partial_row[lag] = carried_lag_sum;
  }

  const float scale = in.score.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = j0 + lane.row(0, 2 * r);
    if (s >= T) continue;
    float* dk_row = grads.dk + head.statistic_index(s) * kW;
#pragma unroll
    for (int nb = 0; nb < kW / 8; ++nb)
      *reinterpret_cast<float2*>(dk_row + lane.column(nb, 0)) = make_float2(dk[0][nb][2 * r] * scale, dk[0][nb][2 * r + 1] * scale);
    bf16* dv_row = grads.dqkv + (std::int64_t(head.b) * T + s) * head.row_stride + 2 * head.channels +
                   std::int64_t(head.h) * d;
#pragma unroll
    for (int nb = 0; nb < kDv / 8; ++nb)
      *reinterpret_cast<__nv_bfloat162*>(dv_row + lane.column(nb, 0)) =
          __floats2bfloat162_rn(dv[0][nb][2 * r], dv[0][nb][2 * r + 1]);
  }
}

// Ĝ_h(Δ) += Σ_b Σ_{key blocks with 64·kb < T − Δ} partial rows, in that fixed order.
__global__ void bias_grad_reduce_kernel(AttentionDims dims, const float* partials, float* bias_grad) {
  const int T = dims.seq_len, H = dims.n_head, key_blocks = (T + kTile - 1) / kTile;
  const std::int64_t count = std::int64_t(H) * T;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int h = int(i / T), lag = int(i % T);
    float sum = 0.0f;
    for (int b = 0; b < dims.batch; ++b) {
      const float* rows = partials + (std::int64_t(b) * H + h) * key_blocks * T;
      for (int kb = 0; kb * kTile < T - lag; ++kb) sum += rows[std::int64_t(kb) * T + lag];
    }
    bias_grad[i] += sum;
  }
}

// ---------------------------------------------------------------- query gradients (dq̃)

template <int kW, int kDv>
struct QueryGradLayout {
  static constexpr int q = kTile * padded_stride(kW);  // bf16 elements
  static constexpr int dout = kTile * padded_stride(kDv);
  static constexpr int k = kTile * padded_stride(kW);
  static constexpr int v = kTile * padded_stride(kDv);
  static constexpr std::size_t bytes =
      std::size_t(q + dout + 2 * k + 2 * v) * sizeof(bf16) + 2 * kLagSlots * sizeof(float);
};

template <int kW, int kDv>
__global__ void __launch_bounds__(kThreads)
    flash_query_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads) {
  using Layout = QueryGradLayout<kW, kDv>;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* dout_tile = q_tile + Layout::q;
  bf16* k_tiles = dout_tile + Layout::dout;
  bf16* v_tiles = k_tiles + 2 * Layout::k;
  float* bias_slots = reinterpret_cast<float*>(v_tiles + 2 * Layout::v);

  const FlashHead head(dims, in, int(blockIdx.x));
  const int T = dims.seq_len, d = dims.head_dim;
  const int q_block = int(gridDim.y) - 1 - int(blockIdx.y);
  const int i0 = q_block * kTile;
  const WarpRows<1> lane;
  const bool has_bias = head.bias != nullptr;
  const float scale_log2 = in.score.scale * kLog2e;

  auto load_keys = [&](int kb, int stage) {
    const int j0 = kb * kTile;
    load_tile_async<kW>(k_tiles + stage * Layout::k, head.k, head.qk_stride, j0, kTile, T);
    load_tile_async<kDv>(v_tiles + stage * Layout::v, head.v, head.row_stride, j0, kTile, T);
    if (has_bias) stage_bias_async<kTile>(bias_slots + stage * kLagSlots, head.bias, i0 - j0, T);
    copy_async_commit();
  };
  load_tile_async<kW>(q_tile, head.q, head.qk_stride, i0, kTile, T);
  load_tile_async<kDv>(dout_tile, grads.dout + head.activation_offset(0, d), head.channels, i0, kTile, T);
  load_keys(0, 0);

  // This lane's two rows: lse in log2 units (+∞ past T, so that P is 0 there) and D.
  float lse2[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = i0 + lane.row(0, 2 * r);
    lse2[r] = t < T ? grads.lse[head.statistic_index(t)] * kLog2e : INFINITY;
    row_dot[r] = t < T ? grads.row_dot[head.statistic_index(t)] : 0.0f;
  }

  float dq[1][kW / 8][4];
  clear(dq[0]);
  const int key_blocks = q_block + 1;
  for (int kb = 0; kb < key_blocks; ++kb) {
    const int stage = kb & 1;
    if (kb + 1 < key_blocks) {
      load_keys(kb + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();

    const bf16* k_tile = k_tiles + stage * Layout::k;
    const bf16* v_tile = v_tiles + stage * Layout::v;
    const float* slots = bias_slots + stage * kLagSlots;
    float p[1][kScoreBlocks][4], ds[1][kScoreBlocks][4];
    clear(p[0]);
    clear(ds[0]);
    mma_a_tile_b_rows<1, kW, kTile, kW, kW>(p, q_tile, lane.first, k_tile);          // S = q̃ · k̃ᵀ
    mma_a_tile_b_rows<1, kDv, kTile, kDv, kDv>(ds, dout_tile, lane.first, v_tile);  // dP = dout · vᵀ
    const bool diagonal = kb == q_block;
#pragma unroll
    for (int nb = 0; nb < kScoreBlocks; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = lane.row(0, e), col = lane.column(nb, e);
        float x = p[0][nb][e] * scale_log2;
        if (has_bias) x = fmaf(slots[row - col + kTile - 1], kLog2e, x);
        const float prob = diagonal && col > row ? 0.0f : exp2f(x - lse2[e / 2]);
        ds[0][nb][e] = prob * (ds[0][nb][e] - row_dot[e / 2]);
      }
    std::uint32_t a[1][kScoreSteps][4];
    accumulators_to_operand(a[0], ds[0]);
    mma_a_registers_b_columns<1, kScoreSteps, kW, kW>(dq, a, k_tile);  // dq̃ += dS · k̃ (scale at the end)
    __syncthreads();
  }

  const float scale = in.score.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = i0 + lane.row(0, 2 * r);
    if (t >= T) continue;
    float* dq_row = grads.dq + head.statistic_index(t) * kW;
#pragma unroll
    for (int nb = 0; nb < kW / 8; ++nb)
      *reinterpret_cast<float2*>(dq_row + lane.column(nb, 0)) = make_float2(dq[0][nb][2 * r] * scale, dq[0][nb][2 * r + 1] * scale);
  }
}

// ---------------------------------------------------------------- dispatch

int blocks_of(int seq_len) { return (seq_len + kTile - 1) / kTile; }

dim3 tile_grid(const AttentionDims& dims, int rows_per_block = kTile) {
  return dim3(unsigned(dims.batch * dims.n_head), unsigned((dims.seq_len + rows_per_block - 1) / rows_per_block));
}

// Calls launch(std::integral_constant<int, W>, std::integral_constant<int, Dv>) for the
// instantiated (qk_width, head_dim) pair.
template <class Launch>
cudaError_t with_widths(const AttentionDims& dims, Launch&& launch) {
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  if (dims.qk_width == 64 && dims.head_dim == 64) return launch(I64{}, I64{});
  if (dims.qk_width == 128 && dims.head_dim == 64) return launch(I128{}, I64{});
  if (dims.qk_width == 128 && dims.head_dim == 128) return launch(I128{}, I128{});
  return cudaErrorInvalidValue;
}

bool aligned_16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool flash_attention_supports(const AttentionDims& dims, const EncodedAttention& in) {
  const bool widths = (dims.qk_width == 64 && dims.head_dim == 64) || (dims.qk_width == 128 && dims.head_dim == 64) ||
                      (dims.qk_width == 128 && dims.head_dim == 128);
  // Rows of qkv are 16-byte aligned when C = H·d is a multiple of 8, which d ∈ {64, 128} makes it.
  const bool qk_aligned = in.qk_in_qkv ? dims.qk_width == dims.head_dim : aligned_16(in.q) && aligned_16(in.k);
  return widths && dims.batch > 0 && dims.n_head > 0 && dims.seq_len > 0 && blocks_of(dims.seq_len) <= 65535 &&
         std::int64_t(dims.batch) * dims.n_head <= 0x7fffffff && qk_aligned && aligned_16(in.qkv);
}

std::size_t flash_bias_grad_partial_floats(const AttentionDims& dims) {
  return std::size_t(dims.batch) * dims.n_head * blocks_of(dims.seq_len) * dims.seq_len;
}

cudaError_t flash_attention_forward(const AttentionDims& dims, const EncodedAttention& in, __nv_bfloat16* out,
                                    float* lse, cudaStream_t stream) {
  if (!flash_attention_supports(dims, in)) return cudaErrorInvalidValue;
  return with_widths(dims, [&](auto w, auto dv) {
    constexpr int kW = decltype(w)::value, kDv = decltype(dv)::value;
    return launch_with_shared<flash_forward_kernel<kW, kDv>>(tile_grid(dims, ForwardRows::kRows), kThreads,
                                                             ForwardLayout<kW, kDv>::bytes, stream, dims, in, out, lse);
  });
}

cudaError_t flash_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                     const AttentionGradients& grads, cudaStream_t stream) {
  if (!flash_attention_supports(dims, in) || !aligned_16(grads.dout)) return cudaErrorInvalidValue;
  const bool bias_grad = grads.bias_grad != nullptr;
  if (bias_grad && (in.score.bias == nullptr || grads.bias_grad_partials == nullptr)) return cudaErrorInvalidValue;
  cudaError_t status = attention_row_dot(dims, grads, stream);
  if (status != cudaSuccess) return status;
  status = with_widths(dims, [&](auto w, auto dv) {
    constexpr int kW = decltype(w)::value, kDv = decltype(dv)::value;
    const cudaError_t keys = launch_with_shared<flash_key_grad_kernel<kW, kDv>>(
        tile_grid(dims), kThreads, KeyGradLayout<kW, kDv>::bytes(bias_grad), stream, dims, in, grads);
    if (keys != cudaSuccess) return keys;
    return launch_with_shared<flash_query_grad_kernel<kW, kDv>>(tile_grid(dims), kThreads,
                                                                QueryGradLayout<kW, kDv>::bytes, stream, dims, in, grads);
  });
  if (status != cudaSuccess || !bias_grad) return status;
  constexpr int kReduceThreads = 256;
  const std::int64_t count = std::int64_t(dims.n_head) * dims.seq_len;
  const std::int64_t blocks = (count + kReduceThreads - 1) / kReduceThreads;
  bias_grad_reduce_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), kReduceThreads, 0, stream>>>(
      dims, grads.bias_grad_partials, grads.bias_grad);
  return cudaGetLastError();
}

}  // namespace pope::kernels
