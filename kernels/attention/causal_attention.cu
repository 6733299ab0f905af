// Causal attention kernels over encoded rows (see causal_attention.cuh and row_tiles.cuh).
//   forward:    block = (b·H + h, 16 query rows), streams key/value chunks s ≤ its last row.
//   query grad: the same shape, streams key/value chunks again and sums dq̃.
//   key grad:   block = (b·H + h, 16 key rows), streams query/dout chunks t ≥ its first row
//               and sums dk̃ and dv.
// A warp's lanes score its row against the 32 chunk rows at once; the causal mask is the
// lane test s ≤ t.
#include <type_traits>

#include "attention/attention_head.cuh"
#include "attention/causal_attention.cuh"
#include "attention/kernel_launch.cuh"
#include "attention/row_tiles.cuh"
#include "bf16_group.cuh"

namespace pope::kernels {

namespace {

using namespace row_tiles;

static_assert(kMaxAttentionSeqLen <= kRowsPerBlock * 65535, "row blocks must fit grid.y");
static_assert(kMaxAttentionWidth <= kWarpSize * kMaxPerLane, "register rows must hold the widest q/k row");

// One (batch, head) and its score function.
struct Head : AttentionHead {
  using AttentionHead::AttentionHead;
  // a_ts from <q̃_t, k̃_s> and the lag t − s ≥ 0.
  __device__ float score(float dot, int lag) const { return dot * scale + (bias ? bias[lag] : 0.0f); }
};

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(AttentionDims dims, EncodedAttention in, __nv_bfloat16* out, float* lse) {
  extern __shared__ float shared[];
  const int T = dims.seq_len, w = dims.qk_width, d = dims.head_dim;
  float* k_tile = shared;
  float* v_tile = k_tile + tile_floats(w);
  float* own_q = v_tile + tile_floats(d) + warp_id() * w;
  const Head head(dims, in, int(blockIdx.x));
  const int first = int(blockIdx.y) * kRowsPerBlock;
  const int last = min(first + kRowsPerBlock, T) - 1;
  const int t = first + warp_id();
  const bool active = t < T;
  if (active) load_row(own_q, head.q + std::int64_t(t) * w, w);
  __syncwarp();

  float running_max = -INFINITY, running_sum = 0.0f;
  LaneRow<kPerLane> acc;
  acc.clear();
  for (int s0 = 0; s0 <= last; s0 += kChunkRows) {
    __syncthreads();  // the previous chunk is consumed
    load_chunk(k_tile, head.k, w, s0, T, w);
    load_chunk(v_tile, head.v, head.row_stride, s0, T, d);
    __syncthreads();
    if (!active || s0 > t) continue;
    const int s = s0 + lane_id();
    const float score = s <= t ? head.score(dot_with_lane_row(own_q, k_tile, w), t - s) : -INFINITY;
    // Online softmax; the chunk always holds s0 ≤ t, so new_max is finite.
    const float new_max = fmaxf(running_max, warp_max(score));
    const float correction = expf(running_max - new_max);
    const float p = expf(score - new_max);
    running_sum = running_sum * correction + warp_sum(p);
    acc.scale(correction);
    acc.add_weighted_rows(p, v_tile, d);
    running_max = new_max;
  }
  if (!active) return;
  acc.store(out + head.activation_offset(t, d), d, 1.0f / running_sum);
  if (lane_id() == 0) lse[head.statistic_index(t)] = running_max + logf(running_sum);
}

// D_t = <dout_t, out_t>, one thread per row of [B, H, T]. The sum runs over channels in the
// same order and with the same fmaf chain as the kernels' <dout_t, v_s>, so that where out_t
// equals v_s (a row attending to one key) dP − D cancels exactly, as it does on the CPU.
// Threads take rows in memory order (b, t, h), so that a warp reads 32 neighbouring head rows
// of out and dout, each in groups of kGroup channels (16-byte loads where rows allow). Single
// bf16 loads at the stride of a whole token row took 212 µs at B = 32, T = 1,024, H = 12, d = 64
// (Nsight Compute), where its 100 MB take ~30 µs; this takes 56.
template <int kGroup>
__global__ void row_dot_kernel(AttentionDims dims, const __nv_bfloat16* out, const __nv_bfloat16* dout,
                               float* row_dot) {
  const int T = dims.seq_len, d = dims.head_dim, H = dims.n_head;
  const std::int64_t rows = std::int64_t(dims.batch) * H * T;
  for (std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t token = r / H, h = r % H, b = token / T, t = token % T;
    const std::size_t first_group = std::size_t(r) * d / kGroup;  // row (b, t, h) of [B, T, H, d]
    float sum = 0.0f;
    for (int g = 0; g < d / kGroup; ++g) {
      const Bf16Group<kGroup> y = load_group<kGroup>(dout, first_group + g), o = load_group<kGroup>(out, first_group + g);
#pragma unroll
      for (int k = 0; k < kGroup; ++k) sum = fmaf(y.get(k), o.get(k), sum);
    }
    row_dot[(b * H + h) * T + t] = sum;
  }
}

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    query_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads) {
  extern __shared__ float shared[];
  const int T = dims.seq_len, w = dims.qk_width, d = dims.head_dim;
  float* k_tile = shared;
  float* v_tile = k_tile + tile_floats(w);
  float* own_q = v_tile + tile_floats(d) + warp_id() * w;
  float* own_dout = v_tile + tile_floats(d) + kRowsPerBlock * w + warp_id() * d;
  const Head head(dims, in, int(blockIdx.x));
  const int first = int(blockIdx.y) * kRowsPerBlock;
  const int last = min(first + kRowsPerBlock, T) - 1;
  const int t = first + warp_id();
  const bool active = t < T;
  float row_lse = 0.0f, row_dot = 0.0f;
  if (active) {
    load_row(own_q, head.q + std::int64_t(t) * w, w);
    load_row(own_dout, grads.dout + head.activation_offset(t, d), d);
    row_lse = grads.lse[head.statistic_index(t)];
    row_dot = grads.row_dot[head.statistic_index(t)];
  }
  __syncwarp();

  LaneRow<kPerLane> dq;
  dq.clear();
  for (int s0 = 0; s0 <= last; s0 += kChunkRows) {
    __syncthreads();
    load_chunk(k_tile, head.k, w, s0, T, w);
    load_chunk(v_tile, head.v, head.row_stride, s0, T, d);
    __syncthreads();
    if (!active || s0 > t) continue;
    const int s = s0 + lane_id();
    float dS = 0.0f;
    if (s <= t) {
      const float p = expf(head.score(dot_with_lane_row(own_q, k_tile, w), t - s) - row_lse);
      dS = p * (dot_with_lane_row(own_dout, v_tile, d) - row_dot);
    }
    dq.add_weighted_rows(dS, k_tile, w);
  }
  if (active) dq.store(grads.dq + head.statistic_index(t) * w, w, head.scale);
}

template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    key_value_grad_kernel(AttentionDims dims, EncodedAttention in, AttentionGradients grads) {
  extern __shared__ float shared[];
  const int T = dims.seq_len, w = dims.qk_width, d = dims.head_dim;
  float* q_tile = shared;
  float* dout_tile = q_tile + tile_floats(w);
  float* lse_tile = dout_tile + tile_floats(d);
  float* row_dot_tile = lse_tile + kChunkRows;
  float* own_k = row_dot_tile + kChunkRows + warp_id() * w;
  float* own_v = row_dot_tile + kChunkRows + kRowsPerBlock * w + warp_id() * d;
  const Head head(dims, in, int(blockIdx.x));
  const __nv_bfloat16* dout = grads.dout + head.activation_offset(0, d);
  const int first = int(blockIdx.y) * kRowsPerBlock;
  const int s = first + warp_id();
  const bool active = s < T;
  if (active) {
    load_row(own_k, head.k + std::int64_t(s) * w, w);
    load_row(own_v, head.v + std::int64_t(s) * head.row_stride, d);
  }
  __syncwarp();

  LaneRow<kPerLane> dk, dv;
  dk.clear();
  dv.clear();
  // Queries before `first` see none of this block's keys.
  for (int t0 = first; t0 < T; t0 += kChunkRows) {
    __syncthreads();
    load_chunk(q_tile, head.q, w, t0, T, w);
    load_chunk(dout_tile, dout, head.channels, t0, T, d);
    if (threadIdx.x < kChunkRows) {
      const int t = t0 + int(threadIdx.x);
      lse_tile[threadIdx.x] = t < T ? grads.lse[head.statistic_index(t)] : 0.0f;
      row_dot_tile[threadIdx.x] = t < T ? grads.row_dot[head.statistic_index(t)] : 0.0f;
    }
    __syncthreads();
    if (!active || t0 + kChunkRows <= s) continue;
    const int t = t0 + lane_id();
    float p = 0.0f, dS = 0.0f;
    if (t >= s && t < T) {
      p = expf(head.score(dot_with_lane_row(own_k, q_tile, w), t - s) - lse_tile[lane_id()]);
      dS = p * (dot_with_lane_row(own_v, dout_tile, d) - row_dot_tile[lane_id()]);
    }
    dk.add_weighted_rows(dS, q_tile, w);
    dv.add_weighted_rows(p, dout_tile, d);
  }
  if (!active) return;
  dk.store(grads.dk + head.statistic_index(s) * w, w, head.scale);
  const std::int64_t v_offset =
      (std::int64_t(head.b) * T + s) * head.row_stride + 2 * head.channels + std::int64_t(head.h) * d;
  dv.store(grads.dqkv + v_offset, d, 1.0f);
}

// Calls launch(std::integral_constant<int, kPerLane>) with the smallest per-lane register
// row that holds `width` channels.
template <class Launch>
cudaError_t with_lanes_for(int width, Launch&& launch) {
  const int lanes = lanes_needed(width);
  if (lanes <= 2) return launch(std::integral_constant<int, 2>{});
  if (lanes <= 4) return launch(std::integral_constant<int, 4>{});
  if (lanes <= 8) return launch(std::integral_constant<int, 8>{});
  if (lanes <= kMaxPerLane) return launch(std::integral_constant<int, kMaxPerLane>{});
  return cudaErrorInvalidValue;
}

// Launches one of the row kernels above (kThreads threads each).
template <auto kKernel, class... Args>
cudaError_t launch_rows(dim3 grid, std::size_t shared_bytes, cudaStream_t stream, Args... args) {
  return launch_with_shared<kKernel>(grid, kThreads, shared_bytes, stream, args...);
}

dim3 row_grid(const AttentionDims& dims) {
  return dim3(unsigned(dims.batch * dims.n_head), unsigned((dims.seq_len + kRowsPerBlock - 1) / kRowsPerBlock));
}

bool supported(const AttentionDims& dims) {
  return dims.batch > 0 && dims.seq_len > 0 && dims.n_head > 0 && dims.head_dim > 0 && dims.head_dim <= dims.qk_width &&
         dims.qk_width <= kMaxAttentionWidth && dims.seq_len <= kMaxAttentionSeqLen &&
         std::int64_t(dims.batch) * dims.n_head <= 0x7fffffff;
}

std::size_t floats_bytes(std::size_t count) { return count * sizeof(float); }

}  // namespace

