// Host side of causal attention on the GPU: validates the call, reads the encoding's plan
// (pope/position_plan.hpp; the encoding's type is never looked at), keeps its small tables
// (frequencies, bias, lag buckets) on the device, and runs the kernels of kernels/attention/
// over scratch that grows once per larger shape:
//   forward:  encode q̃, k̃ (bf16) → causal attention → out (bf16), lse (f32)
//   backward: encode q̃, k̃ again → dq̃, dk̃ (f32) and dv → transform backward → dqkv (bf16),
//             plus the encoding's parameter gradients (PoPE's δ; a learned bias's parameters
//             from the fused kernel's diagonal sums Ĝ), accumulated in f32.
//   decode:   encode the new rows' q̃, k̃ → attention over the key/value cache, appending to it
//             (dynamic NTK first encodes the cache's raw keys again at the new length).
// A learned bias (a PJ-bias, lag buckets: cuda/learned_bias.hpp) has its table built on the
// device from the layer's parameters, on a side stream while q̃, k̃ are encoded; the forward
// keeps it with q̃, k̃ for the backward, which reduces Ĝ and the parameters' gradients on that
// stream beside the query kernel.
// The attention itself runs on the fused tensor-core kernels (flash_attention.cuh) where they
// handle the widths, else on the simple kernels (causal_attention.cuh); `use_flash` is the one
// place that chooses. With attention.impl = cudnn (AttentionForward::impl) cuDNN's fused SDPA
// (cudnn_attention.hpp) takes the place of both on the same q̃, k̃, for encodings without a
// score bias; the transforms, their backward and δ's gradient stay ours.
// Tables are uploaded only when their values change, so steady-state steps of one shape
// neither allocate nor copy from the host (a requirement for CUDA graph capture). A captured
// graph holds the scratch and table pointers: calls of another shape or encoding on the
// same runner (e.g. evaluation at another length) may grow the scratch or rewrite a table,
// so give those calls their own runner.
#include "cuda/cuda_attention.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attention/causal_attention.cuh"
#include "attention/decode_attention.cuh"
#include "attention/flash_attention.cuh"
#include "attention/qk_transform.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_tensor_checks.hpp"
#include "cuda/cudnn_attention.hpp"
#include "cuda/device_scratch.hpp"
#include "cuda/learned_bias.hpp"
#include "cuda/side_stream.hpp"
#include "model/attention_checks.hpp"

