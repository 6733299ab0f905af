// The q/k transform kernels. One thread per (position t, head h, group of kGroup consecutive
// channels) of one side, with the group fastest, looping over a slice of up to kSliceSequences
// sequences of the batch: the group's phases are formed once and serve the whole slice (that
// many times fewer angles or table reads than a thread per element; PoPE's key phases with δ
// depend on the head, so a table of them would cost as much as a slice of these). Slices
// rather than the whole batch, so that a training batch still gives several waves of threads.
// Reads of qkv and writes of the encoded rows are 16-byte vectors where the sizes allow
// (kGroup = 8), single elements otherwise. Angles come from double frequencies (see
// rotation_by in encoding_math.cuh) or RoPE's phase table. PJ-rotary mixes all 2(K+1)
// channels of a block, so its kernels take one block per thread (the same site arithmetic with
// the block as the group) instead of a fixed group.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "attention/encoding_math.cuh"
#include "attention/qk_transform.cuh"
#include "bf16_group.cuh"
#include "dependent_launch.cuh"

namespace pope::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;
constexpr int kSliceSequences = 8;  // sequences of the batch one thread transforms

// Where the kernels find a side's input rows x (the queries'; the keys' `key_columns` further on)
// and its encoded rows. A call's (call_layout): qkv's column blocks and [B, H, T, qk_width].
struct QkLayout {
  RowLayout x, encoded;
  std::int64_t key_columns = 0;
};

__host__ __device__ QkLayout call_layout(const AttentionDims& dims) {
  const std::int64_t channels = std::int64_t(dims.n_head) * dims.head_dim, row = 3 * channels;
  QkLayout layout;
  layout.x = {std::int64_t(dims.seq_len) * row, dims.head_dim, row};
  const std::int64_t encoded_head = std::int64_t(dims.seq_len) * dims.qk_width;
  layout.encoded = {dims.n_head * encoded_head, encoded_head, dims.qk_width};
  layout.key_columns = channels;
  return layout;
}

// Where one thread's channel group lives in the first sequence b0 of its slice: head h's q or k
// columns at row t of x (qkv), and its encoded row; the slice's sequence b0 + j adds j times
// BatchStride's offsets.
struct GroupSite {
  int c0;  // first channel of the group, 0..d−1
  int h;
  int t;                 // row of the call
  double position;       // absolute position of t
  std::int64_t encoded;  // offset of the encoded row (((b0·H + h)·T + t)·qk_width in a call)
  std::int64_t qkv;      // offset of the head's q or k columns of row t in x (row b0·T + t of qkv in a call)
  int sequences;         // sequences in the slice: b0 .. b0 + sequences − 1
};

// Offsets from one sequence of the batch to the next.
struct BatchStride {
  std::int64_t qkv;      // in x (T rows of 3·H·d in a call)
  std::int64_t encoded;  // in the encoded rows (H·T rows of qk_width in a call)
};

__device__ BatchStride batch_stride(const QkLayout& layout) { return {layout.x.sequence, layout.encoded.sequence}; }
__device__ BatchStride batch_stride(const AttentionDims& dims) { return batch_stride(call_layout(dims)); }

__host__ __device__ int batch_slices(const AttentionDims& dims) {
  return (dims.batch + kSliceSequences - 1) / kSliceSequences;
}

// (position, head, channel group) sites of one side in one slice of the batch.
__host__ __device__ std::int64_t site_count(const AttentionDims& dims, int group) {
  return std::int64_t(dims.seq_len) * dims.n_head * (dims.head_dim / group);
}

// Threads of one side: every site in every slice. The launchers refuse calls where this does not
// fit 32 bits, so that site_of splits its index with 32-bit divisions (a 64-bit one is a long
// instruction sequence).
__host__ __device__ std::int64_t thread_count(const AttentionDims& dims, int group) {
  return site_count(dims, group) * batch_slices(dims);
}

bool threads_fit_32_bits(const AttentionDims& dims) { return thread_count(dims, 1) <= 0xffffffffll; }

__device__ GroupSite site_at(const AttentionDims& dims, const QkLayout& layout, int offset, bool is_key, int slice,
                             int t, int h, int c0) {
  const std::int64_t b0 = std::int64_t(slice) * kSliceSequences;
  GroupSite site;
  site.c0 = c0;
  site.h = h;
  site.t = t;
  site.position = double(offset) + double(t);
  site.encoded = b0 * layout.encoded.sequence + h * layout.encoded.head + t * layout.encoded.row;
  site.qkv = b0 * layout.x.sequence + h * layout.x.head + t * layout.x.row + (is_key ? layout.key_columns : 0);
  site.sequences = int(dims.batch - b0 < kSliceSequences ? dims.batch - b0 : kSliceSequences);
  return site;
}