cudaError_t causal_attention_forward(const AttentionDims& dims, const EncodedAttention& in, __nv_bfloat16* out,
                                     float* lse, cudaStream_t stream) {
  if (!supported(dims)) return cudaErrorInvalidValue;
  const int w = dims.qk_width, d = dims.head_dim;
  const std::size_t shared = floats_bytes(tile_floats(w) + tile_floats(d) + std::size_t(kRowsPerBlock) * w);
  return with_lanes_for(w, [&](auto lanes) {
    return launch_rows<forward_kernel<decltype(lanes)::value>>(row_grid(dims), shared, stream, dims, in, out, lse);
  });
}

cudaError_t attention_row_dot(const AttentionDims& dims, const AttentionGradients& grads, cudaStream_t stream) {
  constexpr int kRowDotThreads = 256;
  const std::int64_t rows = std::int64_t(dims.batch) * dims.n_head * dims.seq_len;
  const std::int64_t row_dot_blocks = (rows + kRowDotThreads - 1) / kRowDotThreads;
  const unsigned blocks = unsigned(row_dot_blocks < 65535 ? row_dot_blocks : 65535);
  return launch_with_group_width(dims.head_dim, {grads.out, grads.dout}, [&](auto group) {
    row_dot_kernel<decltype(group)::value><<<blocks, kRowDotThreads, 0, stream>>>(dims, grads.out, grads.dout,
                                                                                   grads.row_dot);
    return cudaGetLastError();
  });
}

