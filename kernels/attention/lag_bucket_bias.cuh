// A learned score bias that is constant over runs of lags (T5's relative-position buckets):
// b_h(Δ) = w[h, bucket(Δ)], with the bucket of each lag tabulated by the encoding on the host
// (pope/position_plan.hpp, LagBucketPlan). Builds the [n_head, T] table the fused attention
// adds to its scores, and turns that kernel's diagonal sums Ĝ_h(Δ) into the gradient of w:
// dL/dw[h, b] = Σ_{Δ: bucket(Δ) = b} Ĝ_h(Δ). Plain data only: host files and kernels include it.
// Tested by tests/gpu/test_cuda_attention.cpp (every registered encoding against the CPU).
#pragma once

#include <cuda_runtime.h>

namespace pope::kernels {

struct LagBucketParams {
  int n_head = 0;
  int buckets = 0;
  const int* bucket_of_lag = nullptr;  // device [seq_len], non-decreasing, each < buckets
  const int* bucket_starts = nullptr;  // device [buckets + 1]: bucket b holds lags [starts[b], starts[b+1]), clipped to seq_len
  const float* weights = nullptr;      // device f32 [n_head, buckets]
};

// table[h·T + Δ] = weights[h·buckets + bucket_of_lag[Δ]].
cudaError_t lag_bucket_bias_table(const LagBucketParams& params, int seq_len, float* table, cudaStream_t stream);

// ACCUMULATES weight_grad[h·buckets + b] += Σ over bucket b's lags of diag_grad[h·T + Δ]; one
// block per (h, b) adding its lags in a fixed order, so the result is bitwise reproducible.
cudaError_t lag_bucket_bias_backward(const LagBucketParams& params, int seq_len, const float* diag_grad,
                                     float* weight_grad, cudaStream_t stream);

}  // namespace pope::kernels
