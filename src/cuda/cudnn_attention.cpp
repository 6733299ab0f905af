// The two SDPA graphs, written as cudnn-frontend lowers its flash-attention nodes for a causal
// mask, a scale, no bias, no dropout (cuDNN's fused engine recognises these patterns; the
// operations and their order follow cudnn-frontend's SDPA forward and backward nodes):
//
// forward:  S = q̃·k̃ᵀ; S·scale; causal mask (row ≥ column, else the lowest float);
//           softmax with Stats = max + log Σexp; O = P·v.
// backward: D = rowsum(dO ∘ O) (written to row_dot); P = exp(S·scale − Stats) under the mask;
//           dv = Pᵀ·dO; dS = P ∘ (dO·vᵀ − D)·scale; dk̃ = dSᵀ·q̃; dq̃ = dS·k̃ (cuDNN accumulates
//           it in an f32 tensor of its graph, zeroed scratch here: binding our dq̃ buffer to it
//           gave wrong values on cuDNN 9.14, GPU-tested; dq̃ is its bf16 output, widened).
// k̃ (and v in the backward) enter transposed, as [B, H, W, T] views of the same memory.
#include "cuda/cudnn_attention.hpp"

#include <cudnn_graph.h>
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "convert.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/cudnn_graph.hpp"

namespace pope::cuda {

namespace {

using cudnn::GraphBuilder;
using cudnn::TensorRef;
using Dims = std::vector<std::int64_t>;

// Unique ids of the tensors bound at execution.
namespace uid {
enum : std::int64_t { q = 1, k, v, out, stats, scale, mask_fill, one, dout, row_dot, dq_accumulator, dq, dk, dv };
}

// What the causal mask puts above the diagonal, as cudnn-frontend does (not −inf: exp of it
// minus a finite max stays 0 without NaNs).
constexpr float kMaskFill = std::numeric_limits<float>::lowest();
constexpr float kOne = 1.0f;

// The sizes and strides of one call, in elements.
struct Layout {
  std::int64_t B, H, T, W, d, C;
  explicit Layout(const kernels::AttentionDims& dims)
      : B(dims.batch), H(dims.n_head), T(dims.seq_len), W(dims.qk_width), d(dims.head_dim), C(H * d) {}

