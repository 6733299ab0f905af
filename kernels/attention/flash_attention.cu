// Fused causal attention on tensor cores (see flash_attention.cuh): the host side. It picks each
// call's kernels and main loop, builds the tensor maps and launches.
//   forward:    flash_forward.cuh; CTA = (b·H + h, 128 query rows), streams 64-key tiles of k̃ and
//               v up to the diagonal; ALiBi's heads (a linear bias) visit the tiles from the
//               diagonal down.
//   key grad:   flash_key_grad.cuh; CTA = (b·H + h, 64 keys), streams 64-query tiles of q̃, dout,
//               lse and D from the diagonal to the end, sums dk̃ and dv (and the bias gradient's
//               lag sums, and in the non-deterministic mode dq̃ with atomic adds).
//   query grad: flash_query_grad.cuh; CTA = (b·H + h, 64 query rows), streams key tiles again and
//               sums dq̃ (deterministic mode).
// Each kernel is generic over its main loop, one per GPU generation (FlashAttention-3's layout):
// MainLoopSm80 (flash_mainloop_sm80.cuh: mma.sync from padded tiles, cp.async double buffering by
// all threads) and MainLoopSm90 (flash_mainloop_sm90.cuh: wgmma from swizzled tiles, TMA copies
// issued by thread 0, tma.cuh); MainLoopFor picks one per (W, d).
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

#include "attention/flash_attention.cuh"
#include "attention/flash_common.cuh"
#include "attention/flash_forward.cuh"
#include "attention/flash_key_grad.cuh"
#include "attention/flash_mainloop_sm80.cuh"
#include "attention/flash_mainloop_sm90.cuh"
#include "attention/flash_query_grad.cuh"
#include "attention/kernel_launch.cuh"
#include "attention/score_bias.cuh"
#include "attention/tma.cuh"
#include "block_reduce.cuh"
#include "fast_divisor.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

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
// q/k width kW on MainLoop: a kernel per policy at W = 64, the runtime table flag at W = 128.
template <int kW, class MainLoop, class Launch>
cudaError_t with_bias_kind(const ScoreParams& score, Launch&& launch) {
  using D = BiasDispatch;
  if constexpr (kW != 64) {
    return launch(BiasChoice<D::runtime>{});
  } else {
    if (score.bias == nullptr) return launch(BiasChoice<D::per_kernel, ScoreBias::none>{});
    if constexpr (kLinearBias<kW, MainLoop>)
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

// The main loop of the kernels for (W, d): wgmma and TMA where use_wgmma says so, else mma.sync
// and cp.async.
template <int kW, int kDv>
using MainLoopFor = std::conditional_t<use_wgmma(kW, kDv), MainLoopSm90, MainLoopSm80>;

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
    using MainLoop = MainLoopFor<kW, kDv>;
    AttentionMaps maps{};  // the wgmma kernels load with TMA
    if constexpr (MainLoop::tensor_maps) {
      const cudaError_t encoded = encode_attention_maps(maps, dims, in, nullptr);
      if (encoded != cudaSuccess) return encoded;
    }
    return with_bias_kind<kW, MainLoop>(in.score, [&](auto bias) {
      return launch_with_shared<flash_forward_kernel<kW, kDv, MainLoop, decltype(bias)>>(
          tile_grid(dims, kForwardRows), MainLoop::template Forward<kW, kDv>::threads,
          ForwardTiles<kW, kDv, MainLoop>::bytes, stream, dims, in, out, lse, maps);
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
    using MainLoop = MainLoopFor<kW, kDv>;
    AttentionMaps maps{};  // the wgmma kernels load with TMA
    if constexpr (MainLoop::tensor_maps) {
      const cudaError_t encoded = encode_attention_maps(maps, dims, in, &grads);
      if (encoded != cudaSuccess) return encoded;
    }
    if (!grads.deterministic) {  // dq̃ summed by atomic adds in the key kernel
      const std::size_t dq_bytes = std::size_t(dims.batch) * dims.n_head * dims.seq_len * kW * sizeof(float);
      const cudaError_t zeroed = cudaMemsetAsync(grads.dq, 0, dq_bytes, stream);
      if (zeroed != cudaSuccess) return zeroed;
      const cudaError_t keys = launch_with_shared<flash_key_grad_kernel<kW, kDv, true, MainLoop>>(
          tile_grid(dims), kThreads, KeyGradTiles<kW, kDv, true, MainLoop>::bytes(bias_grad), stream, dims, in,
          grads, maps);
      return keys == cudaSuccess ? after_keys() : keys;
    }
    cudaError_t keys = launch_with_shared<flash_key_grad_kernel<kW, kDv, false, MainLoop>>(
        tile_grid(dims), kThreads, KeyGradTiles<kW, kDv, false, MainLoop>::bytes(bias_grad), stream, dims, in, grads,
        maps);
    if (keys == cudaSuccess) keys = after_keys();
    if (keys != cudaSuccess) return keys;
    return with_bias_kind<kW, MainLoop>(in.score, [&](auto bias) {
      return launch_with_shared<flash_query_grad_kernel<kW, kDv, MainLoop, decltype(bias)>>(
          tile_grid(dims), kThreads, QueryGradTiles<kW, kDv, MainLoop>::bytes, stream, dims, in, grads, maps);
    });
  });
  if (status != cudaSuccess || !bias_grad || reduce_beside) return status;
  return reduce_bias_grad(stream);
}

}  // namespace pope::kernels