// Thread `index` of a launch with `group` channels per thread (group divides head_dim): sites
// fastest, group before head before position, then slices.
__device__ GroupSite site_of(std::int64_t index, const AttentionDims& dims, const QkLayout& layout, int offset,
                             bool is_key, int group) {
  const unsigned narrow = unsigned(index), groups = unsigned(dims.head_dim / group),
                 sites = unsigned(site_count(dims, group));
  const unsigned slice = narrow / sites, site = narrow - slice * sites;
  const unsigned head_row = site / groups, t = head_row / unsigned(dims.n_head);
  return site_at(dims, layout, offset, is_key, int(slice), int(t), int(head_row - t * unsigned(dims.n_head)),
                 int(site - head_row * groups) * group);
}

// The kGroup values at `at`: bf16 inputs, or an encoded row's gradient in f32 or bf16 (where
// the fused attention rounded it, AttentionGradients::dq_bf16); read through get(k) alike.
template <int kGroup, class Element>
__device__ VectorGroup<Element, kGroup> load_group_at(const Element* at) {
  return *reinterpret_cast<const VectorGroup<Element, kGroup>*>(at);
}
template <int kGroup>
__device__ void store_bf16(__nv_bfloat16* at, const Bf16Group<kGroup>& value) {
  *reinterpret_cast<Bf16Group<kGroup>*>(at) = value;
}

__device__ bool delta_applies(const QkTransformParams& transform, bool is_key) {
  return is_key && transform.delta != nullptr;
}

// Entry m of row t of the call's phase table.
__device__ PhaseRotation tabulated_phase(const QkTransformParams& transform, int t, int width, int m) {
  const float2 entry = transform.phases[std::int64_t(t) * width + m];
  return PhaseRotation{entry.x, entry.y};
}

// PoPE's phase of channel c at the site: p_t·ω_c, plus the acting δ_hc on keys with δ.
__device__ PhaseRotation pope_phase_of(const QkTransformParams& transform, const GroupSite& site, bool is_key,
                                       const AttentionDims& dims, int c) {
  const bool with_delta = delta_applies(transform, is_key);
  return pope_phase(site.position, transform.frequencies[c], with_delta, transform.clamp_delta,
                    with_delta ? transform.delta[std::int64_t(site.h) * dims.head_dim + c] : 0.0f);
}

__device__ PhaseRotation rope_phase_of(const QkTransformParams& transform, const GroupSite& site, bool is_key, int m) {
  if (is_key && transform.key_phases != nullptr) {
    const float2 entry = transform.key_phases[std::int64_t(site.t) * transform.rotary_pairs + m];
    return PhaseRotation{entry.x, entry.y};
  }
  if (transform.phases != nullptr) return tabulated_phase(transform, site.t, transform.rotary_pairs, m);
  return rotation_by(site.position * transform.frequencies[m]);
}

// Absolute position of the call's row 0 (QkTransformParams::position_offset_at).
__device__ inline int first_position(const QkTransformParams& transform) {
  return transform.position_offset_at != nullptr ? *transform.position_offset_at : transform.position_offset;
}

// Columns of the phase table: RoPE's rotary pairs; 0 for other transforms (PoPE's kernels form
// each site's phases once for the whole batch, which a table would not make cheaper).
__host__ __device__ int phase_table_width(const QkTransformParams& transform) {
  return transform.kind == QkTransformKind::rope ? transform.rotary_pairs : 0;
}

// Entry (t, m) = rotation_by(p_t · frequency_m) with p_t formed as GroupSite::position is, so
// that a tabulated phase is bitwise the one an encode kernel computes per site. With scale
// rates (xPos) the entries are scaled by e^{±r_m (p_t − centre)}, formed in double: the queries'
// table (+) in the first seq_len × width entries, the keys' (−) in the next.
__global__ void phase_table_kernel(int seq_len, int width, QkTransformParams transform, float2* table) {
  const std::int64_t rows = std::int64_t(seq_len) * width;
  const std::int64_t total = transform.scale_rates != nullptr ? 2 * rows : rows;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const bool key = i >= rows;
    const std::int64_t j = key ? i - rows : i;
    const int t = int(j / width), m = int(j % width);
    const double p = double(first_position(transform)) + double(t);
    const PhaseRotation r = rotation_by(p * transform.frequencies[m]);
    float scale = 1.0f;
    if (transform.scale_rates != nullptr) {
      const double exponent = transform.scale_rates[m] * (p - transform.scale_centre);
      scale = static_cast<float>(exp(key ? -exponent : exponent));
    }
    table[i] = make_float2(r.cos * scale, r.sin * scale);
  }
}

