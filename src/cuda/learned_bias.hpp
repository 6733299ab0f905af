// A score bias whose table the device builds from the layer's parameters (BiasPlan::learned():
// the PJ-bias, lag buckets), and the gradient of those parameters from the fused attention's
// diagonal sums Ĝ. It fills the kernels' plain parameter blocks from the plan and the layer's
// device pointers, so AttentionRunner handles every learned bias the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "attention/lag_bucket_bias.cuh"
#include "attention/pj_bias.cuh"
#include "pope/position_plan.hpp"

namespace pope::cuda {

class LearnedBias {
 public:
  // nullopt unless plan.learned(). `params` (and `grads`, if not empty) are the layer's device
  // f32 pointers in layer_parameters() order; for lag buckets `bucket_of_lag` and
  // `bucket_starts` are device copies of the plan's lag table and of `host_bucket_starts`
  // (lag_bucket_starts of the plan). Throws std::invalid_argument when the plan's parameter
  // indices do not fit the pointers.
  static std::optional<LearnedBias> of(const BiasPlan& plan, int n_head, std::span<float* const> params,
                                       std::span<float* const> grads = {}, const int* bucket_of_lag = nullptr,
                                       const int* bucket_starts = nullptr,
                                       const std::vector<int>& host_bucket_starts = {});

  // table[h·T + Δ] = b_h(Δ), f32 [n_head, seq_len].
  cudaError_t build_table(int seq_len, float* table, cudaStream_t stream) const;
  // Lags of Ĝ backward() reads (AttentionGradients::bias_grad_lags), 0 for all of them.
  int gradient_lags() const { return gradient_lags_; }
  // Bytes of scratch backward() needs.
  std::size_t backward_scratch_bytes(int seq_len) const;
  // ACCUMULATES the parameters' gradients from Ĝ (f32 [n_head, seq_len]).
  cudaError_t backward(int seq_len, const float* diag_grad, void* scratch, cudaStream_t stream) const;

  // The PJ-bias's parameter blocks (a PJ-bias plan only).
  const kernels::PjBiasParams& pj_params() const { return pj_; }
  const kernels::PjBiasGradients& pj_gradients() const { return pj_grads_; }

 private:
  BiasKind kind_ = BiasKind::none;
  kernels::PjBiasParams pj_;
  kernels::PjBiasGradients pj_grads_;
  kernels::LagBucketParams buckets_;
  float* bucket_grad_ = nullptr;
  int last_bucket_ = 0;    // the bucket of the call's longest lag
  int gradient_lags_ = 0;
};

// [buckets + 1] run starts of the plan's lag table: bucket b holds lags [s[b], s[b+1]).
std::vector<int> lag_bucket_starts(const LagBucketPlan& plan);

}  // namespace pope::cuda
