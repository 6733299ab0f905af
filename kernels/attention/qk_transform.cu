// The q/k transform kernels. One thread per (row n = b·T + t, head h, group of kGroup
// consecutive channels) with the group fastest, so reads of qkv and writes of the encoded
// rows are coalesced 16-byte vectors where the sizes allow (kGroup = 8), single elements
// otherwise. Angles come from double frequency tables (see rotation_by in encoding_math.cuh).
// PJ-rotary mixes all 2(K+1) channels of a block, so its kernels take one block per thread
// (the same site arithmetic with the block as the group) instead of a fixed group.
#include <cstdint>
#include <type_traits>

#include "attention/encoding_math.cuh"
#include "attention/qk_transform.cuh"
#include "bf16_group.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

// kGroup consecutive f32 values moved with one (kGroup = 8: two 16-byte) memory access.
template <int kGroup>
struct alignas(4 * kGroup) F32Group {
  float element[kGroup];
};

// Where one thread's channel group lives: head h's q or k columns of row n, and the encoded row.
struct GroupSite {
  int c0;  // first channel of the group, 0..d−1
  int h;
  std::int64_t encoded;  // offset of the encoded row ((b·H + h)·T + t)·qk_width
  std::int64_t qkv;      // offset of the head's q or k columns in row n of qkv
  int t;                 // row of the call
  double position;       // absolute position of t
};

// Thread `index` of a launch with `group` channels per thread (group divides head_dim). The
// index is split into (row n, head, group) with 32-bit divisions where it fits 32 bits (below
// 2^32 channel groups per launch): a 64-bit division is a long instruction sequence, and these
// memory-bound kernels take three per thread for 8 channels of traffic.
__device__ GroupSite site_of(std::int64_t index, const AttentionDims& dims, int offset, bool is_key, int group) {
  GroupSite site;
  const int d = dims.head_dim, H = dims.n_head, T = dims.seq_len, groups = d / group;
  std::int64_t n, b;  // row b·T + t of qkv, and its sequence
  int t;
  if (index <= 0xffffffffll) {
    const unsigned narrow = unsigned(index), head_row = narrow / unsigned(groups), row = head_row / unsigned(H);
    site.c0 = int(narrow - head_row * unsigned(groups)) * group;
    site.h = int(head_row - row * unsigned(H));
    n = row;
    b = row / unsigned(T);
    t = int(row - unsigned(b) * unsigned(T));
  } else {
    site.c0 = int(index % groups) * group;
    const std::int64_t head_row = index / groups;
    site.h = int(head_row % H);
    n = head_row / H;
    b = n / T;
    t = int(n % T);
  }
  const std::int64_t channels = std::int64_t(H) * d;
  site.encoded = ((b * H + site.h) * T + t) * dims.qk_width;
  site.qkv = n * 3 * channels + (is_key ? channels : 0) + std::int64_t(site.h) * d;
  site.t = t;
  site.position = double(offset) + double(t);
  return site;
}

template <int kGroup>
__device__ Bf16Group<kGroup> load_bf16(const __nv_bfloat16* at) {
  return *reinterpret_cast<const Bf16Group<kGroup>*>(at);
}
template <int kGroup>
__device__ void store_bf16(__nv_bfloat16* at, const Bf16Group<kGroup>& value) {
  *reinterpret_cast<Bf16Group<kGroup>*>(at) = value;
}
template <int kGroup>
__device__ F32Group<kGroup> load_f32(const float* at) {
  return *reinterpret_cast<const F32Group<kGroup>*>(at);
}

__device__ bool delta_applies(const QkTransformParams& transform, bool is_key) {
  return is_key && transform.delta != nullptr;
}

__device__ float delta_of(const QkTransformParams& transform, bool is_key, int h, int d, int c) {
  return delta_applies(transform, is_key) ? transform.delta[std::int64_t(h) * d + c] : 0.0f;
}

// Entry m of row t of the call's phase table.
__device__ PhaseRotation tabulated_phase(const QkTransformParams& transform, int t, int width, int m) {
  const float2 entry = transform.phases[std::int64_t(t) * width + m];
  return PhaseRotation{entry.x, entry.y};
}