// ---------------------------------------------------------------- PJ-rotary (spec 5.2)

// Channels per PJ-rotary block: K + 1 complex channels (x_{2r}, x_{2r+1}).
__host__ __device__ int pj_block_width(const QkTransformParams& transform) { return 2 * (transform.jet_order + 1); }

// Thread = one block m of one (position, head), every sequence: y = R(ω_m p) · S(c_p) z with S
// the query's or the key's shear (PjShear), c_p = shear_rate · p, all in f32 from the bf16
// inputs; p and the angle in double (rotation_by's exact range reduction). kChannels ≥ K + 1
// bounds the register arrays; channels past K + 1 stay zero and are never stored.
template <int kChannels>
__global__ void encode_pj_rotary_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                        __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded) {
  const bool is_key = blockIdx.y == 1;
  __nv_bfloat16* encoded = is_key ? k_encoded : q_encoded;
  const int channels = transform.jet_order + 1, width = pj_block_width(transform);
  const BatchStride step = batch_stride(dims);
  const std::int64_t total = thread_count(dims, width);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, call_layout(dims), first_position(transform), is_key, width);
    const PjShear<kChannels> shear(transform.shear_rate * site.position, channels, is_key);
    const PhaseRotation turn = rotation_by(site.position * transform.frequencies[site.c0 / width]);
    for (int b = 0; b < site.sequences; ++b) {
      const __nv_bfloat16* x = qkv + site.qkv + b * step.qkv + site.c0;
      __nv_bfloat16* y = encoded + site.encoded + b * step.encoded + site.c0;
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
        float a = 0.0f, b_part = 0.0f;
#pragma unroll
        for (int in = 0; in < kChannels; ++in) {
          const float w = shear.at(out, in);
          a += w * re[in];
          b_part += w * im[in];
        }
        float ya, yb;
        rotate_pair(a, b_part, turn, ya, yb);
        y[2 * out] = __float2bfloat16(ya);
        y[2 * out + 1] = __float2bfloat16(yb);
      }
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
  const BatchStride step = batch_stride(dims);
  const std::int64_t total = thread_count(dims, width);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, call_layout(dims), first_position(transform), is_key, width);
    const PjShear<kChannels> shear(transform.shear_rate * site.position, channels, is_key);
    const PhaseRotation turn = rotation_by(site.position * transform.frequencies[site.c0 / width]);
    for (int b = 0; b < site.sequences; ++b) {
      const float* dy = dencoded + site.encoded + b * step.encoded + site.c0;
      __nv_bfloat16* dx = dqkv + site.qkv + b * step.qkv + site.c0;
      float w_re[kChannels] = {}, w_im[kChannels] = {};
#pragma unroll
      for (int r = 0; r < kChannels; ++r)
        if (r < channels) unrotate_pair(dy[2 * r], dy[2 * r + 1], turn, w_re[r], w_im[r]);
#pragma unroll
      for (int in = 0; in < kChannels; ++in) {
        if (in >= channels) break;
        float a = 0.0f, b_part = 0.0f;
#pragma unroll
        for (int out = 0; out < kChannels; ++out) {
          const float s = shear.at(out, in);
          a += s * w_re[out];
          b_part += s * w_im[out];
        }
        dx[2 * in] = __float2bfloat16(a);
        dx[2 * in + 1] = __float2bfloat16(b_part);
      }
    }
  }
}

// ---------------------------------------------------------------- identity, RoPE, PoPE

// The group copied unchanged into the encoded rows of the site's sequences (identity; RoPE's
// channels past its rotary pairs).
template <int kGroup>
__device__ void copy_group(const BatchStride& step, const GroupSite& site, const __nv_bfloat16* x, __nv_bfloat16* y) {
#pragma unroll 4
  for (int b = 0; b < site.sequences; ++b) store_bf16<kGroup>(y + b * step.encoded, load_group_at<kGroup>(x + b * step.qkv));
}

// The group's gradients rounded into the dqkv columns of the site's sequences (the backward
// of copy_group).
template <int kGroup, class Grad>
__device__ void round_group(const AttentionDims& dims, const GroupSite& site, const Grad* dy, __nv_bfloat16* dx) {
  const BatchStride step = batch_stride(dims);
#pragma unroll 4
  for (int b = 0; b < site.sequences; ++b) {
    const auto grad = load_group_at<kGroup>(dy + b * step.encoded);
    Bf16Group<kGroup> out;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) out.set(k, grad.get(k));
    store_bf16<kGroup>(dx + b * step.qkv, out);
  }
}

