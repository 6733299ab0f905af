// The q/k transform kernels. Threads map to (row n = b·T + t, head h, channel c) with c
// fastest, so reads of qkv and writes of the encoded rows are coalesced. Angles come from
// double frequency tables (see rotation_by in encoding_math.cuh).
#include "attention/encoding_math.cuh"
#include "attention/qk_transform.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

// Where one thread's channel lives: head h's q or k columns of row n, and the encoded row.
struct ChannelSite {
  int c;  // channel of the head, 0..d−1
  int h;
  std::int64_t encoded;  // offset of the encoded row ((b·H + h)·T + t)·qk_width
  std::int64_t qkv;      // offset of the head's q or k columns in row n of qkv
  double position;       // absolute position of t
};

__device__ ChannelSite site_of(std::int64_t index, const AttentionDims& dims, int offset, bool is_key) {
  ChannelSite site;
  const int d = dims.head_dim, H = dims.n_head, T = dims.seq_len;
  site.c = int(index % d);
  const std::int64_t head_row = index / d;
  site.h = int(head_row % H);
  const std::int64_t n = head_row / H;  // row b·T + t of qkv
  const std::int64_t b = n / T;
  const int t = int(n % T);
  const std::int64_t channels = std::int64_t(H) * d;
  site.encoded = ((b * H + site.h) * T + t) * dims.qk_width;
  site.qkv = n * 3 * channels + (is_key ? channels : 0) + std::int64_t(site.h) * d;
  site.position = double(offset) + double(t);
  return site;
}

__device__ bool delta_applies(const QkTransformParams& transform, bool is_key) {
  return is_key && transform.delta != nullptr;
}

__device__ float delta_of(const QkTransformParams& transform, bool is_key, int h, int d, int c) {
  return delta_applies(transform, is_key) ? transform.delta[std::int64_t(h) * d + c] : 0.0f;
}

// blockIdx.y selects queries (0) or keys (1).
__global__ void encode_qk_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                 __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded) {
  const bool is_key = blockIdx.y == 1;
  __nv_bfloat16* encoded = is_key ? k_encoded : q_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const std::int64_t total = std::int64_t(dims.batch) * dims.seq_len * dims.n_head * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const ChannelSite site = site_of(i, dims, transform.position_offset, is_key);
    const __nv_bfloat16* x = qkv + site.qkv;
    __nv_bfloat16* y = encoded + site.encoded;
    const int c = site.c;
    switch (transform.kind) {
      case QkTransformKind::identity:
        y[c] = x[c];
        break;
      case QkTransformKind::rope:
        // Thread c < pairs writes the pair (c, c + pairs); channels past 2·pairs pass through.
        if (c < pairs) {
          const PhaseRotation r = rotation_by(site.position * transform.frequencies[c]);
          float a, b;
          rotate_pair(__bfloat162float(x[c]), __bfloat162float(x[c + pairs]), r, a, b);
          y[c] = __float2bfloat16(a);
          y[c + pairs] = __float2bfloat16(b);
        } else if (c >= 2 * pairs) {
          y[c] = x[c];
        }
        break;
      case QkTransformKind::pope: {
        const PhaseRotation r = pope_phase(site.position, transform.frequencies[c], delta_applies(transform, is_key),
                                           delta_of(transform, is_key, site.h, d, c));
        const float mu = pope_magnitude(transform.magnitude, __bfloat162float(x[c]));
        y[c] = __float2bfloat16(mu * r.cos);
        y[d + c] = __float2bfloat16(mu * r.sin);
        break;
      }
    }
  }
}

__global__ void encode_qk_backward_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                          const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv) {
  const bool is_key = blockIdx.y == 1;
  const float* dencoded = is_key ? dk_encoded : dq_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const std::int64_t total = std::int64_t(dims.batch) * dims.seq_len * dims.n_head * d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const ChannelSite site = site_of(i, dims, transform.position_offset, is_key);
    const float* dy = dencoded + site.encoded;
    __nv_bfloat16* dx = dqkv + site.qkv;
    const int c = site.c;
    switch (transform.kind) {
      case QkTransformKind::identity:
        dx[c] = __float2bfloat16(dy[c]);
        break;
      case QkTransformKind::rope:
        if (c < pairs) {
          const PhaseRotation r = rotation_by(site.position * transform.frequencies[c]);
          float da, db;
          unrotate_pair(dy[c], dy[c + pairs], r, da, db);
          dx[c] = __float2bfloat16(da);
          dx[c + pairs] = __float2bfloat16(db);
        } else if (c >= 2 * pairs) {
          dx[c] = __float2bfloat16(dy[c]);
        }
        break;
      case QkTransformKind::pope: {
        const PhaseRotation r = pope_phase(site.position, transform.frequencies[c], delta_applies(transform, is_key),
                                           delta_of(transform, is_key, site.h, d, c));
        const float x = __bfloat162float(qkv[site.qkv + c]);
        const float dmu = pope_magnitude_grad(dy[c], dy[d + c], r);
        dx[c] = __float2bfloat16(dmu * pope_magnitude_derivative(transform.magnitude, x));
        break;
      }
    }
  }
}