// Entry (h, t, c) of the call's key phase table.
__device__ PhaseRotation tabulated_key_phase(const QkTransformParams& transform, int h, int T, int t, int d, int c) {
  const float2 entry = transform.key_phases[(std::int64_t(h) * T + t) * d + c];
  return PhaseRotation{entry.x, entry.y};
}

__device__ PhaseRotation pope_phase_of(const QkTransformParams& transform, const GroupSite& site, bool is_key,
                                       const AttentionDims& dims, int c) {
  const int d = dims.head_dim;
  if (delta_applies(transform, is_key)) {
    if (transform.key_phases != nullptr) return tabulated_key_phase(transform, site.h, dims.seq_len, site.t, d, c);
  } else if (transform.phases != nullptr) {
    return tabulated_phase(transform, site.t, d, c);
  }
  return pope_phase(site.position, transform.frequencies[c], delta_applies(transform, is_key),
                    delta_of(transform, is_key, site.h, d, c));
}

__device__ PhaseRotation rope_phase_of(const QkTransformParams& transform, const GroupSite& site, int m) {
  if (transform.phases != nullptr) return tabulated_phase(transform, site.t, transform.rotary_pairs, m);
  return rotation_by(site.position * transform.frequencies[m]);
}

// Columns of the phase table: RoPE's rotary pairs, PoPE's channels; 0 for other transforms.
__host__ __device__ int phase_table_width(const QkTransformParams& transform, int head_dim) {
  switch (transform.kind) {
    case QkTransformKind::rope: return transform.rotary_pairs;
    case QkTransformKind::pope: return head_dim;
    default: return 0;
  }
}

// Entry (t, m) = rotation_by(p_t · frequency_m) with p_t formed as GroupSite::position is, so
// that a tabulated phase is bitwise the one an encode kernel computes per element (PoPE's
// phase without δ adds 0.0 to the same product: the same double for the non-negative angles).
__global__ void phase_table_kernel(int seq_len, int width, int position_offset, const double* frequencies,
                                   float2* table) {
  const std::int64_t total = std::int64_t(seq_len) * width;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i / width), m = int(i % width);
    const PhaseRotation r = rotation_by((double(position_offset) + double(t)) * frequencies[m]);
    table[i] = make_float2(r.cos, r.sin);
  }
}

// Entry (h, t, c) = pope_phase(p_t, ω_c, δ_hc): bitwise what the encode kernels and the δ
// gradient compute per key element, p_t formed as GroupSite::position is.
__global__ void key_phase_table_kernel(int n_head, int seq_len, int head_dim, QkTransformParams transform,
                                       float2* table) {
  const std::int64_t total = std::int64_t(n_head) * seq_len * head_dim;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % head_dim), t = int(i / head_dim % seq_len), h = int(i / head_dim / seq_len);
    const PhaseRotation r = pope_phase(double(transform.position_offset) + double(t), transform.frequencies[c], true,
                                       transform.delta[std::int64_t(h) * head_dim + c]);
    table[i] = make_float2(r.cos, r.sin);
  }
}

__host__ __device__ std::int64_t group_count(const AttentionDims& dims, int group) {
  return std::int64_t(dims.batch) * dims.seq_len * dims.n_head * (dims.head_dim / group);
}

// ---------------------------------------------------------------- PJ-rotary (spec 5.2)

// Channels per PJ-rotary block: K + 1 complex channels (x_{2r}, x_{2r+1}).
__host__ __device__ int pj_block_width(const QkTransformParams& transform) { return 2 * (transform.jet_order + 1); }