// blockIdx.y + first_side selects queries (0) or keys (1); `qkv` is the layout's x. RoPE with
// kGroup > 1 needs rotary_pairs % kGroup == 0, so that a group lies wholly among the first
// channels of pairs, the second ones, or the rest.
template <int kGroup>
__global__ void encode_qk_kernel(AttentionDims dims, QkTransformParams transform, QkLayout layout,
                                 const __nv_bfloat16* qkv, __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded,
                                 int first_side) {
  allow_dependents();
  wait_for_producer();
  const bool is_key = int(blockIdx.y) + first_side == 1;
  __nv_bfloat16* encoded = is_key ? k_encoded : q_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const BatchStride step = batch_stride(layout);
  const std::int64_t total = thread_count(dims, kGroup);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, layout, first_position(transform), is_key, kGroup);
    const int c0 = site.c0;
    const __nv_bfloat16* x = qkv + site.qkv + c0;
    __nv_bfloat16* y = encoded + site.encoded + c0;
    PhaseRotation r[kGroup];
    switch (transform.kind) {
      case QkTransformKind::identity:
        copy_group<kGroup>(step, site, x, y);
        break;
      case QkTransformKind::rope:
        // Channels c < pairs write the pair (c, c + pairs); channels past 2·pairs pass through.
        if (c0 < pairs) {
#pragma unroll
          for (int k = 0; k < kGroup; ++k) r[k] = rope_phase_of(transform, site, is_key, c0 + k);
#pragma unroll 4
          for (int b = 0; b < site.sequences; ++b) {
            const __nv_bfloat16* xb = x + b * step.qkv;
            const Bf16Group<kGroup> first = load_group_at<kGroup>(xb), second = load_group_at<kGroup>(xb + pairs);
            Bf16Group<kGroup> out_first, out_second;
#pragma unroll
            for (int k = 0; k < kGroup; ++k) {
              float a, b_out;
              rotate_pair(first.get(k), second.get(k), r[k], a, b_out);
              out_first.set(k, a);
              out_second.set(k, b_out);
            }
            store_bf16<kGroup>(y + b * step.encoded, out_first);
            store_bf16<kGroup>(y + b * step.encoded + pairs, out_second);
          }
        } else if (c0 >= 2 * pairs) {
          copy_group<kGroup>(step, site, x, y);
        }
        break;
      case QkTransformKind::pope: {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) r[k] = pope_phase_of(transform, site, is_key, dims, c0 + k);
#pragma unroll 4
        for (int b = 0; b < site.sequences; ++b) {
          const Bf16Group<kGroup> in = load_group_at<kGroup>(x + b * step.qkv);
          Bf16Group<kGroup> real, imaginary;
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const float mu = pope_magnitude(transform.magnitude, in.get(k));
            real.set(k, mu * r[k].cos);
            imaginary.set(k, mu * r[k].sin);
          }
          store_bf16<kGroup>(y + b * step.encoded, real);
          store_bf16<kGroup>(y + b * step.encoded + d, imaginary);
        }
        break;
      }
    }
  }
}

