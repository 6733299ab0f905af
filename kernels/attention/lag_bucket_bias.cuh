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

// The lags of Ĝ lag_bucket_bias_backward reads: those below the first lag of the bucket that
// holds lag T − 1 (at least 1). Each row of dS sums to zero (dS_ts = P_ts (dP_ts − D_t), D_t =
// Σ_s P_ts dP_ts), so the last bucket's gradient is minus the sum of Ĝ below it, and the fused
// attention need not sum the long tail of lags at all (AttentionGradients::bias_grad_lags).
int lag_bucket_gradient_lags(const int* host_bucket_starts, int buckets, int last_bucket);

// ACCUMULATES weight_grad[h·buckets + b] += Σ over bucket b's lags of diag_grad[h·T + Δ], and
// for the bucket holding lag T − 1 (`last_bucket`) −Σ over the lags below it; one block per
// (h, b) adding its lags in a fixed order, so the result is bitwise reproducible. Reads
// diag_grad for lags below lag_bucket_gradient_lags only.
cudaError_t lag_bucket_bias_backward(const LagBucketParams& params, int seq_len, int last_bucket,
                                     const float* diag_grad, float* weight_grad, cudaStream_t stream);

}  // namespace pope::kernels