// Thread = one block m of one (row, head): y = R(ω_m p) · S(c_p) z with S the query's or the
// key's shear (PjShear), c_p = shear_rate · p, all in f32 from the bf16 inputs; p and the
// angle in double (rotation_by's exact range reduction). kChannels ≥ K + 1 bounds the
// register arrays; channels past K + 1 stay zero and are never stored.
template <int kChannels>
__global__ void encode_pj_rotary_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                        __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded) {
  const bool is_key = blockIdx.y == 1;
  __nv_bfloat16* encoded = is_key ? k_encoded : q_encoded;
  const int channels = transform.jet_order + 1, width = pj_block_width(transform);
  const std::int64_t total = group_count(dims, width);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, transform.position_offset, is_key, width);
    const __nv_bfloat16* x = qkv + site.qkv + site.c0;
    __nv_bfloat16* y = encoded + site.encoded + site.c0;
    const PjShear<kChannels> shear(transform.shear_rate * site.position, channels, is_key);
    const PhaseRotation turn = rotation_by(site.position * transform.frequencies[site.c0 / width]);
    float re[kChannels] = {}, im[kChannels] = {};
#pragma unroll
    for (int r = 0; r < kChannels; ++r)
      if (r < channels) {
        re[r] = __bfloat162float(x[2 * r]);
        im[r] = __bfloat162float(x[2 * r + 1]);
      }
#pragma unroll
    for (int out = 0; out < kChannels; ++out) {
      if (out >= channels) break;
      float a = 0.0f, b = 0.0f;
#pragma unroll
      for (int in = 0; in < kChannels; ++in) {
        const float w = shear.at(out, in);
        a += w * re[in];
        b += w * im[in];
      }
      float ya, yb;
      rotate_pair(a, b, turn, ya, yb);
      y[2 * out] = __float2bfloat16(ya);
      y[2 * out + 1] = __float2bfloat16(yb);
    }
  }
}

// Backward of encode_pj_rotary_kernel by the adjoint maps: w = R(−ω_m p) dy, then dz = Sᵀ w.
template <int kChannels>
__global__ void encode_pj_rotary_backward_kernel(AttentionDims dims, QkTransformParams transform,
                                                 const float* dq_encoded, const float* dk_encoded,
                                                 __nv_bfloat16* dqkv) {
  const bool is_key = blockIdx.y == 1;
  const float* dencoded = is_key ? dk_encoded : dq_encoded;
  const int channels = transform.jet_order + 1, width = pj_block_width(transform);
  const std::int64_t total = group_count(dims, width);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, transform.position_offset, is_key, width);
    const float* dy = dencoded + site.encoded + site.c0;
    __nv_bfloat16* dx = dqkv + site.qkv + site.c0;
    const PjShear<kChannels> shear(transform.shear_rate * site.position, channels, is_key);
    const PhaseRotation turn = rotation_by(site.position * transform.frequencies[site.c0 / width]);
    float w_re[kChannels] = {}, w_im[kChannels] = {};
#pragma unroll
    for (int r = 0; r < kChannels; ++r)
      if (r < channels) unrotate_pair(dy[2 * r], dy[2 * r + 1], turn, w_re[r], w_im[r]);
#pragma unroll
    for (int in = 0; in < kChannels; ++in) {
      if (in >= channels) break;
      float a = 0.0f, b = 0.0f;
#pragma unroll
      for (int out = 0; out < kChannels; ++out) {
        const float s = shear.at(out, in);
        a += s * w_re[out];
        b += s * w_im[out];
      }
      dx[2 * in] = __float2bfloat16(a);
      dx[2 * in + 1] = __float2bfloat16(b);
    }
  }
}