// blockIdx.y + first_side selects queries (0) or keys (1). Grad: the encoded gradients' type.
template <int kGroup, class Grad>
__global__ void encode_qk_backward_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                                          const Grad* dq_encoded, const Grad* dk_encoded, __nv_bfloat16* dqkv,
                                          int first_side) {
  const bool is_key = int(blockIdx.y) + first_side == 1;
  const Grad* dencoded = is_key ? dk_encoded : dq_encoded;
  const int d = dims.head_dim, pairs = transform.rotary_pairs;
  const BatchStride step = batch_stride(dims);
  const std::int64_t total = thread_count(dims, kGroup);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const GroupSite site = site_of(i, dims, call_layout(dims), first_position(transform), is_key, kGroup);
    const int c0 = site.c0;
    const Grad* dy = dencoded + site.encoded + c0;
    __nv_bfloat16* dx = dqkv + site.qkv + c0;
    PhaseRotation r[kGroup];
    switch (transform.kind) {
      case QkTransformKind::identity:
        round_group<kGroup>(dims, site, dy, dx);
        break;
      case QkTransformKind::rope:
        if (c0 < pairs) {
#pragma unroll
          for (int k = 0; k < kGroup; ++k) r[k] = rope_phase_of(transform, site, is_key, c0 + k);
#pragma unroll 4
          for (int b = 0; b < site.sequences; ++b) {
            const Grad* dyb = dy + b * step.encoded;
            const auto first = load_group_at<kGroup>(dyb), second = load_group_at<kGroup>(dyb + pairs);
            Bf16Group<kGroup> out_first, out_second;
#pragma unroll
            for (int k = 0; k < kGroup; ++k) {
              float da, db;
              unrotate_pair(first.get(k), second.get(k), r[k], da, db);
              out_first.set(k, da);
              out_second.set(k, db);
            }
            store_bf16<kGroup>(dx + b * step.qkv, out_first);
            store_bf16<kGroup>(dx + b * step.qkv + pairs, out_second);
          }
        } else if (c0 >= 2 * pairs) {
          round_group<kGroup>(dims, site, dy, dx);
        }
        break;
      case QkTransformKind::pope: {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) r[k] = pope_phase_of(transform, site, is_key, dims, c0 + k);
#pragma unroll 4
        for (int b = 0; b < site.sequences; ++b) {
          const Bf16Group<kGroup> in = load_group_at<kGroup>(qkv + site.qkv + b * step.qkv + c0);
          const Grad* dyb = dy + b * step.encoded;
          const auto real = load_group_at<kGroup>(dyb), imaginary = load_group_at<kGroup>(dyb + d);
          Bf16Group<kGroup> out;
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const float dmu = pope_magnitude_grad(real.get(k), imaginary.get(k), r[k]);
            out.set(k, dmu * pope_magnitude_derivative(transform.magnitude, in.get(k)));
          }
          store_bf16<kGroup>(dx + b * step.qkv, out);
        }
        break;
      }
    }
  }
}

// ---------------------------------------------------------------- PoPE's δ gradient

constexpr int kDeltaThreads = 256;

// How the δ pass tiles a call: a block takes `positions` consecutive positions of one head in
// one slice of the batch, its threads `groups` channel groups of each (group fastest); `slabs`
// blocks side by side cover head_dim when it has more than kDeltaThreads groups. A chunk is one
// block row of positions; each (slice, chunk) leaves one partial sum per (head, channel).
struct DeltaTiling {
  int groups;     // channel groups per block
  int positions;  // positions per block
  int slabs;      // blocks across the channel groups of a head
  int slices;     // batch_slices
  std::int64_t chunks;
};

__host__ __device__ DeltaTiling delta_tiling(const AttentionDims& dims, int group) {
  const int head_groups = dims.head_dim / group;
  DeltaTiling tiling;
  tiling.groups = head_groups < kDeltaThreads ? head_groups : kDeltaThreads;
  tiling.positions = kDeltaThreads / tiling.groups;
  tiling.slabs = (head_groups + tiling.groups - 1) / tiling.groups;
  tiling.slices = batch_slices(dims);
  tiling.chunks = (dims.seq_len + tiling.positions - 1) / tiling.positions;
  return tiling;
}

// Thread = one (position t, head h, channel group) of the keys in one slice of the batch: it
// forms the group's phases once, adds dφ of its channels over the slice's sequences in order
// and, with dqkv set, writes each sequence's dL/dk into dqkv's k block (encode_qk_backward's
// numbers: the sum reads the same x, dk̃ and phase). The block then adds its positions' sums in
// a fixed tree into its (slice, chunk) partial sum; pope_delta_reduce_kernel adds those in
// order. A summation order fixed by the sizes (and the group width) alone, so the result is the
// same on every run. blockIdx.z = slice · slabs + slab.
template <int kGroup, class Grad>
__global__ void __launch_bounds__(kDeltaThreads)
    pope_delta_partial_kernel(AttentionDims dims, QkTransformParams transform, const __nv_bfloat16* qkv,
                              const Grad* dk_encoded, float* partials, __nv_bfloat16* dqkv) {
  __shared__ float partial[kGroup][kDeltaThreads];  // [channel of the group][thread]: conflict-free rows
  const DeltaTiling tiling = delta_tiling(dims, kGroup);
  const int slot = int(threadIdx.x) % tiling.groups, row = int(threadIdx.x) / tiling.groups;
  const int slice = int(blockIdx.z) / tiling.slabs, slab = int(blockIdx.z) - slice * tiling.slabs;
  const int d = dims.head_dim, h = blockIdx.y, c0 = (slab * tiling.groups + slot) * kGroup;
  const int t = int(blockIdx.x) * tiling.positions + row;
  const bool owns_group = row < tiling.positions && c0 < d;
  float sum[kGroup] = {};
  if (owns_group && t < dims.seq_len) {
    const GroupSite site = site_at(dims, call_layout(dims), first_position(transform), true, slice, t, h, c0);
    PhaseRotation r[kGroup];
    bool sums[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      r[k] = pope_phase_of(transform, site, true, dims, c0 + k);
      sums[k] = pope_delta_passes_gradient(transform.clamp_delta, transform.delta[std::int64_t(h) * d + c0 + k]);
    }
    const BatchStride step = batch_stride(dims);
#pragma unroll 4
    for (int b = 0; b < site.sequences; ++b) {
      const std::int64_t key = site.qkv + b * step.qkv + c0;
      const Bf16Group<kGroup> x = load_group_at<kGroup>(qkv + key);
      const Grad* dy = dk_encoded + site.encoded + b * step.encoded + c0;
      const auto real = load_group_at<kGroup>(dy), imaginary = load_group_at<kGroup>(dy + d);
      Bf16Group<kGroup> dk;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const ValueAndDerivative mu = pope_magnitude_parts(transform.magnitude, x.get(k));
        if (sums[k]) sum[k] += pope_phase_grad(mu.value, real.get(k), imaginary.get(k), r[k]);
        dk.set(k, pope_magnitude_grad(real.get(k), imaginary.get(k), r[k]) * mu.derivative);
      }
      if (dqkv != nullptr) store_bf16<kGroup>(dqkv + key, dk);
    }
  }