namespace pope::cuda {

namespace {

using kernels::AttentionDims;
using kernels::QkTransformKind;
using kernels::QkTransformParams;

template <class T>
T* reserve_elements(DeviceScratch& scratch, std::size_t count) {
  return static_cast<T*>(scratch.reserve(count * sizeof(T)));
}

// A device copy of a small host table, re-uploaded only when its values change. The host
// copy is kept so that the comparison needs no device read.
template <class T>
class DeviceTable {
 public:
  const T* upload(const std::vector<T>& values, cudaStream_t stream) {
    T* device = reserve_elements<T>(scratch_, values.size());
    const bool same = device == uploaded_to_ && values.size() == host_.size() &&
                      std::memcmp(values.data(), host_.data(), values.size() * sizeof(T)) == 0;
    if (!same) {
      host_ = values;
      POPE_CUDA_CHECK(cudaMemcpyAsync(device, host_.data(), host_.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
      uploaded_to_ = device;
      scratch_changes().fetch_add(1, std::memory_order_relaxed);
    }
    return device;
  }

  std::size_t bytes() const { return scratch_.bytes(); }

 private:
  std::vector<T> host_;
  const T* uploaded_to_ = nullptr;
  DeviceScratch scratch_;
};

// The call's sizes, validated against the tensors and the position context.
// Width of q̃ and k̃: the encoding's transform may widen them (PoPE: 2·head_dim).
int qk_width_of(const PositionEncoding& encoding, int head_dim) {
  return encoding.transforms_qk() ? encoding.qk_width(head_dim) : head_dim;
}

AttentionDims check_call(std::string_view op, const AttentionShape& shape, const PositionEncoding* encoding,
                         const PositionContext& ctx, const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  checks::check_attention_call(op, shape, encoding, ctx);
  require(shape.seq_len <= kernels::kMaxAttentionSeqLen, op,
          fmt::format("seq_len {} exceeds the {} positions the GPU kernels support", shape.seq_len,
                      kernels::kMaxAttentionSeqLen));
  AttentionDims dims;
  dims.batch = shape.batch;
  dims.seq_len = shape.seq_len;
  dims.n_head = shape.n_head;
  dims.head_dim = shape.head_dim;
  dims.qk_width = qk_width_of(*encoding, shape.head_dim);
  require(dims.qk_width >= dims.head_dim && dims.qk_width <= kernels::kMaxAttentionWidth, op,
          fmt::format("encoding '{}' with head_dim {} gives q/k width {}; the GPU kernels support head_dim ≤ q/k "
                      "width ≤ {}",
                      encoding->kind(), shape.head_dim, dims.qk_width, kernels::kMaxAttentionWidth));
  const std::int64_t rows = std::int64_t(shape.batch) * shape.seq_len;
  const std::int64_t channels = std::int64_t(shape.n_head) * shape.head_dim;
  check_matrix(op, "qkv", qkv, DType::bf16, rows, 3 * channels);
  check_matrix(op, "out", out, DType::bf16, rows, channels);
  check_vector(op, "lse", lse, DType::f32, std::int64_t(shape.batch) * shape.n_head * shape.seq_len);
  return dims;
}

// Device pointers of this layer's position parameters (or gradients), one per
// layer_parameters() entry, f32 on the device.
std::vector<float*> parameter_pointers(std::string_view op, std::string_view name, std::span<const Tensor> tensors,
                                       const PositionEncoding& encoding, const AttentionDims& dims) {
  const std::vector<ParamSpec> specs = encoding.layer_parameters(dims.n_head, dims.head_dim);
  require(tensors.size() == specs.size(), op,
          fmt::format("{} has {} tensors, encoding '{}' has {} layer parameters", name, tensors.size(), encoding.kind(),
                      specs.size()));
  std::vector<float*> pointers;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    check_vector(op, fmt::format("{}[{}] ({})", name, i, specs[i].name), tensors[i], DType::f32,
                 shape_numel(specs[i].shape));
    pointers.push_back(static_cast<float*>(tensors[i].data));
  }
  return pointers;
}

// The single dispatch point between the fused and the simple attention kernels.
bool use_flash(const AttentionDims& dims, const kernels::EncodedAttention& in, const void* dout = nullptr) {
  const bool dout_aligned = dout == nullptr || reinterpret_cast<std::uintptr_t>(dout) % 16 == 0;
  return dout_aligned && kernels::flash_attention_supports(dims, in);
}

// cuDNN's SDPA takes q̃, k̃, v and a scale: an encoding that adds a score bias cannot run on it.
void check_impl(std::string_view op, AttentionImpl impl, const PositionEncoding& encoding,
                const kernels::ScoreParams& score) {
  if (impl != AttentionImpl::cudnn) return;
  require(score.bias == nullptr, op,
          fmt::format("attention.impl is cudnn, but encoding '{}' adds a score bias, which cuDNN's SDPA does not take "
                      "(expected attention.impl fused, or an encoding without a bias: nope, rope, pope, pj_rotary)",
                      encoding.kind()));
}

#ifndef POPE_HAVE_CUDNN
[[noreturn]] void throw_built_without_cudnn(std::string_view op) {
  throw std::runtime_error(fmt::format("{}: attention.impl is cudnn, but this build has no cuDNN (cudnn_graph.h or "
                                       "libcudnn was not found next to the CUDA toolkit at configure time)",
                                       op));
}
#endif

// Elements of q̃ (or k̃) of a call: [B, H, T, W].
std::size_t encoded_elements(const AttentionDims& dims) {
  return std::size_t(dims.batch) * dims.n_head * dims.seq_len * dims.qk_width;
}

// A decode call's cache of raw keys (KvCacheLayer::raw_keys, dynamic NTK): the new rows' raw keys
// into its rows [p0, p0 + n), then its rows [0, p0) encoded again with `transform` (this call's
// frequencies) into the cache's keys. The CPU encodes rows [0, p0 + n) again; the decode kernel
// appends the new rows' k̃ from encode_qk, the same values, itself. The host's p0 sizes the work:
// such steps are never recorded, so it is the one in `past`.
void encode_cached_keys_again(const AttentionDims& dims, int capacity, int p0, const QkTransformParams& transform,
                              const __nv_bfloat16* qkv, __nv_bfloat16* raw_keys, __nv_bfloat16* keys,
                              cudaStream_t stream) {
  AttentionDims raw = dims;
  raw.qk_width = dims.head_dim;
  const kernels::RowLayout raw_rows = kernels::cache_rows(dims.n_head, capacity, dims.head_dim);
  const std::int64_t channels = std::int64_t(dims.n_head) * dims.head_dim;
  POPE_CUDA_CHECK(kernels::encode_keys(raw, QkTransformParams{}, qkv + channels, kernels::qkv_rows(dims),
                                       raw_keys + std::int64_t(p0) * dims.head_dim, raw_rows, stream));
  AttentionDims cached = dims;
  cached.seq_len = p0;
  QkTransformParams from_zero = transform;  // positions 0 … p0 − 1
  from_zero.position_offset = 0;
  from_zero.position_offset_at = nullptr;
  from_zero.phases = from_zero.key_phases = nullptr;  // a phase table would hold the new rows' positions
  POPE_CUDA_CHECK(kernels::encode_keys(cached, from_zero, raw_keys, raw_rows, keys,
                                       kernels::cache_rows(dims.n_head, capacity, dims.qk_width), stream));
}

// The context of a call of this shape, for questions whose answer does not depend on the
// positions (whether the bias is learned).
PositionContext shape_context(const AttentionShape& shape) {
  PositionContext ctx;
  ctx.seq_len = shape.seq_len;
  ctx.n_head = shape.n_head;
  ctx.head_dim = shape.head_dim;
  return ctx;
}

bool has_learned_bias(const PositionEncoding& encoding, const PositionContext& ctx) {
  return encoding.has_score_bias() && encoding.bias_plan(ctx).learned();
}

// bf16 slots of AttentionForward::encoded after q̃ and k̃ that keep a learned bias's f32 [H, T]
// table from the forward, which the backward then reads instead of building it again.
std::size_t kept_table_slots(bool learned_bias, int n_head, int seq_len) {
  return learned_bias ? 2 * std::size_t(n_head) * std::size_t(seq_len) : 0;
}

// AttentionForward/Backward::encoded must be empty or hold exactly the call's q̃, k̃ (and table) in bf16.
void check_encoded(std::string_view op, const Tensor& encoded, const AttentionDims& dims, bool learned_bias) {
  if (encoded.empty()) return;
  const std::size_t slots = 2 * encoded_elements(dims) + kept_table_slots(learned_bias, dims.n_head, dims.seq_len);
  check_vector(op, "encoded", encoded, DType::bf16, std::int64_t(slots));
}

}  // namespace

struct AttentionRunner::Scratch {
  DeviceScratch q, k, dq, dk, row_dot, decode_partials, decode_counters, bias_grad_partials, delta_grad_partials, learned_table, learned_diag_grad,
      learned_partials, phases;
  DeviceTable<double> frequencies, scale_rates;
  DeviceTable<float> bias, bias_slopes;
  DeviceTable<int> bucket_of_lag, bucket_starts;
  SideStream side;  // a learned bias's small kernels, beside the attention's big ones
  std::size_t decode_counters_zeroed = 0;  // the counters' block size when its zeros were queued
#ifdef POPE_HAVE_CUDNN
  std::unique_ptr<CudnnAttention> cudnn;  // created on the first cudnn call (cudnnCreate is not free)
#endif