// blockIdx.y selects queries (0) or keys (1). RoPE with kGroup > 1 needs rotary_pairs % kGroup == 0,
// so that a group lies wholly among the first channels of pairs, the second ones, or the rest.
template <int kGroup>
__global__ void encode_qk_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                 __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded) {
  const bool is_key = blockIdx.y == 1;
  __nv_bfloat16* encoded = is_key ? k_encoded : q_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const std::int64_t total = group_count(dims, kGroup);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, transform.position_offset, is_key, kGroup);
    const __nv_bfloat16* x = qkv + site.qkv;
    __nv_bfloat16* y = encoded + site.encoded;
    const int c0 = site.c0;
    switch (transform.kind) {
      case QkTransformKind::identity:
        store_bf16<kGroup>(y + c0, load_bf16<kGroup>(x + c0));
        break;
      case QkTransformKind::rope:
        // Channels c < pairs write the pair (c, c + pairs); channels past 2·pairs pass through.
        if (c0 < pairs) {
          const Bf16Group<kGroup> first = load_bf16<kGroup>(x + c0), second = load_bf16<kGroup>(x + c0 + pairs);
          Bf16Group<kGroup> out_first, out_second;
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const PhaseRotation r = rope_phase_of(transform, site, c0 + k);
            float a, b;
            rotate_pair(first.get(k), second.get(k), r, a, b);
            out_first.set(k, a);
            out_second.set(k, b);
          }
          store_bf16<kGroup>(y + c0, out_first);
          store_bf16<kGroup>(y + c0 + pairs, out_second);
        } else if (c0 >= 2 * pairs) {
          store_bf16<kGroup>(y + c0, load_bf16<kGroup>(x + c0));
        }
        break;
      case QkTransformKind::pope: {
        const Bf16Group<kGroup> in = load_bf16<kGroup>(x + c0);
        Bf16Group<kGroup> real, imaginary;
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const PhaseRotation r = pope_phase_of(transform, site, is_key, dims, c0 + k);
          const float mu = pope_magnitude(transform.magnitude, in.get(k));
          real.set(k, mu * r.cos);
          imaginary.set(k, mu * r.sin);
        }
        store_bf16<kGroup>(y + c0, real);
        store_bf16<kGroup>(y + d + c0, imaginary);
        break;
      }
    }
  }
}

// blockIdx.y + first_side selects queries (0) or keys (1).
template <int kGroup>
__global__ void encode_qk_backward_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                          const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                                          int first_side) {
  const bool is_key = int(blockIdx.y) + first_side == 1;
  const float* dencoded = is_key ? dk_encoded : dq_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const std::int64_t total = group_count(dims, kGroup);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, transform.position_offset, is_key, kGroup);
    const float* dy = dencoded + site.encoded;
    __nv_bfloat16* dx = dqkv + site.qkv;
    const int c0 = site.c0;
    Bf16Group<kGroup> out;
    switch (transform.kind) {
      case QkTransformKind::identity: {
        const F32Group<kGroup> grad = load_f32<kGroup>(dy + c0);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) out.set(k, grad.element[k]);
        store_bf16<kGroup>(dx + c0, out);
        break;
      }
      case QkTransformKind::rope:
        if (c0 < pairs) {
          const F32Group<kGroup> first = load_f32<kGroup>(dy + c0), second = load_f32<kGroup>(dy + c0 + pairs);
          Bf16Group<kGroup> out_second;
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const PhaseRotation r = rope_phase_of(transform, site, c0 + k);
            float da, db;
            unrotate_pair(first.element[k], second.element[k], r, da, db);
            out.set(k, da);
            out_second.set(k, db);
          }
          store_bf16<kGroup>(dx + c0, out);
          store_bf16<kGroup>(dx + c0 + pairs, out_second);
        } else if (c0 >= 2 * pairs) {
          const F32Group<kGroup> grad = load_f32<kGroup>(dy + c0);
#pragma unroll
          for (int k = 0; k < kGroup; ++k) out.set(k, grad.element[k]);
          store_bf16<kGroup>(dx + c0, out);
        }
        break;
      case QkTransformKind::pope: {
        const Bf16Group<kGroup> in = load_bf16<kGroup>(qkv + site.qkv + c0);
        const F32Group<kGroup> real = load_f32<kGroup>(dy + c0), imaginary = load_f32<kGroup>(dy + d + c0);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const PhaseRotation r = pope_phase_of(transform, site, is_key, dims, c0 + k);
          const float dmu = pope_magnitude_grad(real.element[k], imaginary.element[k], r);
          out.set(k, dmu * pope_magnitude_derivative(transform.magnitude, in.get(k)));
        }
        store_bf16<kGroup>(dx + c0, out);
        break;
      }
    }
  }
}

