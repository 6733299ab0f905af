// The score bias of the fused attention kernels as small policy types. A policy says what a tile
// adds to its scores (ScoreBias); a dispatch trait says how one kernel covers the policies its
// calls may have (BiasDispatch). with_bias hands the per-score code the policy of a head as
// compile-time constants wherever the dispatch allows, so the unrolled loops stay straight-line.
// Used by kernels/attention/flash_attention.cu; its tests are FlashKernels.* in
// tests/gpu/test_cuda_attention.cpp (a random table, linear slopes, none).
#pragma once

#include <cuda_runtime.h>

#include "attention/attention_head.cuh"
#include "attention/attention_params.cuh"

namespace pope::kernels {

// What a tile adds to its scores: nothing, the staged slot of the bias table, or slope · Δ
// computed from the lag (ALiBi without a table: ScoreParams::bias_slopes).
enum class ScoreBias { none, table, linear };

// How a kernel covers the policies of its calls:
//   per_kernel  an instantiation per policy, picked per call: straight-line code and registers of
//               its own each (the W = 64 forward and query kernels);
//   copies      one kernel holding a copy of its per-score loop per policy, picked per head: the
//               key kernel, whose three instantiations cost more in code and occupancy than the
//               branch between copies (W = 64);
//   runtime     one kernel, the table a runtime flag and no linear policy: at W = 128 a second
//               copy's registers cost CTAs per SM.
enum class BiasDispatch { per_kernel, copies, runtime };

template <BiasDispatch kDispatch, ScoreBias kPolicy = ScoreBias::none>
struct BiasChoice {
  static_assert(kDispatch == BiasDispatch::per_kernel || kPolicy == ScoreBias::none,
                "only a per-kernel dispatch fixes the policy");
  static constexpr BiasDispatch dispatch = kDispatch;
  static constexpr ScoreBias policy = kPolicy;
};

// Whether kernels of q/k width kW on main loop MainLoop (flash_mainloop_sm80.cuh, _sm90.cuh)
// have the linear policy: the wgmma ones at W = 64 (MainLoop::linear_bias; in the mma.sync key
// kernel a linear copy more than doubled the register spills).
template <int kW, class MainLoop>
constexpr bool kLinearBias = kW == 64 && MainLoop::linear_bias;

// Which policy a kernel of choice Bias applies for `head`; kLinearCopy: whether a copies kernel
// has the linear copy (kLinearBias).
template <class Bias, bool kLinearCopy>
struct HeadBias {
  bool linear, table;
  __device__ explicit HeadBias(const AttentionHead& head)
      : linear(((Bias::dispatch == BiasDispatch::per_kernel && Bias::policy == ScoreBias::linear) ||
                (Bias::dispatch == BiasDispatch::copies && kLinearCopy)) &&
               head.linear_bias),
        table(!(Bias::dispatch == BiasDispatch::per_kernel && Bias::policy == ScoreBias::none) &&
              head.bias != nullptr && !linear) {}
};

// body(bias) with bias.table and bias.linear as `head` has them: compile-time constants, but for
// the runtime dispatch, whose bias.table is the head's flag (and bias.linear false).
template <bool kTable, bool kLinear>
struct CompileTimeBias {
  static constexpr bool table = kTable, linear = kLinear;
};
struct RuntimeBias {
  bool table;
  static constexpr bool linear = false;
};
template <class Bias, bool kLinearCopy, class Body>
__device__ __forceinline__ void with_bias(const HeadBias<Bias, kLinearCopy>& head, Body&& body) {
  if constexpr (Bias::dispatch == BiasDispatch::runtime) {
    body(RuntimeBias{head.table});
  } else if constexpr (Bias::dispatch == BiasDispatch::copies) {
    if (kLinearCopy && head.linear)
      body(CompileTimeBias<false, kLinearCopy>{});
    else if (head.table)
      body(CompileTimeBias<true, false>{});
    else
      body(CompileTimeBias<false, false>{});
  } else {
    body(CompileTimeBias<Bias::policy == ScoreBias::table, Bias::policy == ScoreBias::linear>{});
  }
}

// Whether a kernel's score accumulators start from the tile's bias slots (start_from_bias): the
// wgmma kernels (MainLoop::starts_from_bias) built for the table policy (the forward and the
// query kernel).
template <class MainLoop, class Bias>
constexpr bool kTableInAccumulators =
    MainLoop::starts_from_bias && Bias::dispatch == BiasDispatch::per_kernel && Bias::policy == ScoreBias::table;

}  // namespace pope::kernels