  void cudnn_forward(std::string_view op, const AttentionDims& dims, const CudnnAttentionForward& args,
                     cudaStream_t stream) {
#ifdef POPE_HAVE_CUDNN
    (void)op;
    if (!cudnn) cudnn = std::make_unique<CudnnAttention>();
    cudnn->forward(dims, args, stream);
#else
    (void)dims, (void)args, (void)stream;
    throw_built_without_cudnn(op);
#endif
  }

  void cudnn_backward(std::string_view op, const AttentionDims& dims, const CudnnAttentionBackward& args,
                      cudaStream_t stream) {
#ifdef POPE_HAVE_CUDNN
    (void)op;
    if (!cudnn) cudnn = std::make_unique<CudnnAttention>();
    cudnn->backward(dims, args, stream);
#else
    (void)dims, (void)args, (void)stream;
    throw_built_without_cudnn(op);
#endif
  }

  std::size_t cudnn_bytes() const {
#ifdef POPE_HAVE_CUDNN
    if (cudnn) return cudnn->scratch_bytes();
#endif
    return 0;
  }

  // The plan's q/k transform for this call, its tables uploaded; with `position_at`, the kernels
  // read the call's first position from there (QkTransformParams::position_offset_at).
  QkTransformParams transform(const TransformPlan& plan, const PositionContext& ctx, const std::vector<float*>& params,
                              cudaStream_t stream, const int* position_at = nullptr) {
    QkTransformParams device;
    device.position_offset = ctx.position_offset;
    device.position_offset_at = position_at;
    switch (plan.kind) {
      case TransformKind::identity:
        return device;  // positions act through the mask and the bias only
      case TransformKind::rotary:
        device.kind = QkTransformKind::rope;
        device.rotary_pairs = static_cast<int>(plan.frequencies.size());
        device.frequencies = frequencies.upload(plan.frequencies, stream);
        if (!plan.scale_rates.empty()) {
          device.scale_rates = scale_rates.upload(plan.scale_rates, stream);
          device.scale_centre = plan.scale_centre;
        }
        // A decode call's few rows form their phases in the encode kernel (bitwise the table's
        // entries), which saves a table refill per layer and position; xPos's scales need it.
        if (position_at == nullptr || device.scale_rates != nullptr) tabulate_phases(device, ctx, stream);
        return device;
      case TransformKind::polar:
        device.kind = QkTransformKind::pope;
        device.frequencies = frequencies.upload(plan.frequencies, stream);
        device.magnitude = plan.magnitude;
        device.delta = plan.delta_param < 0 ? nullptr : params.at(std::size_t(plan.delta_param));
        device.clamp_delta = plan.clamp_delta;
        return device;
      case TransformKind::jet_rotary:
        // Absolute positions, transformed in f32 and stored bf16 (docs/design.md, "PJ-rotary on the GPU").
        device.kind = QkTransformKind::pj_rotary;
        device.jet_order = plan.jet_order;
        device.frequencies = frequencies.upload(plan.frequencies, stream);
        device.shear_rate = plan.shear_rate;
        return device;
    }
    throw std::logic_error("cuda attention: unhandled transform kind");
  }