constexpr int kDeltaChannels = 32;       // lanes ↔ channels
constexpr int kDeltaWarps = 8;           // warps ↔ interleaved rows of a chunk
constexpr int kDeltaRowsPerChunk = 256;  // rows n = b·T + t summed by one block

std::int64_t delta_chunks(const AttentionDims& dims) {
  return (std::int64_t(dims.batch) * dims.seq_len + kDeltaRowsPerChunk - 1) / kDeltaRowsPerChunk;
}

// Block (chunk, h, channel group): lane ↔ channel c, warp w sums the chunk's rows n ≡ w (mod
// kDeltaWarps) in increasing order, then warp 0 adds the warps' sums in warp order and writes
// the chunk's partial sum; delta_reduce_kernel adds the chunks in chunk order. A summation
// order fixed by the sizes alone, so the result is the same on every run. With dqkv set the
// same pass writes the keys' dL/dk into dqkv's k block (encode_qk_backward's numbers: the row's
// x, dk̃ and phase are what the sum reads), for every channel, δ in range or not.
__global__ void __launch_bounds__(kDeltaChannels* kDeltaWarps)
    pope_delta_partial_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                              const float* dk_encoded, float* partials, __nv_bfloat16* dqkv) {
  __shared__ float partial[kDeltaWarps][kDeltaChannels];
  const int lane = threadIdx.x % kDeltaChannels, warp = threadIdx.x / kDeltaChannels;
  const std::int64_t chunk = blockIdx.x;
  const int h = blockIdx.y, c = blockIdx.z * kDeltaChannels + lane;
  const int d = dims.head_dim, H = dims.n_head, T = dims.seq_len;
  const bool owns_channel = c < d;
  const float delta = owns_channel ? transform.delta[std::int64_t(h) * d + c] : 0.0f;
  const bool sums = owns_channel && pope_delta_in_range(delta);
  float sum = 0.0f;
  if (sums || (owns_channel && dqkv != nullptr)) {
    const std::int64_t channels = std::int64_t(H) * d, rows = std::int64_t(dims.batch) * T;
    const std::int64_t first = chunk * kDeltaRowsPerChunk + warp;
    const std::int64_t end = chunk * kDeltaRowsPerChunk + kDeltaRowsPerChunk < rows
                                 ? chunk * kDeltaRowsPerChunk + kDeltaRowsPerChunk
                                 : rows;
    // Row n = b·T + t, stepped along with n rather than divided out of it per row.
    std::int64_t b = first / T;
    int t = int(first % T);
#pragma unroll 4
    for (std::int64_t n = first; n < end; n += kDeltaWarps) {
      const std::int64_t key = n * 3 * channels + channels + std::int64_t(h) * d + c;
      const float x = __bfloat162float(qkv[key]);
      const float* dy = dk_encoded + ((b * H + h) * T + t) * dims.qk_width;
      const PhaseRotation r =
          transform.key_phases != nullptr
              ? tabulated_key_phase(transform, h, T, t, d, c)
              : pope_phase(double(transform.position_offset) + double(t), transform.frequencies[c], true, delta);
      if (sums) sum += pope_phase_grad(pope_magnitude(transform.magnitude, x), dy[c], dy[d + c], r);
      if (dqkv != nullptr)
        dqkv[key] = __float2bfloat16_rn(pope_magnitude_grad(dy[c], dy[d + c], r) *
                                        pope_magnitude_derivative(transform.magnitude, x));
      for (t += kDeltaWarps; t >= T; t -= T) ++b;
    }
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && owns_channel) {
    float total = 0.0f;
    for (int w = 0; w < kDeltaWarps; ++w) total += partial[w][lane];
    partials[(chunk * H + h) * d + c] = total;
  }
}