  // q̃, k̃ and their gradients: [B, H, T, W] contiguous.
  Dims encoded_dims() const { return {B, H, T, W}; }
  Dims encoded_strides() const { return {H * T * W, T * W, W, 1}; }
  // k̃ᵀ: [B, H, W, T], the same memory.
  Dims encoded_transposed_dims() const { return {B, H, W, T}; }
  Dims encoded_transposed_strides() const { return {H * T * W, T * W, 1, W}; }
  // v and dv inside qkv / dqkv (row stride 3C), out and dout (row stride C): [B, H, T, d].
  Dims head_dims() const { return {B, H, T, d}; }
  Dims qkv_strides() const { return {T * 3 * C, d, 3 * C, 1}; }
  Dims qkv_transposed_dims() const { return {B, H, d, T}; }
  Dims qkv_transposed_strides() const { return {T * 3 * C, d, 1, 3 * C}; }
  Dims out_strides() const { return {T * C, d, C, 1}; }
  // Scores [B, H, T, T] and their transposed view; row statistics [B, H, T, 1].
  Dims score_dims() const { return {B, H, T, T}; }
  Dims score_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims score_transposed_strides() const { return {H * T * T, T * T, 1, T}; }
  Dims row_dims() const { return {B, H, T, 1}; }
  Dims row_strides() const { return {H * T, T, 1, 1}; }
};

std::string shape_name(const Layout& l) {
  return fmt::format("B {}, H {}, T {}, q/k width {}, head dim {}", l.B, l.H, l.T, l.W, l.d);
}

// scores·scale with everything above the diagonal replaced by kMaskFill.
TensorRef causal_mask(GraphBuilder& g, const TensorRef& scores, const TensorRef& fill) {
  const TensorRef row = g.virtual_like("row_index", scores, CUDNN_DATA_INT32);
  const TensorRef column = g.virtual_like("column_index", scores, CUDNN_DATA_INT32);
  g.index("row_index", scores, 2, row);
  g.index("column_index", scores, 3, column);
  const TensorRef keep = g.virtual_like("row_at_least_column", scores, CUDNN_DATA_BOOLEAN);
  g.pointwise("row_at_least_column", CUDNN_POINTWISE_CMP_GE, row, keep, &column, nullptr, CUDNN_DATA_BOOLEAN);
  const TensorRef masked = g.virtual_like("masked_scores", scores);
  g.pointwise("causal_mask", CUDNN_POINTWISE_BINARY_SELECT, scores, masked, &fill, &keep);
  return masked;
}

cudnn::ExecutionPlan build_forward(cudnnHandle_t handle, const Layout& l) {
  GraphBuilder g("cuDNN SDPA forward (" + shape_name(l) + ")");
  const TensorRef q = g.bound("q", uid::q, l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef kt =
      g.bound("k_transposed", uid::k, l.encoded_transposed_dims(), l.encoded_transposed_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef v = g.bound("v", uid::v, l.head_dims(), l.qkv_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef o = g.bound("out", uid::out, l.head_dims(), l.out_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef stats = g.bound("stats", uid::stats, l.row_dims(), l.row_strides(), CUDNN_DATA_FLOAT);
  const TensorRef scale = g.by_value("scale", uid::scale, CUDNN_DATA_FLOAT);
  const TensorRef fill = g.by_value("mask_fill", uid::mask_fill, CUDNN_DATA_FLOAT);

  const TensorRef scores = g.virtual_tensor("scores", l.score_dims(), l.score_strides());
  g.matmul("q_kt", q, kt, scores);
  const TensorRef scaled = g.virtual_like("scaled_scores", scores);
  g.pointwise("scale", CUDNN_POINTWISE_MUL, scores, scaled, &scale);
  const TensorRef masked = causal_mask(g, scaled, fill);

  const TensorRef max = g.virtual_tensor("row_max", l.row_dims(), l.row_strides());
  g.reduction("row_max", CUDNN_REDUCE_TENSOR_MAX, masked, max);
  const TensorRef shifted = g.virtual_like("shifted_scores", scores);
  g.pointwise("subtract_max", CUDNN_POINTWISE_SUB, masked, shifted, &max);
  const TensorRef exponentials = g.virtual_like("exponentials", scores);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, exponentials);
  const TensorRef sum = g.virtual_tensor("row_sum", l.row_dims(), l.row_strides());
  g.reduction("row_sum", CUDNN_REDUCE_TENSOR_ADD, exponentials, sum);
  const TensorRef log_sum = g.virtual_tensor("log_row_sum", l.row_dims(), l.row_strides());
  g.pointwise("log", CUDNN_POINTWISE_LOG, sum, log_sum);
  g.pointwise("stats", CUDNN_POINTWISE_ADD, max, stats, &log_sum);
  // P enters the second product in the inputs' type, as cuDNN's fused engine requires.
  const TensorRef probabilities = g.virtual_like("probabilities", scores, CUDNN_DATA_BFLOAT16);
  g.pointwise("normalize", CUDNN_POINTWISE_DIV, exponentials, probabilities, &sum);
  g.matmul("p_v", probabilities, v, o);
  return g.build(handle);
}

cudnn::ExecutionPlan build_backward(cudnnHandle_t handle, const Layout& l) {
  GraphBuilder g("cuDNN SDPA backward (" + shape_name(l) + ")");
  const TensorRef q = g.bound("q", uid::q, l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef kt =
      g.bound("k_transposed", uid::k, l.encoded_transposed_dims(), l.encoded_transposed_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef vt =
      g.bound("v_transposed", uid::v, l.qkv_transposed_dims(), l.qkv_transposed_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef o = g.bound("out", uid::out, l.head_dims(), l.out_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef dout = g.bound("dout", uid::dout, l.head_dims(), l.out_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef stats = g.bound("stats", uid::stats, l.row_dims(), l.row_strides(), CUDNN_DATA_FLOAT);
  const TensorRef row_dot = g.bound("row_dot", uid::row_dot, l.row_dims(), l.row_strides(), CUDNN_DATA_FLOAT);
  const TensorRef dq_accumulator =
      g.bound("dq_accumulator", uid::dq_accumulator, l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_FLOAT);
  const TensorRef dq = g.bound("dq", uid::dq, l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef dk = g.bound("dk", uid::dk, l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef dv = g.bound("dv", uid::dv, l.head_dims(), l.qkv_strides(), CUDNN_DATA_BFLOAT16);
  const TensorRef scale = g.by_value("scale", uid::scale, CUDNN_DATA_FLOAT);
  const TensorRef fill = g.by_value("mask_fill", uid::mask_fill, CUDNN_DATA_FLOAT);
  const TensorRef one = g.by_value("one", uid::one, CUDNN_DATA_FLOAT);

  // D = rowsum(dO ∘ O), times the (absent) dropout's keep rate 1.
  const TensorRef products = g.virtual_tensor("dout_out", l.head_dims(), {l.H * l.T * l.d, l.T * l.d, l.d, 1});
  g.pointwise("dout_times_out", CUDNN_POINTWISE_MUL, dout, products, &o);
  const TensorRef sums = g.virtual_tensor("dout_out_row_sum", l.row_dims(), l.row_strides());
  g.reduction("dout_out_row_sum", CUDNN_REDUCE_TENSOR_ADD, products, sums);
  g.pointwise("row_dot", CUDNN_POINTWISE_MUL, sums, row_dot, &one);

  // P from the forward's statistics.
  const TensorRef scores = g.virtual_tensor("scores", l.score_dims(), l.score_strides());
  g.matmul("q_kt", q, kt, scores);
  const TensorRef scaled = g.virtual_like("scaled_scores", scores);
  g.pointwise("scale", CUDNN_POINTWISE_MUL, scores, scaled, &scale);
  const TensorRef shifted = g.virtual_like("shifted_scores", scores);
  g.pointwise("subtract_stats", CUDNN_POINTWISE_SUB, scaled, shifted, &stats);
  const TensorRef masked = causal_mask(g, shifted, fill);
  const TensorRef probabilities = g.virtual_like("probabilities", scores);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, masked, probabilities);

  // dv = Pᵀ·dO.
  const TensorRef probabilities_t = g.virtual_tensor("probabilities_transposed", l.score_dims(),
                                                     l.score_transposed_strides(), CUDNN_DATA_BFLOAT16);
  g.reshape("transpose_probabilities", probabilities, probabilities_t);
  g.matmul("pt_dout", probabilities_t, dout, dv);

  // dS = P ∘ (dO·vᵀ − D) · scale.
  const TensorRef dp = g.virtual_tensor("dp", l.score_dims(), l.score_strides());
  g.matmul("dout_vt", dout, vt, dp);
  const TensorRef dp_kept = g.virtual_like("dp_kept", scores);
  g.pointwise("dropout_keep", CUDNN_POINTWISE_MUL, dp, dp_kept, &one);
  const TensorRef dp_centred = g.virtual_like("dp_centred", scores);
  g.pointwise("subtract_row_dot", CUDNN_POINTWISE_SUB, dp_kept, dp_centred, &row_dot);
  const TensorRef ds_unscaled = g.virtual_like("ds_unscaled", scores);
  g.pointwise("times_probabilities", CUDNN_POINTWISE_MUL, dp_centred, ds_unscaled, &probabilities);
  const TensorRef ds = g.virtual_like("ds", scores);
  g.pointwise("ds_scale", CUDNN_POINTWISE_MUL, ds_unscaled, ds, &scale);

  // dk̃ = dSᵀ·q̃.
  const TensorRef ds_t =
      g.virtual_tensor("ds_transposed", l.score_dims(), l.score_transposed_strides(), CUDNN_DATA_BFLOAT16);
  g.reshape("transpose_ds", ds, ds_t);
  g.matmul("dst_q", ds_t, q, dk);

  // dq̃ = dS·k̃, accumulated in f32, then its bf16 copy.
  const TensorRef k = g.virtual_tensor("k", l.encoded_dims(), l.encoded_strides(), CUDNN_DATA_BFLOAT16);
  g.reshape("transpose_kt", kt, k);
  g.matmul("ds_k", ds, k, dq_accumulator);
  g.pointwise("dq", CUDNN_POINTWISE_IDENTITY, dq_accumulator, dq);
  return g.build(handle);
}

void check_supported(const Layout& l, std::initializer_list<const void*> pointers) {
  if (l.d % 8 != 0 || l.W % 8 != 0 || l.W > 256 || l.d > 256)
    throw std::runtime_error(fmt::format(
        "attention.impl cudnn: cuDNN's SDPA needs head dims that are multiples of 8 and at most 256; this call has "
        "head dim {} and q/k width {}. Use attention.impl fused",
        l.d, l.W));
  for (const void* pointer : pointers)
    if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0)
      throw std::runtime_error("attention.impl cudnn: a tensor is not 16-byte aligned (cuDNN's SDPA needs it)");
}

void* writable(const void* pointer) { return const_cast<void*>(pointer); }

}  // namespace

struct CudnnAttention::Handle {
  cudnnHandle_t handle = nullptr;
  Handle() { cudnn::check(cudnnCreate(&handle), "cudnnCreate"); }
  ~Handle() { cudnnDestroy(handle); }
};

struct CudnnAttention::Plans {
  std::unique_ptr<cudnn::ExecutionPlan> forward, backward;
};

CudnnAttention::CudnnAttention() : handle_(std::make_unique<Handle>()) {}
CudnnAttention::~CudnnAttention() = default;

CudnnAttention::Plans& CudnnAttention::plans_for(const kernels::AttentionDims& dims) {
  std::unique_ptr<Plans>& plans =
      plans_[{dims.batch, dims.n_head, dims.seq_len, dims.qk_width, dims.head_dim}];
  if (!plans) plans = std::make_unique<Plans>();
  return *plans;
}

std::size_t CudnnAttention::scratch_bytes() const {
  return workspace_.bytes() + dq_accumulator_.bytes() + dq_bf16_.bytes() + dk_bf16_.bytes();
}

void CudnnAttention::forward(const kernels::AttentionDims& dims, const CudnnAttentionForward& args,
                             cudaStream_t stream) {
  const Layout l(dims);
  const __nv_bfloat16* v = args.qkv + 2 * l.C;
  check_supported(l, {args.q, args.k, v, args.out, args.lse});
  Plans& plans = plans_for(dims);
  if (!plans.forward) plans.forward = std::make_unique<cudnn::ExecutionPlan>(build_forward(handle_->handle, l));
  void* workspace = workspace_.reserve(std::size_t(plans.forward->workspace_bytes()));
  float scale = args.scale;
  cudnn::check(cudnnSetStream(handle_->handle, stream), "cudnnSetStream");
  plans.forward->execute(handle_->handle,
                         {{uid::q, writable(args.q)},
                          {uid::k, writable(args.k)},
                          {uid::v, writable(v)},
                          {uid::out, args.out},
                          {uid::stats, args.lse},
                          {uid::scale, &scale},
                          {uid::mask_fill, writable(&kMaskFill)}},
                         workspace);
}

void CudnnAttention::backward(const kernels::AttentionDims& dims, const CudnnAttentionBackward& args,
                              cudaStream_t stream) {
  const Layout l(dims);
  const __nv_bfloat16* v = args.qkv + 2 * l.C;
  __nv_bfloat16* dv = args.dqkv + 2 * l.C;
  check_supported(l, {args.q, args.k, v, args.out, args.lse, args.dout, args.row_dot, args.dq, args.dk, dv});
  Plans& plans = plans_for(dims);
  if (!plans.backward) plans.backward = std::make_unique<cudnn::ExecutionPlan>(build_backward(handle_->handle, l));
  void* workspace = workspace_.reserve(std::size_t(plans.backward->workspace_bytes()));
  const std::size_t encoded = std::size_t(l.B * l.H * l.T * l.W);
  void* dq_bf16 = dq_bf16_.reserve(encoded * sizeof(__nv_bfloat16));
  void* dk_bf16 = dk_bf16_.reserve(encoded * sizeof(__nv_bfloat16));
  void* dq_accumulator = dq_accumulator_.reserve(encoded * sizeof(float));
  POPE_CUDA_CHECK(cudaMemsetAsync(dq_accumulator, 0, encoded * sizeof(float), stream));
  float scale = args.scale;
  cudnn::check(cudnnSetStream(handle_->handle, stream), "cudnnSetStream");
  plans.backward->execute(handle_->handle,
                          {{uid::q, writable(args.q)},
                           {uid::k, writable(args.k)},
                           {uid::v, writable(v)},
                           {uid::out, writable(args.out)},
                           {uid::stats, writable(args.lse)},
                           {uid::dout, writable(args.dout)},
                           {uid::row_dot, args.row_dot},
                           {uid::dq_accumulator, dq_accumulator},
                           {uid::dq, dq_bf16},
                           {uid::dk, dk_bf16},
                           {uid::dv, dv},
                           {uid::scale, &scale},
                           {uid::mask_fill, writable(&kMaskFill)},
                           {uid::one, writable(&kOne)}},
                          workspace);
  POPE_CUDA_CHECK(kernels::convert(args.dq, kernels::FloatKind::f32, dq_bf16, kernels::FloatKind::bf16, encoded,
                                   stream));
  POPE_CUDA_CHECK(kernels::convert(args.dk, kernels::FloatKind::f32, dk_bf16, kernels::FloatKind::bf16, encoded,
                                   stream));
}

}  // namespace pope::cuda