  // RoPE's phase table for the call (kernels::fill_phase_table): T × pairs angles evaluated once
  // instead of once per (position, head) of q and k, and read by the fused gradient epilogue;
  // a scaled rotation's queries and keys have a table each.
  void tabulate_phases(QkTransformParams& device, const PositionContext& ctx, cudaStream_t stream) {
    auto* table = reserve_elements<float2>(phases, kernels::phase_table_entries(device, ctx.seq_len));
    POPE_CUDA_CHECK(kernels::fill_phase_table(device, ctx.seq_len, table, stream));
    device.phases = table;
    if (device.scale_rates != nullptr) device.key_phases = table + std::size_t(ctx.seq_len) * device.rotary_pairs;
  }

  // The learned bias of the plan with its lag tables on the device, or nullopt.
  std::optional<LearnedBias> learned_bias(const BiasPlan& plan, const PositionContext& ctx,
                                          const std::vector<float*>& params, const std::vector<float*>& grads,
                                          cudaStream_t stream) {
    if (!plan.learned()) return std::nullopt;
    const int* lags = nullptr;
    const int* starts = nullptr;
    std::vector<int> host_starts;
    if (plan.kind == BiasKind::lag_buckets) {
      host_starts = lag_bucket_starts(plan.buckets);
      lags = bucket_of_lag.upload(plan.buckets.bucket_of_lag, stream);
      starts = bucket_starts.upload(host_starts, stream);
    }
    return LearnedBias::of(plan, ctx.n_head, params, grads, lags, starts, host_starts);
  }

  // Where this call's learned-bias table comes from: built on `stream` into `kept` (the forward
  // keeping it for the backward) or, when nothing is kept, into scratch; or (`built`) read from
  // `kept` as the forward left it.
  struct LearnedTable {
    cudaStream_t stream;
    float* kept = nullptr;
    bool built = false;
  };

  // Score scale and, for encodings with a score bias, the [n_head, T] table b_h(Δ).
  kernels::ScoreParams score(const PositionEncoding& encoding, const BiasPlan& plan, const PositionContext& ctx,
                             const std::optional<LearnedBias>& learned, cudaStream_t stream, const LearnedTable& place) {
    kernels::ScoreParams params;
    params.scale = static_cast<float>(encoding.softmax_scale(ctx));
    if (plan.kind == BiasKind::none) return params;
    // A learned bias is tabulated on the device from its parameters (no host round trip, so the
    // step stays capturable); parameter-free biases are tabulated on the host.
    if (learned) {
      float* table = place.kept != nullptr
                         ? place.kept
                         : reserve_elements<float>(learned_table, std::size_t(ctx.n_head) * ctx.seq_len);
      if (!place.built) POPE_CUDA_CHECK(learned->build_table(ctx.seq_len, table, place.stream));
      params.bias = table;
      return params;
    }
    const std::size_t T = static_cast<std::size_t>(ctx.seq_len);
    std::vector<float> table(static_cast<std::size_t>(ctx.n_head) * T);
    for (int h = 0; h < ctx.n_head; ++h) encoding.score_bias(ctx, h, ParamValues<float>{}, table.data() + h * T);
    params.bias = bias.upload(table, stream);
    // A linear bias (ALiBi) also goes as slopes, which the fused kernels use instead of the table.
    if (plan.kind == BiasKind::linear) {
      const std::vector<float> slopes(plan.slopes.begin(), plan.slopes.end());
      params.bias_slopes = bias_slopes.upload(slopes, stream);
    }
    return params;
  }

  // q̃, k̃ of this call, computed into `kept` (see kept_halves) or, when it is empty, into scratch.
  kernels::EncodedAttention encode(const AttentionDims& dims, const QkTransformParams& transform,
                                   const kernels::ScoreParams& score, const Tensor& qkv, const Tensor& kept,
                                   cudaStream_t stream) {
    auto [q_out, k_out] = kept_halves(dims, kept);
    if (kept.empty()) {
      q_out = reserve_elements<__nv_bfloat16>(q, encoded_elements(dims));
      k_out = reserve_elements<__nv_bfloat16>(k, encoded_elements(dims));
    }
    const auto* source = static_cast<const __nv_bfloat16*>(qkv.data);
    POPE_CUDA_CHECK(kernels::encode_qk(dims, transform, source, q_out, k_out, stream));
    return inputs(score, qkv, q_out, k_out);
  }