// Thread (h, c): dL/dδ_hc += Σ_chunk partials[chunk, h, c], chunks in increasing order.
__global__ void pope_delta_reduce_kernel(AttentionDims dims, std::int64_t chunks, const float* partials,
                                         float* delta_grad) {
  const std::int64_t count = std::int64_t(dims.n_head) * dims.head_dim;
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float total = 0.0f;
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partials[chunk * count + i];
  delta_grad[i] += total;
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

bool aligned_to(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// Calls launch(std::integral_constant<int, G>{}) with G = kVectorGroup when every channel group
// of 8 is one aligned vector in qkv, the encoded rows and (f32) their gradients, else G = 1.
template <class Launch>
cudaError_t with_group(const AttentionDims& dims, const QkTransformParams& transform, const void* qkv,
                       const void* encoded_a, const void* encoded_b, std::uintptr_t encoded_alignment,
                       Launch&& launch) {
  const bool pairs_fit = transform.kind != QkTransformKind::rope || transform.rotary_pairs % kVectorGroup == 0;
  const bool vectorizable = dims.head_dim % kVectorGroup == 0 && dims.qk_width % kVectorGroup == 0 && pairs_fit &&
                            aligned_to(qkv, 16) && aligned_to(encoded_a, encoded_alignment) &&
                            aligned_to(encoded_b, encoded_alignment);
  if (vectorizable) return launch(std::integral_constant<int, kVectorGroup>{});
  return launch(std::integral_constant<int, 1>{});
}

// Calls launch(std::integral_constant<int, N>{}) with the smallest register bound N ≥ K + 1 of
// 2, 4 and kPjRotaryMaxOrder + 1 (K = 0, 1 are the common orders; larger K take a slower kernel),
// or returns cudaErrorInvalidValue for an order outside [0, kPjRotaryMaxOrder] or a head_dim the
// block width does not divide.
template <class Launch>
cudaError_t with_pj_channels(const AttentionDims& dims, const QkTransformParams& transform, Launch&& launch) {
  const int channels = transform.jet_order + 1;
  if (transform.jet_order < 0 || transform.jet_order > kPjRotaryMaxOrder || transform.frequencies == nullptr ||
      dims.head_dim % pj_block_width(transform) != 0 || dims.qk_width != dims.head_dim)
    return cudaErrorInvalidValue;
  if (channels <= 2) return launch(std::integral_constant<int, 2>{});
  if (channels <= 4) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, kPjRotaryMaxOrder + 1>{});
}

cudaError_t encode_pj_rotary(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                             __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream) {
  return with_pj_channels(dims, transform, [&](auto bound) {
    constexpr int kChannels = decltype(bound)::value;
    const std::int64_t blocks = group_count(dims, pj_block_width(transform));
    encode_pj_rotary_kernel<kChannels>
        <<<dim3(grid_for(blocks), 2), kThreads, 0, stream>>>(dims, transform, qkv, q_encoded, k_encoded);
    return cudaGetLastError();
  });
}

cudaError_t encode_pj_rotary_backward(const AttentionDims& dims, const QkTransformParams& transform,
                                      const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                                      cudaStream_t stream) {
  return with_pj_channels(dims, transform, [&](auto bound) {
    constexpr int kChannels = decltype(bound)::value;
    const std::int64_t blocks = group_count(dims, pj_block_width(transform));
    encode_pj_rotary_backward_kernel<kChannels>
        <<<dim3(grid_for(blocks), 2), kThreads, 0, stream>>>(dims, transform, dq_encoded, dk_encoded, dqkv);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t encode_qk(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                      __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream) {
  if (group_count(dims, 1) == 0) return cudaSuccess;
  if (transform.kind == QkTransformKind::pj_rotary)
    return encode_pj_rotary(dims, transform, qkv, q_encoded, k_encoded, stream);
  return with_group(dims, transform, qkv, q_encoded, k_encoded, 16, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    encode_qk_kernel<kGroup><<<dim3(grid_for(group_count(dims, kGroup)), 2), kThreads, 0, stream>>>(
        dims, transform, qkv, q_encoded, k_encoded);
    return cudaGetLastError();
  });
}

cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream) {
  const int sides = (dq_encoded != nullptr) + (dk_encoded != nullptr), first_side = dq_encoded != nullptr ? 0 : 1;
  if (group_count(dims, 1) == 0 || sides == 0) return cudaSuccess;
  if (transform.kind == QkTransformKind::pj_rotary)
    return sides == 2 ? encode_pj_rotary_backward(dims, transform, dq_encoded, dk_encoded, dqkv, stream)
                      : cudaErrorInvalidValue;
  if (!aligned_to(dqkv, 16)) {  // the bf16 outputs must take 16-byte stores too
    encode_qk_backward_kernel<1><<<dim3(grid_for(group_count(dims, 1)), unsigned(sides)), kThreads, 0, stream>>>(
        dims, transform, qkv, dq_encoded, dk_encoded, dqkv, first_side);
    return cudaGetLastError();
  }
  return with_group(dims, transform, qkv, dq_encoded, dk_encoded, 32, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    encode_qk_backward_kernel<kGroup><<<dim3(grid_for(group_count(dims, kGroup)), unsigned(sides)), kThreads, 0,
                                        stream>>>(dims, transform, qkv, dq_encoded, dk_encoded, dqkv, first_side);
    return cudaGetLastError();
  });
}

std::size_t phase_table_entries(const QkTransformParams& transform, int seq_len, int head_dim) {
  return std::size_t(seq_len) * std::size_t(phase_table_width(transform, head_dim));
}

cudaError_t fill_phase_table(const QkTransformParams& transform, int seq_len, int head_dim, float2* table,
                             cudaStream_t stream) {
  const int width = phase_table_width(transform, head_dim);
  if (width == 0 || seq_len <= 0) return cudaSuccess;
  if (table == nullptr || transform.frequencies == nullptr) return cudaErrorInvalidValue;
  phase_table_kernel<<<grid_for(std::int64_t(seq_len) * width), kThreads, 0, stream>>>(
      seq_len, width, transform.position_offset, transform.frequencies, table);
  return cudaGetLastError();
}

std::size_t key_phase_table_entries(const QkTransformParams& transform, int n_head, int seq_len, int head_dim) {
  if (transform.kind != QkTransformKind::pope || transform.delta == nullptr) return 0;
  return std::size_t(n_head) * std::size_t(seq_len) * std::size_t(head_dim);
}

cudaError_t fill_key_phase_table(const QkTransformParams& transform, int n_head, int seq_len, int head_dim,
                                 float2* table, cudaStream_t stream) {
  const std::size_t entries = key_phase_table_entries(transform, n_head, seq_len, head_dim);
  if (entries == 0) return cudaSuccess;
  if (table == nullptr || transform.frequencies == nullptr) return cudaErrorInvalidValue;
  key_phase_table_kernel<<<grid_for(std::int64_t(entries)), kThreads, 0, stream>>>(n_head, seq_len, head_dim,
                                                                                  transform, table);
  return cudaGetLastError();
}

std::size_t pope_delta_gradient_partial_floats(const AttentionDims& dims) {
  return std::size_t(delta_chunks(dims)) * dims.n_head * dims.head_dim;
}

cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const float* dk_encoded, float* partials, float* delta_grad, __nv_bfloat16* dqkv,
                                cudaStream_t stream) {
  if (transform.kind != QkTransformKind::pope || transform.delta == nullptr || partials == nullptr)
    return cudaErrorInvalidValue;
  if (group_count(dims, 1) == 0) return cudaSuccess;
  const std::int64_t chunks = delta_chunks(dims);
  if (chunks > 0x7fffffff || dims.n_head > 65535) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(chunks), unsigned(dims.n_head),
                  unsigned((dims.head_dim + kDeltaChannels - 1) / kDeltaChannels));
  pope_delta_partial_kernel<<<grid, kDeltaChannels * kDeltaWarps, 0, stream>>>(dims, transform, qkv, dk_encoded,
                                                                               partials, dqkv);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const std::int64_t count = std::int64_t(dims.n_head) * dims.head_dim;
  pope_delta_reduce_kernel<<<unsigned((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(dims, chunks, partials,
                                                                                                  delta_grad);
  return cudaGetLastError();
}

}  // namespace pope::kernels