#pragma unroll
  for (int k = 0; k < kGroup; ++k) partial[k][threadIdx.x] = sum[k];
  __syncthreads();
  // The block's positions summed as a fixed binary tree (row r takes in row r + stride, strides
  // halving): every thread adds at each level, where one thread per group adding all the rows
  // in turn left the rest of the block waiting.
  int stride = 1;
  while (2 * stride < tiling.positions) stride *= 2;
  for (; stride >= 1; stride /= 2) {
    if (row < stride && row + stride < tiling.positions) {
#pragma unroll
      for (int k = 0; k < kGroup; ++k) partial[k][threadIdx.x] += partial[k][threadIdx.x + stride * tiling.groups];
    }
    __syncthreads();
  }
  if (row == 0 && c0 < d) {
#pragma unroll
    for (int k = 0; k < kGroup; ++k)
      partials[((std::int64_t(slice) * tiling.chunks + blockIdx.x) * dims.n_head + h) * d + c0 + k] =
          partial[k][threadIdx.x];
  }
}

constexpr int kReduceLanes = 32;  // lanes ↔ consecutive (head, channel) entries
constexpr int kReduceWarps = 8;   // warps ↔ interleaved partial sums

// Block = 32 consecutive entries i = h·d + c: warp w adds the partial sums w, w + 8, … in
// order (a few hundred of them, so one thread per entry adding them all made a long chain
// of dependent loads), then warp 0 adds the warps' totals in warp order:
// dL/dδ_hc += Σ partials[slice, chunk, h, c] in a fixed order.
__global__ void __launch_bounds__(kReduceLanes* kReduceWarps)
    pope_delta_reduce_kernel(AttentionDims dims, std::int64_t sums, const float* partials, float* delta_grad) {
  __shared__ float warp_total[kReduceWarps][kReduceLanes];
  const int lane = int(threadIdx.x) % kReduceLanes, warp = int(threadIdx.x) / kReduceLanes;
  const std::int64_t count = std::int64_t(dims.n_head) * dims.head_dim;
  const std::int64_t i = std::int64_t(blockIdx.x) * kReduceLanes + lane;
  float total = 0.0f;
  if (i < count) {
#pragma unroll 4
    for (std::int64_t sum = warp; sum < sums; sum += kReduceWarps) total += partials[sum * count + i];
  }
  warp_total[warp][lane] = total;
  __syncthreads();
  if (warp == 0 && i < count) {
    float all = 0.0f;
    for (int w = 0; w < kReduceWarps; ++w) all += warp_total[w][lane];
    delta_grad[i] += all;
  }
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

bool aligned_to(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// A scaled rotation is only defined through its two tables (fill_phase_table).
bool scaled_without_tables(const QkTransformParams& transform) {
  return transform.scale_rates != nullptr && (transform.phases == nullptr || transform.key_phases == nullptr);
}

// Nothing to transform: an empty batch, no positions, heads or channels.
bool nothing_to_do(const AttentionDims& dims) { return dims.batch <= 0 || site_count(dims, 1) == 0; }

// Calls launch(std::integral_constant<int, G>{}) with G = kVectorGroup when every channel group
// of 8 is one aligned 16-byte vector (two for f32 rows) at every pointer (null ones aside) and
// every stride of `layouts` (a call's are multiples of the head dim), else G = 1.
template <class Launch>
cudaError_t with_group(const AttentionDims& dims, const QkTransformParams& transform,
                       std::initializer_list<const void*> pointers, Launch&& launch,
                       std::initializer_list<RowLayout> layouts = {}) {
  const bool pairs_fit = transform.kind != QkTransformKind::rope || transform.rotary_pairs % kVectorGroup == 0;
  bool vectorizable = dims.head_dim % kVectorGroup == 0 && dims.qk_width % kVectorGroup == 0 && pairs_fit;
  for (const void* pointer : pointers) vectorizable = vectorizable && aligned_to(pointer, 16);
  for (const RowLayout& rows : layouts)
    vectorizable = vectorizable && rows.sequence % kVectorGroup == 0 && rows.head % kVectorGroup == 0 &&
                   rows.row % kVectorGroup == 0;
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
    encode_pj_rotary_kernel<kChannels><<<dim3(grid_for(thread_count(dims, pj_block_width(transform))), 2), kThreads, 0,
                                         stream>>>(dims, transform, qkv, q_encoded, k_encoded);
    return cudaGetLastError();
  });
}

