// Incremental decoding's attention (decode_attention.cuh). A block of four warps takes one
// (query row, head, sequence) and one range of keys; each warp takes every fourth key of the
// range, four such keys per pass (their loads issued together), its lanes splitting the q̃·k̃
// dot product and the value row two channels each, with an online softmax per warp. The warps merge their (max, sum, Σ p·v) in a fixed order; with
// several ranges, each block stores its partial and counts itself in, and the last block of
// the (row, head) merges the ranges in range order.
#include "attention/decode_attention.cuh"

#include <algorithm>
#include <cmath>

#include "block_reduce.cuh"  // kWarpSize
#include "dependent_launch.cuh"

namespace pope::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxWidth = 256;                     // W and d
constexpr int kPerLane = kMaxWidth / kWarpSize;    // channels a lane may hold
constexpr int kKeysPerPass = 4;                    // keys a warp scores together, their loads in flight at once

// Rows of a partial: max m, sum l, then d floats of Σ p·v, for each (b, h, i, range).
__host__ __device__ inline std::size_t partial_stride(int head_dim) { return std::size_t(head_dim) + 2; }

// Blocks a decode call aims for: a few waves of a large GPU.
constexpr int kTargetBlocks = 1024;

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ inline float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__global__ void __launch_bounds__(kWarps * kWarpSize)
    range_kernel(DecodeDims dims, ScoreParams score, const __nv_bfloat16* q_encoded, const __nv_bfloat16* k_encoded,
                 const __nv_bfloat16* qkv, __nv_bfloat16* keys, __nv_bfloat16* values, float* partials,
                 int* counters, __nv_bfloat16* out) {
  __shared__ float warp_state[kWarps][kMaxWidth + 2];
  allow_dependents();
  wait_for_producer();
  const int split = blockIdx.x % dims.splits, row = blockIdx.x / dims.splits, h = blockIdx.y;  // row = b·n + i
  const int b = row / dims.new_rows, i = row % dims.new_rows;
  const int past = *dims.past, t = past + i, total = past + dims.new_rows;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int W = dims.qk_width, d = dims.head_dim;
  const long head_slot = (long(b) * dims.n_head + h) * dims.capacity;
  const long C = long(dims.n_head) * d;
  const long new_head = (long(b) * dims.n_head + h) * dims.new_rows;  // row (b, h, 0) of q̃ and k̃
  const __nv_bfloat16* q = q_encoded + (new_head + i) * W;
  // The new rows' keys and values: read from this call's rows, and appended by split 0 of each row.
  auto key_row = [&](int s) { return s < past ? keys + (head_slot + s) * W : k_encoded + (new_head + s - past) * W; };
  auto value_row = [&](int s) {
    return s < past ? values + (head_slot + s) * d : qkv + (long(b) * dims.new_rows + s - past) * 3 * C + 2 * C + long(h) * d;
  };
  if (split == 0 && t < dims.capacity) {  // the host checks p0 + n ≤ capacity; never write past the cache
    for (int c = threadIdx.x; c < W; c += blockDim.x) keys[(head_slot + t) * W + c] = key_row(t)[c];
    for (int c = threadIdx.x; c < d; c += blockDim.x) values[(head_slot + t) * d + c] = value_row(t)[c];
  }

  float q_lane[kPerLane], o[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    q_lane[k] = c < W ? __bfloat162float(q[c]) : 0.0f;
    o[k] = 0.0f;
  }
  const float slope = score.bias_slopes != nullptr ? score.bias_slopes[h] : 0.0f;
  const float* bias_row = score.bias != nullptr ? score.bias + long(h) * dims.capacity : nullptr;
  float m = -INFINITY, l = 0.0f;
  const int per_split = (total + dims.splits - 1) / dims.splits;
  const int first = split * per_split, last = min(first + per_split, min(t + 1, dims.capacity));  // keys s ≤ t
  for (int s0 = first + warp; s0 < last; s0 += kWarps * kKeysPerPass) {
    float x[kKeysPerPass], v[kKeysPerPass][kPerLane];
#pragma unroll
    for (int g = 0; g < kKeysPerPass; ++g) {  // every load first, then the sums
      const int s = s0 + g * kWarps < last ? s0 + g * kWarps : s0;
      const __nv_bfloat16* k_row = key_row(s);
      const __nv_bfloat16* v_row = value_row(s);
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int c = lane + k * kWarpSize;
        if (c < W) dot += q_lane[k] * __bfloat162float(k_row[c]);
        v[g][k] = c < d ? __bfloat162float(v_row[c]) : 0.0f;
      }
      x[g] = dot;
    }
    float new_m = m;
#pragma unroll
    for (int g = 0; g < kKeysPerPass; ++g) {
      const int s = s0 + g * kWarps;
      x[g] = warp_sum(x[g]) * score.scale;
      if (score.bias_slopes != nullptr) x[g] += slope * float(t - s);
      else if (bias_row != nullptr && s < last) x[g] += bias_row[t - s];
      if (s >= last) x[g] = -INFINITY;  // past the range: no weight
      new_m = fmaxf(new_m, x[g]);
    }
    const float correction = __expf(m - new_m);
    l *= correction;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) o[k] *= correction;