  // q̃ and k̃ of a call kept by its caller: the two halves of `kept` (null when it is empty).
  static std::pair<__nv_bfloat16*, __nv_bfloat16*> kept_halves(const AttentionDims& dims, const Tensor& kept) {
    auto* q_half = static_cast<__nv_bfloat16*>(kept.data);
    return {q_half, q_half == nullptr ? nullptr : q_half + encoded_elements(dims)};
  }
  // A learned bias's table kept by the caller after q̃ and k̃ (null when `kept` is empty or the
  // encoding has none; 16-byte aligned: q̃ and k̃ are whole rows of 64-element multiples).
  static float* kept_table(const AttentionDims& dims, const Tensor& kept, bool learned_bias) {
    if (kept.empty() || !learned_bias) return nullptr;
    return reinterpret_cast<float*>(static_cast<__nv_bfloat16*>(kept.data) + 2 * encoded_elements(dims));
  }
  static kernels::EncodedAttention inputs(const kernels::ScoreParams& score, const Tensor& qkv,
                                          const __nv_bfloat16* q_encoded, const __nv_bfloat16* k_encoded) {
    kernels::EncodedAttention in;
    in.qkv = static_cast<const __nv_bfloat16*>(qkv.data);
    in.q = q_encoded;
    in.k = k_encoded;
    in.score = score;
    return in;
  }
};


AttentionRunner::AttentionRunner() : scratch_(std::make_unique<Scratch>()) {}

std::int64_t AttentionRunner::encoded_numel(const AttentionShape& shape, const PositionEncoding& encoding) {
  const bool learned = has_learned_bias(encoding, shape_context(shape));
  return 2 * std::int64_t(shape.batch) * shape.n_head * shape.seq_len * qk_width_of(encoding, shape.head_dim) +
         std::int64_t(kept_table_slots(learned, shape.n_head, shape.seq_len));
}
AttentionRunner::~AttentionRunner() = default;

std::size_t AttentionRunner::scratch_bytes() const {
  const Scratch& s = *scratch_;
  std::size_t total = s.frequencies.bytes() + s.scale_rates.bytes() + s.bias.bytes() + s.bias_slopes.bytes() +
                      s.bucket_of_lag.bytes() + s.bucket_starts.bytes() + s.cudnn_bytes();
  for (const DeviceScratch* block : {&s.q, &s.k, &s.dq, &s.dk, &s.row_dot, &s.decode_partials, &s.decode_counters, &s.bias_grad_partials,
                                     &s.delta_grad_partials, &s.learned_table, &s.learned_diag_grad,
                                     &s.learned_partials, &s.phases})
    total += block->bytes();
  return total;
}

void AttentionRunner::forward(const AttentionForward& args, cudaStream_t stream) {
  constexpr std::string_view op = "attention_forward";
  const AttentionDims dims = check_call(op, args.shape, args.encoding, args.position, args.qkv, args.out, args.lse);
  const PositionEncoding& encoding = *args.encoding;
  const std::vector<float*> params = parameter_pointers(op, "position_params", args.position_params, encoding, dims);
  const EncodingPlan plan = encoding.plan(args.position);
  const QkTransformParams transform = scratch_->transform(plan.transform, args.position, params, stream);
  const std::optional<LearnedBias> learned = scratch_->learned_bias(plan.bias, args.position, params, {}, stream);
  check_encoded(op, args.encoded, dims, learned.has_value());
  // A learned bias's table is built on the side stream while q̃, k̃ are encoded on `stream`.
  const Scratch::LearnedTable place{learned ? scratch_->side.fork(stream) : stream,
                                    Scratch::kept_table(dims, args.encoded, learned.has_value())};
  const kernels::ScoreParams score = scratch_->score(encoding, plan.bias, args.position, learned, stream, place);
  check_impl(op, args.impl, encoding, score);
  const kernels::EncodedAttention in = scratch_->encode(dims, transform, score, args.qkv, args.encoded, stream);
  if (learned) scratch_->side.join(stream);
  auto* out = static_cast<__nv_bfloat16*>(args.out.data);
  auto* lse = static_cast<float*>(args.lse.data);
  if (args.impl == AttentionImpl::cudnn) {
    scratch_->cudnn_forward(op, dims, {in.q, in.k, in.qkv, score.scale, out, lse}, stream);
  } else if (use_flash(dims, in)) {
    POPE_CUDA_CHECK(kernels::flash_attention_forward(dims, in, out, lse, stream));
  } else {
    POPE_CUDA_CHECK(kernels::causal_attention_forward(dims, in, out, lse, stream));
  }
}

void AttentionRunner::decode(const AttentionDecode& args, cudaStream_t stream) {
  constexpr std::string_view op = "attention_decode";
  checks::check_attention_call(op, args.shape, args.encoding, args.position);
  const PositionEncoding& encoding = *args.encoding;
  const bool reencode = encoding.transforms_qk() && encoding.transform_varies_with_length();
  AttentionDims dims;  // the new rows
  dims.batch = args.shape.batch;
  dims.seq_len = args.shape.seq_len;
  dims.n_head = args.shape.n_head;
  dims.head_dim = args.shape.head_dim;
  dims.qk_width = qk_width_of(encoding, dims.head_dim);
  const std::int64_t rows = std::int64_t(dims.batch) * dims.seq_len;
  const std::int64_t channels = std::int64_t(dims.n_head) * dims.head_dim;
  check_matrix(op, "qkv", args.qkv, DType::bf16, rows, 3 * channels);
  check_matrix(op, "out", args.out, DType::bf16, rows, channels);
  const Tensor& keys = args.cache.keys;
  const Tensor& values = args.cache.values;
  require(keys.dtype == DType::bf16 && values.dtype == DType::bf16 && keys.shape.size() == 4 &&
              values.shape.size() == 4 && keys.shape[0] == dims.batch && keys.shape[1] == dims.n_head &&
              keys.shape[3] == dims.qk_width && values.shape[0] == dims.batch && values.shape[1] == dims.n_head &&
              values.shape[2] == keys.shape[2] && values.shape[3] == dims.head_dim,
          op,
          fmt::format("the cache is keys {} {} and values {} {}; expected bf16 [{}, {}, capacity, {}] and [{}, {}, "
                      "capacity, {}]",
                      dtype_name(keys.dtype), shape_string(keys.shape), dtype_name(values.dtype),
                      shape_string(values.shape), dims.batch, dims.n_head, dims.qk_width, dims.batch, dims.n_head,
                      dims.head_dim));
  const int p0 = args.position.position_offset, capacity = int(keys.shape[2]);
  require(p0 + dims.seq_len <= capacity && capacity <= kernels::kMaxAttentionSeqLen, op,
          fmt::format("{} cached + {} new rows exceed the cache's capacity of {} (or the {} positions the GPU "
                      "kernels support)",
                      p0, dims.seq_len, capacity, kernels::kMaxAttentionSeqLen));
  const Tensor& raw_keys = args.cache.raw_keys;
  if (reencode) {
    require(raw_keys.dtype == DType::bf16 && raw_keys.shape == Shape{dims.batch, dims.n_head, capacity, dims.head_dim},
            op,
            fmt::format("encoding '{}' encodes its cached keys again at every length, from cache.raw_keys: {} {}, "
                        "expected bf16 [{}, {}, {}, {}]",
                        encoding.kind(), dtype_name(raw_keys.dtype), shape_string(raw_keys.shape), dims.batch,
                        dims.n_head, capacity, dims.head_dim));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    POPE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    require(capture == cudaStreamCaptureStatusNone, op,
            fmt::format("encoding '{}' changes its frequencies with the length, so its decode steps cannot be recorded "
                        "(a CUDA graph) and replayed; queue them eagerly (KvCache::set_record_steps(false))",
                        encoding.kind()));
  }
  check_vector(op, "past", args.past, DType::i32, 1);
  const auto* past = static_cast<const int*>(args.past.data);
  const kernels::DecodeDims decode_dims{dims.batch,    dims.n_head, dims.seq_len,
                                        dims.head_dim, dims.qk_width, capacity,
                                        kernels::decode_splits(dims.batch * dims.seq_len, dims.n_head, capacity),
                                        past};
  const std::vector<float*> params = parameter_pointers(op, "position_params", args.position_params, encoding, dims);

  // Everything but p0 is that of a call over the whole cache, so that the work queued here is
  // the same at every position (a recorded step replays it): the transform's plan (which also
  // checks that every position of the cache is in range), the scale and the bias table. A
  // transform that changes with the length takes the plan of this call's positions [0, p0 + n)
  // instead (queries and keys alike, as on the CPU): its steps are never recorded (Model::run_decode).
  const PositionContext whole{capacity, args.position.train_length, dims.n_head, dims.head_dim, 0};
  const PositionContext covered{p0 + dims.seq_len, args.position.train_length, dims.n_head, dims.head_dim, 0};
  const TransformPlan transform_plan = encoding.transform_plan(reencode ? covered : whole);
  const QkTransformParams transform = scratch_->transform(transform_plan, args.position, params, stream, past);
  auto* q_new = reserve_elements<__nv_bfloat16>(scratch_->q, encoded_elements(dims));
  auto* k_new = reserve_elements<__nv_bfloat16>(scratch_->k, encoded_elements(dims));
  const auto* qkv = static_cast<const __nv_bfloat16*>(args.qkv.data);
  if (reencode)
    encode_cached_keys_again(dims, capacity, p0, transform, qkv, static_cast<__nv_bfloat16*>(raw_keys.data),
                             static_cast<__nv_bfloat16*>(keys.data), stream);
  POPE_CUDA_CHECK(kernels::encode_qk(dims, transform, qkv, q_new, k_new, stream));
  const BiasPlan bias_plan = encoding.bias_plan(whole);
  const std::optional<LearnedBias> learned = scratch_->learned_bias(bias_plan, whole, params, {}, stream);
  const kernels::ScoreParams score =
      scratch_->score(encoding, bias_plan, whole, learned, stream, Scratch::LearnedTable{stream, nullptr, false});
  auto* partials =
      reserve_elements<float>(scratch_->decode_partials, kernels::decode_attention_partial_floats(decode_dims));
  // The counters' block holds only counters, zero between calls; a block grows only, so a new
  // size means a new block, cleared once.
  auto* counters = reserve_elements<int>(scratch_->decode_counters, kernels::decode_attention_counters(decode_dims));
  if (scratch_->decode_counters.bytes() != scratch_->decode_counters_zeroed) {
    POPE_CUDA_CHECK(cudaMemsetAsync(counters, 0, scratch_->decode_counters.bytes(), stream));
    scratch_->decode_counters_zeroed = scratch_->decode_counters.bytes();
  }
  POPE_CUDA_CHECK(kernels::decode_attention(decode_dims, score, q_new, k_new, qkv, static_cast<__nv_bfloat16*>(keys.data),
                                            static_cast<__nv_bfloat16*>(values.data), partials, counters,
                                            static_cast<__nv_bfloat16*>(args.out.data), stream));
}

void AttentionRunner::backward(const AttentionBackward& args, cudaStream_t stream, float* bias_table_grad) {
  constexpr std::string_view op = "attention_backward";
  const AttentionDims dims = check_call(op, args.shape, args.encoding, args.position, args.qkv, args.out, args.lse);
  const std::int64_t rows = std::int64_t(dims.batch) * dims.seq_len;
  const std::int64_t channels = std::int64_t(dims.n_head) * dims.head_dim;
  check_matrix(op, "dout", args.dout, DType::bf16, rows, channels);
  check_matrix(op, "dqkv", args.dqkv, DType::bf16, rows, 3 * channels);
  const PositionEncoding& encoding = *args.encoding;
  const std::vector<float*> params = parameter_pointers(op, "position_params", args.position_params, encoding, dims);
  const std::vector<float*> grads = parameter_pointers(op, "position_grads", args.position_grads, encoding, dims);
  const EncodingPlan plan = encoding.plan(args.position);
  const QkTransformParams transform = scratch_->transform(plan.transform, args.position, params, stream);
  const std::optional<LearnedBias> learned = scratch_->learned_bias(plan.bias, args.position, params, grads, stream);
  check_encoded(op, args.encoded, dims, learned.has_value());
  // A learned bias's table as the forward kept it, or built again.
  float* const kept_table = Scratch::kept_table(dims, args.encoded, learned.has_value());
  const kernels::ScoreParams score =
      scratch_->score(encoding, plan.bias, args.position, learned, stream, {stream, kept_table, kept_table != nullptr});
  check_impl(op, args.impl, encoding, score);
  // q̃, k̃ as the forward kept them, or derived again.
  const auto [q_kept, k_kept] = Scratch::kept_halves(dims, args.encoded);
  const kernels::EncodedAttention in = args.encoded.empty()
                                           ? scratch_->encode(dims, transform, score, args.qkv, Tensor{}, stream)
                                           : Scratch::inputs(score, args.qkv, q_kept, k_kept);

  const std::size_t encoded = std::size_t(dims.batch) * dims.n_head * dims.seq_len * dims.qk_width;
  kernels::AttentionGradients gradients;
  gradients.out = static_cast<const __nv_bfloat16*>(args.out.data);
  gradients.lse = static_cast<const float*>(args.lse.data);
  gradients.dout = static_cast<const __nv_bfloat16*>(args.dout.data);
  gradients.row_dot = reserve_elements<float>(scratch_->row_dot, std::size_t(dims.batch) * dims.n_head * dims.seq_len);
  gradients.dqkv = static_cast<__nv_bfloat16*>(args.dqkv.data);
  gradients.deterministic = args.deterministic;
  const bool flash = use_flash(dims, in, gradients.dout);
  // The fused kernels write dq, dk into dqkv themselves where they can (NoPE, ALiBi, the
  // bias-only PJ-RoPE methods, RoPE): no f32 dq̃, dk̃ round trip through memory.
  gradients.qk_backward_fused = args.impl == AttentionImpl::fused && flash &&
                                kernels::flash_attention_fuses_qk_backward(dims, in, transform, args.deterministic);
  gradients.qk_transform = transform;
  // Otherwise dq̃, dk̃ go through memory: in bf16 where the fused kernels allow (PoPE's 2d-wide
  // features), else f32.
  const bool rounded = args.impl == AttentionImpl::fused && flash && !gradients.qk_backward_fused &&
                       kernels::flash_attention_rounds_encoded_gradients(dims, args.deterministic);
  if (rounded) {
    gradients.dq_bf16 = reserve_elements<__nv_bfloat16>(scratch_->dq, encoded);
    gradients.dk_bf16 = reserve_elements<__nv_bfloat16>(scratch_->dk, encoded);
  } else if (!gradients.qk_backward_fused) {
    gradients.dq = reserve_elements<float>(scratch_->dq, encoded);
    gradients.dk = reserve_elements<float>(scratch_->dk, encoded);
  }
  // A learned bias takes its parameter gradients from the diagonal sums Ĝ of dS, zeroed here
  // because the kernels accumulate into them.
  if (learned) {
    require(bias_table_grad == nullptr, op,
            "a bias-table gradient was asked for, but the encoding's learned bias consumes it itself");
    const std::size_t lags = std::size_t(dims.n_head) * std::size_t(dims.seq_len);
    bias_table_grad = reserve_elements<float>(scratch_->learned_diag_grad, lags);
    POPE_CUDA_CHECK(cudaMemsetAsync(bias_table_grad, 0, lags * sizeof(float), stream));
    // Ĝ and the parameters' gradients from it on the side stream, beside the query kernel.
    gradients.bias_grad_stream = scratch_->side.stream();
    gradients.keys_done = scratch_->side.fork_event();
  }
  if (bias_table_grad != nullptr) {
    require(in.score.bias != nullptr, op,
            fmt::format("a bias-table gradient was asked for, but encoding '{}' has no score bias", encoding.kind()));
    require(flash, op,
            fmt::format("the bias-table gradient needs the fused kernels (q/k width 64 or 128, head_dim 64 or 128 ≤ "
                        "width); this call has width {}, head_dim {}",
                        dims.qk_width, dims.head_dim));
    gradients.bias_grad = bias_table_grad;
    gradients.bias_grad_lags = learned ? learned->gradient_lags() : 0;
    gradients.bias_grad_partials = reserve_elements<float>(
        scratch_->bias_grad_partials, kernels::flash_bias_grad_partial_floats(dims, gradients.bias_grad_lags));
  }
  if (args.impl == AttentionImpl::cudnn) {
    scratch_->cudnn_backward(op, dims,
                             {in.q, in.k, in.qkv, score.scale, gradients.out, gradients.lse, gradients.dout,
                              gradients.row_dot, gradients.dq, gradients.dk, gradients.dqkv},
                             stream);
  } else if (flash) {
    POPE_CUDA_CHECK(kernels::flash_attention_backward(dims, in, gradients, stream));
  } else {
    POPE_CUDA_CHECK(kernels::causal_attention_backward(dims, in, gradients, stream));
  }
  // PoPE with δ: the pass that sums δ's gradient reads the keys' x, dk̃ and phases anyway and
  // writes their dL/dk too, so encode_qk_backward transforms the queries only.
  const bool keys_with_delta = transform.kind == QkTransformKind::pope && transform.delta != nullptr;
  float* const delta_grad = keys_with_delta ? grads.at(std::size_t(plan.transform.delta_param)) : nullptr;
  auto transform_backward = [&](const auto* dq, const auto* dk) {
    POPE_CUDA_CHECK(
        kernels::encode_qk_backward(dims, transform, in.qkv, dq, keys_with_delta ? nullptr : dk, gradients.dqkv, stream));
    if (keys_with_delta) {
      float* partials =
          reserve_elements<float>(scratch_->delta_grad_partials, kernels::pope_delta_gradient_partial_floats(dims));
      POPE_CUDA_CHECK(
          kernels::pope_delta_gradient(dims, transform, in.qkv, dk, partials, delta_grad, gradients.dqkv, stream));
    }
  };
  if (rounded)
    transform_backward(gradients.dq_bf16, gradients.dk_bf16);
  else if (!gradients.qk_backward_fused)
    transform_backward(gradients.dq, gradients.dk);
  if (learned) {
    void* partials = scratch_->learned_partials.reserve(learned->backward_scratch_bytes(dims.seq_len));
    POPE_CUDA_CHECK(learned->backward(dims.seq_len, bias_table_grad, partials, gradients.bias_grad_stream));
    scratch_->side.join(stream);
  }
}

}  // namespace pope::cuda