cudaError_t encode_pj_rotary_backward(const AttentionDims& dims, const QkTransformParams& transform,
                                      const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                                      cudaStream_t stream) {
  return with_pj_channels(dims, transform, [&](auto bound) {
    constexpr int kChannels = decltype(bound)::value;
    encode_pj_rotary_backward_kernel<kChannels><<<dim3(grid_for(thread_count(dims, pj_block_width(transform))), 2),
                                                  kThreads, 0, stream>>>(dims, transform, dq_encoded, dk_encoded,
                                                                         dqkv);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t encode_qk(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                      __nv_bfloat16* q_encoded, __nv_bfloat16* k_encoded, cudaStream_t stream) {
  if (nothing_to_do(dims)) return cudaSuccess;
  if (!threads_fit_32_bits(dims) || scaled_without_tables(transform)) return cudaErrorInvalidValue;
  if (transform.kind == QkTransformKind::pj_rotary)
    return encode_pj_rotary(dims, transform, qkv, q_encoded, k_encoded, stream);
  return with_group(dims, transform, {qkv, q_encoded, k_encoded}, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    return launch_dependent(encode_qk_kernel<kGroup>, dim3(grid_for(thread_count(dims, kGroup)), 2), dim3(kThreads),
                            stream, dims, transform, call_layout(dims), qkv, q_encoded, k_encoded, 0);
  });
}

RowLayout qkv_rows(const AttentionDims& dims) { return call_layout(dims).x; }

RowLayout cache_rows(int n_head, int capacity, int width) {
  const std::int64_t head = std::int64_t(capacity) * width;
  return {n_head * head, head, width};
}

cudaError_t encode_keys(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* x,
                        const RowLayout& x_rows, __nv_bfloat16* k_encoded, const RowLayout& encoded_rows,
                        cudaStream_t stream) {
  if (nothing_to_do(dims)) return cudaSuccess;
  // PJ-rotary has kernels of its own, which take a call's layout only.
  if (!threads_fit_32_bits(dims) || scaled_without_tables(transform) || transform.kind == QkTransformKind::pj_rotary)
    return cudaErrorInvalidValue;
  QkLayout layout;
  layout.x = x_rows;
  layout.encoded = encoded_rows;
  return with_group(
      dims, transform, {x, k_encoded},
      [&](auto group) {
        constexpr int kGroup = decltype(group)::value;
        return launch_dependent(encode_qk_kernel<kGroup>, dim3(grid_for(thread_count(dims, kGroup)), 1),
                                dim3(kThreads), stream, dims, transform, layout, x, nullptr, k_encoded, 1);
      },
      {x_rows, encoded_rows});
}

namespace {

template <class Grad>
cudaError_t encode_qk_backward_from(const AttentionDims& dims, const QkTransformParams& transform,
                                    const __nv_bfloat16* qkv, const Grad* dq_encoded, const Grad* dk_encoded,
                                    __nv_bfloat16* dqkv, cudaStream_t stream) {
  const int sides = (dq_encoded != nullptr) + (dk_encoded != nullptr), first_side = dq_encoded != nullptr ? 0 : 1;
  if (nothing_to_do(dims) || sides == 0) return cudaSuccess;
  if (!threads_fit_32_bits(dims) || scaled_without_tables(transform)) return cudaErrorInvalidValue;
  if (transform.kind == QkTransformKind::pj_rotary) {
    if constexpr (std::is_same_v<Grad, float>) {
      if (sides == 2) return encode_pj_rotary_backward(dims, transform, dq_encoded, dk_encoded, dqkv, stream);
    }
    return cudaErrorInvalidValue;
  }
  return with_group(dims, transform, {qkv, dq_encoded, dk_encoded, dqkv}, [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    encode_qk_backward_kernel<kGroup, Grad><<<dim3(grid_for(thread_count(dims, kGroup)), unsigned(sides)), kThreads,
                                              0, stream>>>(dims, transform, qkv, dq_encoded, dk_encoded, dqkv,
                                                           first_side);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const float* dq_encoded, const float* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream) {
  return encode_qk_backward_from(dims, transform, qkv, dq_encoded, dk_encoded, dqkv, stream);
}

cudaError_t encode_qk_backward(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                               const __nv_bfloat16* dq_encoded, const __nv_bfloat16* dk_encoded, __nv_bfloat16* dqkv,
                               cudaStream_t stream) {
  return encode_qk_backward_from(dims, transform, qkv, dq_encoded, dk_encoded, dqkv, stream);
}

std::size_t phase_table_entries(const QkTransformParams& transform, int seq_len) {
  const std::size_t rows = std::size_t(seq_len) * std::size_t(phase_table_width(transform));
  return transform.scale_rates != nullptr ? 2 * rows : rows;
}

cudaError_t fill_phase_table(const QkTransformParams& transform, int seq_len, float2* table, cudaStream_t stream) {
  const int width = phase_table_width(transform);
  if (width == 0 || seq_len <= 0) return cudaSuccess;
  if (table == nullptr || transform.frequencies == nullptr) return cudaErrorInvalidValue;
  phase_table_kernel<<<grid_for(std::int64_t(phase_table_entries(transform, seq_len))), kThreads, 0, stream>>>(
      seq_len, width, transform, table);
  return cudaGetLastError();
}

std::size_t pope_delta_gradient_partial_floats(const AttentionDims& dims) {
  // Single channels make the most chunks (the fewest positions per block) of either group width.
  const DeltaTiling tiling = delta_tiling(dims, 1);
  return std::size_t(tiling.chunks) * std::size_t(tiling.slices) * dims.n_head * dims.head_dim;
}

namespace {

template <class Grad>
cudaError_t pope_delta_gradient_from(const AttentionDims& dims, const QkTransformParams& transform,
                                     const __nv_bfloat16* qkv, const Grad* dk_encoded, float* partials,
                                     float* delta_grad, __nv_bfloat16* dqkv, cudaStream_t stream) {
  if (transform.kind != QkTransformKind::pope || transform.delta == nullptr || partials == nullptr)
    return cudaErrorInvalidValue;
  if (nothing_to_do(dims)) return cudaSuccess;
  if (dims.n_head > 65535) return cudaErrorInvalidValue;
  return with_group(dims, transform, {qkv, dk_encoded, dqkv}, [&](auto group) {
    // Four channels per thread where eight could be moved: the pass keeps a phase, a sum and
    // its loads per channel in registers, and at eight it took 105 registers (two blocks per
    // SM, 155 µs at the 124M shape against 133 µs with four at 76 registers).
    constexpr int kGroup = decltype(group)::value == 1 ? 1 : kVectorGroup / 2;
    const DeltaTiling tiling = delta_tiling(dims, kGroup);
    if (tiling.chunks > 0x7fffffff || std::int64_t(tiling.slabs) * tiling.slices > 65535) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(tiling.chunks), unsigned(dims.n_head), unsigned(tiling.slabs * tiling.slices));
    pope_delta_partial_kernel<kGroup, Grad><<<grid, kDeltaThreads, 0, stream>>>(dims, transform, qkv, dk_encoded,
                                                                                partials, dqkv);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    const std::int64_t count = std::int64_t(dims.n_head) * dims.head_dim;
    pope_delta_reduce_kernel<<<unsigned((count + kReduceLanes - 1) / kReduceLanes), kReduceLanes * kReduceWarps, 0,
                               stream>>>(dims, tiling.chunks * tiling.slices, partials, delta_grad);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const float* dk_encoded, float* partials, float* delta_grad, __nv_bfloat16* dqkv,
                                cudaStream_t stream) {
  return pope_delta_gradient_from(dims, transform, qkv, dk_encoded, partials, delta_grad, dqkv, stream);
}

cudaError_t pope_delta_gradient(const AttentionDims& dims, const QkTransformParams& transform, const __nv_bfloat16* qkv,
                                const __nv_bfloat16* dk_encoded, float* partials, float* delta_grad,
                                __nv_bfloat16* dqkv, cudaStream_t stream) {
  return pope_delta_gradient_from(dims, transform, qkv, dk_encoded, partials, delta_grad, dqkv, stream);
}

}  // namespace pope::kernels