#pragma unroll
    for (int g = 0; g < kKeysPerPass; ++g) {
      const float p = __expf(x[g] - new_m);
      l += p;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) o[k] += p * v[g][k];
    }
    m = new_m;
  }
  float* state = warp_state[warp];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < d) state[2 + c] = o[k];
  }
  if (lane == 0) {
    state[0] = m;
    state[1] = l;
  }
  __syncthreads();
  // Warp 0's lanes merge the four warps' states channel by channel, in warp order.
  if (warp != 0) return;
  float merged_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) merged_m = fmaxf(merged_m, warp_state[w][0]);
  float merged_l = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (warp_state[w][0] != -INFINITY) merged_l += warp_state[w][1] * __expf(warp_state[w][0] - merged_m);
  auto merged_sum = [&](int c) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (warp_state[w][0] != -INFINITY) sum += warp_state[w][2 + c] * __expf(warp_state[w][0] - merged_m);
    return sum;
  };
  __nv_bfloat16* y = out + long(row) * C + long(h) * d;
  if (dims.splits == 1) {
    const float inverse = 1.0f / merged_l;
    for (int c = lane; c < d; c += kWarpSize) y[c] = __float2bfloat16(merged_sum(c) * inverse);
    return;
  }
  const float* ranges = partials + (long(row) * dims.n_head + h) * dims.splits * partial_stride(d);
  float* mine = partials + ((long(row) * dims.n_head + h) * dims.splits + split) * partial_stride(d);
  for (int c = lane; c < d; c += kWarpSize) mine[2 + c] = merged_sum(c);
  if (lane == 0) {
    mine[0] = merged_m;
    mine[1] = merged_l;
  }
  // Count this range in; the last range's block merges them all (its loads bypass L1, where
  // an earlier call's partials may linger).
  __threadfence();
  __syncwarp();
  int* counter = counters + long(row) * dims.n_head + h;
  int arrived = lane == 0 ? atomicAdd(counter, 1) : 0;
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != dims.splits - 1) return;
  __threadfence();
  // Each lane loads the (max, sum) of ranges lane, lane + 32, …; a range's weight is then
  // broadcast to every lane, which adds its channels. Loads bypass L1 (__ldcg).
  const std::size_t stride = partial_stride(d);
  float total_m = -INFINITY;
  for (int c = lane; c < dims.splits; c += kWarpSize) total_m = fmaxf(total_m, __ldcg(ranges + c * stride));
  total_m = warp_max(total_m);
  float total_l = 0.0f, sum[kPerLane] = {};
  for (int base = 0; base < dims.splits; base += kWarpSize) {
    const int c = base + lane;
    const float range_m = c < dims.splits ? __ldcg(ranges + c * stride) : -INFINITY;
    // a range with no key of the row (past its last key) holds m = −∞, l = 0: weight 0
    const float weight = range_m == -INFINITY ? 0.0f : __expf(range_m - total_m);
    if (weight != 0.0f) total_l += __ldcg(ranges + c * stride + 1) * weight;
    const int count = min(kWarpSize, dims.splits - base);
#pragma unroll 4
    for (int j = 0; j < count; ++j) {
      const float w = __shfl_sync(0xffffffffu, weight, j);
      const float* range = ranges + (base + j) * stride + 2;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int ch = lane + k * kWarpSize;
        if (ch < d && w != 0.0f) sum[k] += __ldcg(range + ch) * w;
      }
    }
  }
  const float inverse = 1.0f / warp_sum(total_l);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int ch = lane + k * kWarpSize;
    if (ch < d) y[ch] = __float2bfloat16(sum[k] * inverse);
  }
  if (lane == 0) *counter = 0;  // ready for the next call
}

bool valid(const DecodeDims& dims) {
  return dims.batch > 0 && dims.n_head > 0 && dims.n_head <= 65535 && dims.new_rows > 0 && dims.head_dim > 0 &&
         dims.head_dim <= kMaxWidth && dims.qk_width > 0 && dims.qk_width <= kMaxWidth && dims.past != nullptr &&
         dims.new_rows <= dims.capacity && dims.splits > 0 &&
         long(dims.batch) * dims.new_rows * dims.splits <= 2147483647L;
}

}  // namespace

int decode_splits(int rows, int n_head, int capacity) {
  const long blocks_per_split = std::max(1L, long(rows) * n_head);
  const long wanted = (kTargetBlocks + blocks_per_split - 1) / blocks_per_split;
  return int(std::clamp(wanted, 1L, std::max(1L, long(capacity) / kMinDecodeKeysPerSplit)));
}

std::size_t decode_attention_partial_floats(const DecodeDims& dims) {
  return std::size_t(dims.batch) * dims.new_rows * dims.n_head * std::size_t(dims.splits) *
         partial_stride(dims.head_dim);
}

std::size_t decode_attention_counters(const DecodeDims& dims) {
  return std::size_t(dims.batch) * dims.new_rows * dims.n_head;
}

cudaError_t decode_attention(const DecodeDims& dims, const ScoreParams& score, const __nv_bfloat16* q_encoded,
                             const __nv_bfloat16* k_encoded, const __nv_bfloat16* qkv, __nv_bfloat16* keys,
                             __nv_bfloat16* values, float* partials, int* counters, __nv_bfloat16* out,
                             cudaStream_t stream) {
  if (!valid(dims)) return cudaErrorInvalidValue;
  const int rows = dims.batch * dims.new_rows;
  return launch_dependent(range_kernel, dim3(unsigned(rows) * unsigned(dims.splits), unsigned(dims.n_head)),
                          dim3(kWarps * kWarpSize), stream, dims, score, q_encoded, k_encoded, qkv, keys, values,
                          partials, counters, out);
}

}  // namespace pope::kernels