cudaError_t causal_attention_backward(const AttentionDims& dims, const EncodedAttention& in,
                                      const AttentionGradients& grads, cudaStream_t stream) {
  // Neither Ĝ nor bf16 encoded gradients here (flash_attention_backward's options).
  if (!supported(dims) || grads.bias_grad != nullptr || grads.dq_bf16 != nullptr || grads.dk_bf16 != nullptr)
    return cudaErrorInvalidValue;
  const int w = dims.qk_width, d = dims.head_dim;
  const cudaError_t status = attention_row_dot(dims, grads, stream);
  if (status != cudaSuccess) return status;

  const std::size_t own_rows = std::size_t(kRowsPerBlock) * (w + d);
  const std::size_t query_shared = floats_bytes(tile_floats(w) + tile_floats(d) + own_rows);
  const std::size_t key_shared = floats_bytes(tile_floats(w) + tile_floats(d) + 2 * kChunkRows + own_rows);
  return with_lanes_for(w, [&](auto lanes) {
    constexpr int kPerLane = decltype(lanes)::value;
    const cudaError_t query_status =
        launch_rows<query_grad_kernel<kPerLane>>(row_grid(dims), query_shared, stream, dims, in, grads);
    if (query_status != cudaSuccess) return query_status;
    return launch_rows<key_value_grad_kernel<kPerLane>>(row_grid(dims), key_shared, stream, dims, in, grads);
  });
}

}  // namespace pope::kernels