constexpr int kDeltaChannels = 32;  // lanes ↔ channels
constexpr int kDeltaWarps = 8;      // warps ↔ interleaved rows

// Block (h, channel group): lane ↔ channel c, warp w sums rows n ≡ w (mod kDeltaWarps) in
// increasing order, then warp 0 adds the warps' sums in warp order: a fixed summation order,
// so the result is the same on every run.
__global__ void __launch_bounds__(kDeltaChannels* kDeltaWarps)
    pope_delta_gradient_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                               const float* dk_encoded, float* delta_grad) {
  __shared__ float partial[kDeltaWarps][kDeltaChannels];
  const int lane = threadIdx.x % kDeltaChannels, warp = threadIdx.x / kDeltaChannels;
  const int h = blockIdx.x, c = blockIdx.y * kDeltaChannels + lane;
  const int d = dims.head_dim, H = dims.n_head, T = dims.seq_len;
  const bool owns_channel = c < d;
  const float delta = owns_channel ? transform.delta[std::int64_t(h) * d + c] : 0.0f;
  float sum = 0.0f;
  if (owns_channel && pope_delta_in_range(delta)) {
    const std::int64_t channels = std::int64_t(H) * d, rows = std::int64_t(dims.batch) * T;
    for (std::int64_t n = warp; n < rows; n += kDeltaWarps) {
      const std::int64_t b = n / T;
      const int t = int(n % T);
      const float x = __bfloat162float(qkv[n * 3 * channels + channels + std::int64_t(h) * d + c]);
      const float* dy = dk_encoded + ((b * H + h) * T + t) * dims.qk_width;
      const PhaseRotation r =
          pope_phase(double(transform.position_offset) + double(t), transform.frequencies[c], true, delta);
      sum += pope_phase_grad(pope_magnitude(transform.magnitude, x), dy[c], dy[d + c], r);
    }
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && owns_channel) {
    float total = 0.0f;
    for (int w = 0; w < kDeltaWarps; ++w) total += partial[w][lane];
    delta_grad[std::int64_t(h) * d + c] += total;
  }
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

std::int64_t channel_count(const AttentionDims& dims) {
  return std::int64_t(dims.batch) * dims.seq_len * dims.n_head * dims.head_dim;
}

}  // namespace

cudaError_t encode_qk(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                      __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream) {
  const std::int64_t count = channel_count(dims);
  if (count == 0) return cudaSuccess;
  encode_qk_kernel<<<dim3(grid_for(count), 2), kThreads, 0, stream>>>(dims, transform, qkv, q_encoded, k_encoded);
  return cudaGetLastError();
}

cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream) {
  const std::int64_t count = channel_count(dims);
  if (count == 0) return cudaSuccess;
  encode_qk_backward_kernel<<<dim3(grid_for(count), 2), kThreads, 0, stream>>>(dims, transform, qkv, dq_encoded,
                                                                               dk_encoded, dqkv);
  return cudaGetLastError();
}

cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const float* dk_encoded, float* delta_grad, cudaStream_t stream) {
  if (transform.kind != QkTransformKind::pope || transform.delta == nullptr) return cudaErrorInvalidValue;
  if (channel_count(dims) == 0) return cudaSuccess;
  const dim3 grid(unsigned(dims.n_head), unsigned((dims.head_dim + kDeltaChannels - 1) / kDeltaChannels));
  pope_delta_gradient_kernel<<<grid, kDeltaChannels * kDeltaWarps, 0, stream>>>(dims, transform, qkv, dk_encoded,
                                                                                delta_grad);
  return cudaGetLastError();
}

}  // namespace pope::kernels
